package controllers

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/migrator"
)

func TestConditionsFor(t *testing.T) {
	tests := []struct {
		name                        string
		outcome                     outcome
		ready, reconciling, stalled metav1.ConditionStatus
	}{
		{"ready", ready("All objects are stored at v1"), "True", "False", "False"},
		{"pass running", reconciling(migrationv1alpha1.ProgressingReason, "10 done"), "False", "True", "False"},
		{"waiting for the API server", reconciling(migrationv1alpha1.WaitingForStorageVersionReason, "not yet"), "False", "True", "False"},
		{"transient error", reconciling(migrationv1alpha1.TransientErrorReason, "webhook down"), "False", "True", "False"},
		{"objects failed", stalled(migrationv1alpha1.ObjectsFailedReason, "1 failed"), "False", "False", "True"},
		{"unsupported", stalled(migrationv1alpha1.UnsupportedReason, "no such resource"), "False", "False", "True"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conditions := conditionsFor(tt.outcome, 7)
			for typ, want := range map[string]metav1.ConditionStatus{
				migrationv1alpha1.ReadyCondition:       tt.ready,
				migrationv1alpha1.ReconcilingCondition: tt.reconciling,
				migrationv1alpha1.StalledCondition:     tt.stalled,
			} {
				c := meta.FindStatusCondition(conditions, typ)
				if c == nil {
					t.Fatalf("no %s condition", typ)
				}
				if c.Status != want || c.Reason != tt.outcome.reason || c.ObservedGeneration != 7 {
					t.Errorf("%s = %s/%s (generation %d), want %s/%s (7)", typ, c.Status, c.Reason, c.ObservedGeneration, want, tt.outcome.reason)
				}
				if c.Status == metav1.ConditionTrue && c.Message != tt.outcome.message {
					t.Errorf("%s message = %q, want %q", typ, c.Message, tt.outcome.message)
				}
			}
		})
	}
}

