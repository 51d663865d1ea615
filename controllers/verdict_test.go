package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/migrator/quota"
	"github.com/restow/restow/internal/storedversions"
)

// The end of every run is judged by one function.
func TestJudge(t *testing.T) {
	target := migrator.Target{CRD: &migrator.CRDState{Name: "widgets.example.com", StorageVersion: "v1", ServedVersions: []string{"v1beta1", "v1"}}}
	done := func(c migrator.Counts, pruned ...string) runState {
		return runState{done: true, result: migrator.Result{Counts: c, Pruned: pruned, Settled: len(pruned) > 0, StartTime: time.Unix(0, 0)}}
	}
	failed := func(err error) runState { return runState{done: true, err: err} }
	tests := []struct {
		name       string
		state      runState
		condition  condition
		reason     string
		next       next
		result     string
		checkpoint bool
		summary    bool
	}{
		{"cancelled for a new spec", failed(context.Canceled), conditionReconciling, migrationv1alpha1.ProgressingReason, nextRestart, "restarted", true, false},
		{"the CRD changed", failed(fmt.Errorf("CRD x: %w", storedversions.ErrCRDChanged)), conditionReconciling, migrationv1alpha1.ProgressingReason, nextRestart, "restarted", false, false},
		{"stalled", failed(&migrator.StalledError{Message: "gone"}), conditionStalled, migrationv1alpha1.UnsupportedReason, nextStalled, "stalled", false, false},
		{"stopped for etcd's space", failed(&migrator.StalledError{Reason: quota.ReasonAlarm, Message: "NOSPACE"}), conditionStalled, migrationv1alpha1.EtcdAlarmReason, nextSpace, "stalled", true, false},
		{"transient", failed(&migrator.TransientError{Err: apierrors.NewServiceUnavailable("restarting")}), conditionReconciling, migrationv1alpha1.TransientErrorReason, nextResume, "transient", true, false},
		{"objects failed", done(migrator.Counts{Listed: 10, Migrated: 9, Failed: 1}), conditionStalled, migrationv1alpha1.ObjectsFailedReason, nextStalled, "stalled", false, true},
		{"succeeded", done(migrator.Counts{Listed: 10, Migrated: 10}, "v1beta1"), conditionReady, migrationv1alpha1.SucceededReason, nextNone, "succeeded", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := judge(target, tt.state, time.Unix(60, 0))
			if v.condition != tt.condition || v.reason != tt.reason || v.next != tt.next || v.result != tt.result || v.checkpoint != tt.checkpoint || (v.summary != nil) != tt.summary {
				t.Errorf("judge = %+v, want condition %v reason %s next %v result %s checkpoint %v summary %v", v, tt.condition, tt.reason, tt.next, tt.result, tt.checkpoint, tt.summary)
			}
		})
	}
	v := judge(target, done(migrator.Counts{Listed: 10, Migrated: 8, Skipped: 2, Rechecked: 1}, "v1beta1"), time.Unix(60, 0))
	if s := v.summary; s.TargetVersion != "v1" || s.Listed != 10 || s.Rechecked != 1 || len(s.PrunedVersions) != 1 || s.CompletionTime.Sub(s.StartTime.Time) != time.Minute {
		t.Errorf("summary = %+v", s)
	}
	if !errors.Is(tests[1].state.err, storedversions.ErrCRDChanged) {
		t.Fatal("the table's CRD change is not ErrCRDChanged")
	}
}

// TestReadyMessage: "stored at" only for a run that settled; a run that did
// not (one namespace, nothing left to prune, a built-in resource) says
// "rewritten".
func TestReadyMessage(t *testing.T) {
	crd := migrator.Target{CRD: &migrator.CRDState{Name: "widgets.example.com", StorageVersion: "v1"}}
	partial := migrator.Target{CRD: crd.CRD, Namespaced: true, Namespace: "a"}
	for _, tc := range []struct {
		name    string
		target  migrator.Target
		settled bool
		want    string
	}{
		{"settled", crd, true, "All 10 objects are stored at v1"},
		{"not settled", crd, false, "All 10 objects were rewritten to v1"},
		{"one namespace", partial, false, "All 10 objects in the namespace were rewritten to v1"},
	} {
		if got := readyMessage(tc.target, migrator.Result{Settled: tc.settled}, 10); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// A baseline recorded later than first sight keeps what the trigger
// stamped, and only a stamp that differs from what the servers publish
// now asks for more; a stamp of any length fits status.
func TestFirstSight(t *testing.T) {
	target := migrator.Target{StorageVersionHash: "Rm9yZWln"}
	stamp := func(hash string) *migrationv1alpha1.StorageMigration {
		sm := &migrationv1alpha1.StorageMigration{}
		if hash != "" {
			sm.Annotations = map[string]string{migrationv1alpha1.FirstSeenHashAnnotation: hash}
		}
		return sm
	}
	for _, c := range []struct {
		name, stamp, now, want string
	}{
		{"no stamp", "", "Rm9yZWln", ""},
		{"unmoved", "Rm9yZWln", "Rm9yZWln", ""},
		{"no hash published now", "Rm9yZWln", "", ""},
		{"moved", "T2xkZXI=", "Rm9yZWln", "T2xkZXI="},
		{"too long for status", strings.Repeat("x", 70), "Rm9yZWln", strings.Repeat("x", 64)},
	} {
		target.StorageVersionHash = c.now
		got := firstSight(stamp(c.stamp), target)
		switch {
		case c.want == "" && got != nil:
			t.Errorf("%s: baseline %+v, want none from the stamp", c.name, got)
		case c.want != "" && (got == nil || got.StorageVersionHash != c.want):
			t.Errorf("%s: baseline %+v, want storageVersionHash %q", c.name, got, c.want)
		}
	}
}

// A first baseline waits for passes longer only while every API server
// still publishes the hash it first saw: a move since is a re-store.
func TestDeferMax(t *testing.T) {
	gr := schema.GroupResource{Resource: "configmaps"}
	r := &StorageMigrationReconciler{seen: &sweptHashes{swept: true, agreed: map[schema.GroupResource]string{gr: "Rm9yZWln"}}}
	sm := func(stamp string, baseline bool) *migrationv1alpha1.StorageMigration {
		sm := &migrationv1alpha1.StorageMigration{Spec: migrationv1alpha1.StorageMigrationSpec{Resource: migrationv1alpha1.GroupResource{Resource: gr.Resource}}}
		sm.Annotations = map[string]string{migrationv1alpha1.FirstSeenHashAnnotation: stamp}
		if baseline {
			sm.Status.Baseline = &migrationv1alpha1.StorageBaseline{StorageVersionHash: stamp}
		}
		return sm
	}
	for _, c := range []struct {
		name string
		sm   *migrationv1alpha1.StorageMigration
		want time.Duration
	}{
		{"stamped, unmoved", sm("Rm9yZWln", false), baselineDeferMax},
		{"stamped, moved since", sm("T2xkZXI=", false), backgroundDeferMax},
		{"not stamped", sm("", false), backgroundDeferMax},
		{"baseline recorded", sm("Rm9yZWln", true), backgroundDeferMax},
	} {
		if got := r.deferMax(c.sm); got != c.want {
			t.Errorf("%s: waits %s, want %s", c.name, got, c.want)
		}
	}
}