func TestPassNeeded(t *testing.T) {
	const token = "2026-11-21T10:00:00Z"
	target := func(storage string, stored ...string) migrator.Target {
		return migrator.Target{CRD: &migrator.CRDState{StorageVersion: storage, StoredVersions: stored}}
	}
	done := func(version string, failed int64) *migrationv1alpha1.PassSummary {
		return &migrationv1alpha1.PassSummary{TargetVersion: version, ObjectCounts: migrationv1alpha1.ObjectCounts{Failed: failed}}
	}
	served := func(p *migrationv1alpha1.PassSummary, versions ...string) *migrationv1alpha1.PassSummary {
		p.ServedVersions = versions
		return p
	}
	servedTarget := func(t migrator.Target, versions ...string) migrator.Target {
		t.CRD.ServedVersions = versions
		return t
	}
	builtIn := func(version, hash string) migrator.Target {
		return migrator.Target{StorageVersion: version, StorageVersionHash: hash}
	}
	baseline := &migrationv1alpha1.StorageBaseline{StorageVersion: "v1beta1", StorageVersionHash: "beta="}
	hashed := func(p *migrationv1alpha1.PassSummary, hash string) *migrationv1alpha1.PassSummary {
		p.StorageVersionHash = hash
		return p
	}
	keyed := func(t migrator.Target, hash string) migrator.Target {
		t.Encryption = &migrator.EncryptionState{ConfigHash: hash}
		return t
	}
	recorded := func(hash string, by migrationv1alpha1.EncryptionRecordSource) *migrationv1alpha1.EncryptionRecord {
		return &migrationv1alpha1.EncryptionRecord{EncryptionState: migrationv1alpha1.EncryptionState{ConfigHash: hash}, RecordedBy: by}
	}
	tests := []struct {
		name    string
		status  migrationv1alpha1.StorageMigrationStatus
		gen     int64
		token   string
		prune   bool
		skip    bool
		target  migrator.Target
		wantRun bool
	}{
		{name: "built-in: first pass", gen: 1, target: builtIn("v1", "one="), wantRun: true},
		{name: "re-encrypted: at its baseline", gen: 1, skip: true, status: migrationv1alpha1.StorageMigrationStatus{ObservedGeneration: 1, Baseline: baseline, Encryption: recorded("sha256:a", migrationv1alpha1.EncryptionRecordedByBaseline)}, target: keyed(builtIn("v1beta1", "beta="), "sha256:a")},
		{name: "re-encrypted: every server loaded another configuration", gen: 1, skip: true, status: migrationv1alpha1.StorageMigrationStatus{ObservedGeneration: 1, Baseline: baseline, Encryption: recorded("sha256:a", migrationv1alpha1.EncryptionRecordedByBaseline)}, target: keyed(builtIn("v1beta1", "beta="), "sha256:b"), wantRun: true},
		{name: "re-encrypted: at its last pass's configuration", gen: 1, status: migrationv1alpha1.StorageMigrationStatus{ObservedGeneration: 1, LastPass: hashed(done("v1", 0), "one="), Encryption: recorded("sha256:b", migrationv1alpha1.EncryptionRecordedByPass)}, target: keyed(builtIn("v1", "one="), "sha256:b")},
		{name: "re-encrypted: the last pass ended while the state moved", gen: 1, status: migrationv1alpha1.StorageMigrationStatus{ObservedGeneration: 1, LastPass: hashed(done("v1", 0), "one="), Encryption: recorded("sha256:b", migrationv1alpha1.EncryptionRecordedByMoved)}, target: keyed(builtIn("v1", "one="), "sha256:b"), wantRun: true},
		{name: "re-encrypted: nothing recorded yet", gen: 1, status: migrationv1alpha1.StorageMigrationStatus{ObservedGeneration: 1, LastPass: hashed(done("v1", 0), "one=")}, target: keyed(builtIn("v1", "one="), "sha256:b")},
		{name: "built-in skipping: at its baseline", gen: 1, skip: true, status: migrationv1alpha1.StorageMigrationStatus{ObservedGeneration: 1, Baseline: baseline}, target: builtIn("v1beta1", "beta=")},
		{name: "built-in skipping: moved from its baseline", gen: 1, skip: true, status: migrationv1alpha1.StorageMigrationStatus{ObservedGeneration: 1, Baseline: baseline}, target: builtIn("v1", "one="), wantRun: true},
		{name: "built-in skipping: no hash to compare", gen: 1, skip: true, status: migrationv1alpha1.StorageMigrationStatus{ObservedGeneration: 1, Baseline: baseline}, target: builtIn("", "")},
		{name: "built-in skipping: re-run requested", gen: 1, skip: true, token: token, status: migrationv1alpha1.StorageMigrationStatus{ObservedGeneration: 1, Baseline: baseline}, target: builtIn("v1beta1", "beta="), wantRun: true},
		{name: "built-in: hash moved since the last pass", gen: 1, status: migrationv1alpha1.StorageMigrationStatus{ObservedGeneration: 1, LastPass: hashed(done("v1", 0), "one=")}, target: builtIn("v1", "other="), wantRun: true},
		{name: "built-in: at its last pass's hash", gen: 1, skip: true, status: migrationv1alpha1.StorageMigrationStatus{ObservedGeneration: 1, LastPass: hashed(done("v1", 0), "one=")}, target: builtIn("v1", "one=")},
		{name: "CRD: Skip has no effect", gen: 1, skip: true, prune: true, target: target("v1", "v1beta1", "v1"), wantRun: true},
		{name: "first pass", gen: 1, prune: true, target: target("v1", "v1"), wantRun: true},
		{name: "all done and pruned", gen: 1, prune: true, status: migrationv1alpha1.StorageMigrationStatus{ObservedGeneration: 1, LastPass: done("v1", 0)}, target: target("v1", "v1")},
		{name: "old version still listed", gen: 1, prune: true, status: migrationv1alpha1.StorageMigrationStatus{ObservedGeneration: 1, LastPass: done("v1", 0)}, target: target("v1", "v1beta1", "v1"), wantRun: true},
		{name: "old version listed, pruning off", gen: 1, prune: false, status: migrationv1alpha1.StorageMigrationStatus{ObservedGeneration: 1, LastPass: done("v1", 0)}, target: target("v1", "v1beta1", "v1")},
		{name: "storage version changed", gen: 1, prune: true, status: migrationv1alpha1.StorageMigrationStatus{ObservedGeneration: 1, LastPass: done("v1", 0)}, target: target("v2", "v1", "v2"), wantRun: true},
		{name: "spec changed", gen: 2, prune: true, status: migrationv1alpha1.StorageMigrationStatus{ObservedGeneration: 1, LastPass: done("v1", 0)}, target: target("v1", "v1"), wantRun: true},
		{name: "re-run requested", gen: 1, token: token, prune: true, status: migrationv1alpha1.StorageMigrationStatus{ObservedGeneration: 1, LastPass: done("v1", 0)}, target: target("v1", "v1"), wantRun: true},
		{name: "re-run already handled", gen: 1, token: token, prune: true, status: migrationv1alpha1.StorageMigrationStatus{ObservedGeneration: 1, LastPass: done("v1", 0), LastHandledReRunToken: token}, target: target("v1", "v1")},
		{name: "failed objects", gen: 1, prune: true, status: migrationv1alpha1.StorageMigrationStatus{ObservedGeneration: 1, LastPass: done("v1", 2)}, target: target("v1", "v1beta1", "v1"), wantRun: true},
		{name: "a version stopped being served", gen: 1, prune: true, status: migrationv1alpha1.StorageMigrationStatus{ObservedGeneration: 1, LastPass: served(done("v1", 0), "v1beta1", "v1")}, target: servedTarget(target("v1", "v1"), "v1"), wantRun: true},
		{name: "served versions unchanged", gen: 1, prune: true, status: migrationv1alpha1.StorageMigrationStatus{ObservedGeneration: 1, LastPass: served(done("v1", 0), "v1beta1", "v1")}, target: servedTarget(target("v1", "v1"), "v1beta1", "v1")},
		{name: "interrupted pass", gen: 1, prune: true, status: migrationv1alpha1.StorageMigrationStatus{ObservedGeneration: 1, LastPass: done("v1", 0), Progress: &migrationv1alpha1.PassProgress{}}, target: target("v1", "v1"), wantRun: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sm := &migrationv1alpha1.StorageMigration{Status: tt.status}
			sm.Generation = tt.gen
			sm.Spec.PruneStoredVersions = &tt.prune
			if tt.skip {
				sm.Spec.FirstPass = migrationv1alpha1.FirstPassSkip
			}
			if tt.token != "" {
				sm.Annotations = map[string]string{migrationv1alpha1.ReRunAnnotation: tt.token}
			}
			if why := migrationNeeded(sm, tt.target); (why != "") != tt.wantRun {
				t.Errorf("migrationNeeded = %q, want a pass: %v", why, tt.wantRun)
			}
		})
	}
}

// TestProgressSummary: the wide PROGRESS column counts the pass under way,
// and the last pass once none runs, so it stays meaningful after a pass.
func TestProgressSummary(t *testing.T) {
	remaining := int64(1500)
	counts := func(listed, migrated, already, skipped, failed int64) migrationv1alpha1.ObjectCounts {
		return migrationv1alpha1.ObjectCounts{Listed: listed, Migrated: migrated, AlreadyStored: already, Skipped: skipped, Failed: failed}
	}
	tests := []struct {
		name   string
		status migrationv1alpha1.StorageMigrationStatus
		want   string
	}{
		{"nothing yet", migrationv1alpha1.StorageMigrationStatus{}, ""},
		{"pass starting", migrationv1alpha1.StorageMigrationStatus{Progress: &migrationv1alpha1.PassProgress{Phase: migrationv1alpha1.PassRewriting}}, "0/?"},
		{"estimate", migrationv1alpha1.StorageMigrationStatus{Progress: &migrationv1alpha1.PassProgress{
			Phase: migrationv1alpha1.PassRewriting, ObjectCounts: counts(1500, 1000, 400, 99, 1), RemainingEstimate: &remaining, ContinueToken: "t"}}, "1500/~3000"},
		{"no estimate", migrationv1alpha1.StorageMigrationStatus{Progress: &migrationv1alpha1.PassProgress{
			Phase: migrationv1alpha1.PassRewriting, ObjectCounts: counts(500, 500, 0, 0, 0), ContinueToken: "t"}}, "500/500+"},
		{"settling", migrationv1alpha1.StorageMigrationStatus{Progress: &migrationv1alpha1.PassProgress{
			Phase: migrationv1alpha1.PassSettling, ObjectCounts: counts(3000, 3000, 0, 0, 0)}}, "3000/3000"},
		{"after the pass", migrationv1alpha1.StorageMigrationStatus{LastPass: &migrationv1alpha1.PassSummary{ObjectCounts: counts(3000, 2000, 990, 0, 10)}}, "3000/3000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := progressSummary(&tt.status); got != tt.want {
				t.Errorf("progressSummary = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestReEncryptedRecordsOnlyAStateThatHeld: the end of a pass records the
// encryption state it began under as Pass only when every API server still
// reported it at the end; otherwise as Moved, with a Warning, so that the
// next state they agree on starts another pass.
func TestReEncryptedRecordsOnlyAStateThatHeld(t *testing.T) {
	target := migrator.Target{Resource: schema.GroupVersionResource{Version: "v1", Resource: "secrets"},
		Encryption: &migrator.EncryptionState{ConfigHash: "sha256:b"}}
	for _, tc := range []struct {
		name   string
		moved  string
		want   migrationv1alpha1.EncryptionRecordSource
		reason string
	}{
		{name: "held", want: migrationv1alpha1.EncryptionRecordedByPass, reason: "ReEncrypted"},
		{name: "moved", moved: "the API servers loaded encryption configuration sha256:c during the pass", want: migrationv1alpha1.EncryptionRecordedByMoved, reason: "EncryptionMoved"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _ := reEncrypted(t.Context(), outcome{}, target, migrator.Result{EncryptionMoved: tc.moved})
			status := &migrationv1alpha1.StorageMigrationStatus{}
			out.status.writeTo(status)
			if status.Encryption == nil || status.Encryption.RecordedBy != tc.want || status.Encryption.ConfigHash != "sha256:b" {
				t.Errorf("recorded %+v, want sha256:b by %s", status.Encryption, tc.want)
			}
			if len(out.events) != 1 || out.events[0].reason != tc.reason {
				t.Errorf("events %+v, want one %s", out.events, tc.reason)
			}
		})
	}
}

// TestReStoreUnseen: where restow cannot read every API server, a built-in
// resource's pass does not start because its storage version moved; a pass
// someone asks for, or one under way, goes on.
func TestReStoreUnseen(t *testing.T) {
	const unseen = "2 API servers counted, 1 of them at an address in default/kubernetes's EndpointSlices"
	moved := migrator.Target{Resource: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, StorageVersion: "v1", StorageVersionHash: "new=", ServersUnseen: unseen}
	atBaseline := migrationv1alpha1.StorageMigrationStatus{ObservedGeneration: 1, Baseline: &migrationv1alpha1.StorageBaseline{StorageVersion: "v1beta1", StorageVersionHash: "old="}}
	afterPass := migrationv1alpha1.StorageMigrationStatus{ObservedGeneration: 1, LastPass: &migrationv1alpha1.PassSummary{TargetVersion: "v1beta1", StorageVersionHash: "old="}}
	for _, tc := range []struct {
		name   string
		status migrationv1alpha1.StorageMigrationStatus
		target migrator.Target
		token  string
		gen    int64
		want   bool
	}{
		{name: "moved from the baseline", status: atBaseline, target: moved, gen: 1, want: true},
		{name: "moved since the last pass", status: afterPass, target: moved, gen: 1, want: true},
		{name: "every server read", status: afterPass, target: func() migrator.Target { t := moved; t.ServersUnseen = ""; return t }(), gen: 1},
		{name: "not moved", status: afterPass, target: func() migrator.Target { t := moved; t.StorageVersionHash = "old="; return t }(), gen: 1},
		{name: "asked for: a re-run", status: afterPass, target: moved, gen: 1, token: "now"},
		{name: "asked for: a new spec", status: afterPass, target: moved, gen: 2},
		{name: "under way at the new hash", status: func() migrationv1alpha1.StorageMigrationStatus {
			s := afterPass
			s.Progress = &migrationv1alpha1.PassProgress{StorageVersionHash: "new="}
			return s
		}(), target: moved, gen: 1},
		{name: "interrupted under the old hash: it would start over at the new one", status: func() migrationv1alpha1.StorageMigrationStatus {
			s := afterPass
			s.Progress = &migrationv1alpha1.PassProgress{StorageVersionHash: "old="}
			return s
		}(), target: moved, gen: 1, want: true},
		{name: "a first pass of one someone made", status: migrationv1alpha1.StorageMigrationStatus{}, target: moved, gen: 1},
	} {
		sm := &migrationv1alpha1.StorageMigration{Status: tc.status}
		sm.Generation = tc.gen
		if tc.token != "" {
			sm.Annotations = map[string]string{migrationv1alpha1.ReRunAnnotation: tc.token}
		}
		if got := reStoreUnseen(sm, tc.target); got != tc.want {
			t.Errorf("%s: reStoreUnseen = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestBaselineUnproven: a first baseline is proven only by every API
// server's word (the trigger's stamp, or restow reading every server now,
// for a StorageMigration the trigger stamped or a person made). An
// unproven one is Ready (BaselineUnproven: kstatus Current, no alert) until
// restow reads every server, then a pass replaces it.
func TestBaselineUnproven(t *testing.T) {
	const unseen = "2 API servers counted, 1 of them at an address in default/kubernetes's EndpointSlices"
	target := migrator.Target{Resource: schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "mutatingadmissionpolicies"},
		StorageVersion: "v1", StorageVersionHash: "new="}
	automatic := map[string]string{migrationv1alpha1.AutomaticLabel: "true", migrationv1alpha1.BuiltInLabel: "true"}
	for _, tc := range []struct {
		name    string
		labels  map[string]string
		stamp   string
		unseen  string
		wantWhy string
	}{
		{name: "the trigger stamped it", labels: automatic, stamp: "new=", unseen: unseen},
		{name: "a person's, every server read"},
		{name: "a person's, a server unread", unseen: unseen, wantWhy: "restow could not read every API server when it recorded it (" + unseen + ")"},
		{name: "the trigger's, unstamped, a server unread", labels: automatic, unseen: unseen, wantWhy: "restow could not read every API server when it recorded it"},
		{name: "the trigger's, unstamped, every server read now", labels: automatic, wantWhy: "restow could not read every API server when it first saw the resource"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sm := &migrationv1alpha1.StorageMigration{Spec: migrationv1alpha1.StorageMigrationSpec{FirstPass: migrationv1alpha1.FirstPassSkip}}
			sm.Labels = tc.labels
			if tc.stamp != "" {
				sm.Annotations = map[string]string{migrationv1alpha1.FirstSeenHashAnnotation: tc.stamp}
			}
			target := target
			target.ServersUnseen = tc.unseen
			why := baselineUnproven(sm, target)
			if !strings.HasPrefix(why, tc.wantWhy) || (tc.wantWhy == "") != (why == "") {
				t.Fatalf("baselineUnproven = %q, want %q", why, tc.wantWhy)
			}
			out := recordBaseline(sm, target)
			conditions := conditionsFor(out, 1)
			ready := meta.FindStatusCondition(conditions, migrationv1alpha1.ReadyCondition)
			if ready.Status != metav1.ConditionTrue || meta.IsStatusConditionTrue(conditions, migrationv1alpha1.ReconcilingCondition) || meta.IsStatusConditionTrue(conditions, migrationv1alpha1.StalledCondition) {
				t.Errorf("conditions %+v: want Ready and nothing under way, whatever the proof", conditions)
			}
			baseline := out.status.baseline.value
			if baseline == nil || baseline.Unproven != why {
				t.Fatalf("baseline %+v, want unproven %q", baseline, why)
			}
			if wantReason := map[bool]string{true: migrationv1alpha1.BaselineUnprovenReason, false: migrationv1alpha1.SucceededReason}[why != ""]; ready.Reason != wantReason ||
				(why != "" && (!strings.Contains(ready.Message, "and not proven") || !strings.Contains(ready.Message, "kubectl restow migrate "+target.Resource.GroupResource().String()))) {
				t.Errorf("Ready %s: %s; want reason %s", ready.Reason, ready.Message, wantReason)
			}
			// Later: a pass replaces an unproven baseline once every server
			// is read, and only then.
			sm.Status = migrationv1alpha1.StorageMigrationStatus{Baseline: baseline}
			for _, servers := range []string{unseen, ""} {
				target.ServersUnseen = servers
				got := migrationNeeded(sm, target)
				if want := why != "" && servers == ""; (got != "") != want || (want && !strings.Contains(got, "re-stores every object at v1")) {
					t.Errorf("servers unseen %q: migrationNeeded = %q, want a pass: %v", servers, got, want)
				}
			}
		})
	}
}
