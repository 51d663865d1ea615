//go:build e2e

// Package churn runs the manager binary against the source-built control
// plane while the migrated resource changes under the pass: writers
// throughout, a second storage switch, the CRD deleted, and continue tokens
// outlived by etcd's compaction. Every scenario ends with proof read from
// etcd. Run with `make test-e2e`.
package churn

import (
	"context"
	"strings"
	"testing"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/e2e/scenario"
	"github.com/restow/restow/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { scenario.Main(m, &env) }

// TestWritersThroughout: writers update and delete objects during the whole
// pass; no update is lost and no deleted object comes back.
func TestWritersThroughout(t *testing.T) {
	s := scenario.New(t, env, "writers")
	s.StartWriters(4)
	s.StartManager("manager")
	time.Sleep(time.Second)
	s.SwitchStorage("v1")
	s.WaitMigrated("v1")
	s.AssertDone("v1")
}

// TestSecondSwitchMidPass: the storage version switches again (v1 to v2)
// while the pass to v1 runs; the migration ends with everything at v2.
func TestSecondSwitchMidPass(t *testing.T) {
	s := scenario.New(t, env, "switch", scenario.WithVersions("v1beta1", "v1", "v2"))
	s.StartManager("manager")
	s.SwitchStorage("v1")
	s.WaitMidPass()
	s.SwitchStorage("v2")
	s.WaitMigrated("v2")
	s.AssertDone("v2")
}

// TestCRDDeletedMidPass: the CRD is deleted mid-pass. The manager keeps
// running, reports it, and does not retry in a tight loop.
func TestCRDDeletedMidPass(t *testing.T) {
	s := scenario.New(t, env, "deleted")
	manager := s.StartManager("manager")
	s.SwitchStorage("v1")
	s.WaitMidPass()
	s.Observer.AssertNoEarlyPrune(t, false)
	if err := env.DeleteCRD(testenv.Context(t, 2*time.Minute), s.CRDName); err != nil {
		t.Fatal(err)
	}
	message := s.WaitCondition(migrationv1alpha1.StalledCondition, migrationv1alpha1.UnsupportedReason, time.Minute)
	t.Logf("Stalled/Unsupported: %q", message)
	if !strings.Contains(message, s.CRDName) {
		t.Errorf("the message does not name the resource %s: %q", s.CRDName, message)
	}
	// Ten seconds later the manager is still up and has not logged in a
	// loop: with retries backing off from 1 s to 5 s, a few lines at most.
	before := strings.Count(manager.Logs(), "\n")
	time.Sleep(10 * time.Second)
	lines := strings.Count(manager.Logs(), "\n") - before
	if manager.Exited() {
		t.Fatalf("the manager exited:\n%s", manager.Logs())
	}
	t.Logf("%d log lines in the 10 s after", lines)
	if lines > 40 {
		t.Errorf("%d log lines in 10 s after the CRD was deleted: a tight loop", lines)
	}
	sm, err := s.Migration(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if ready := apimeta.FindStatusCondition(sm.Status.Conditions, migrationv1alpha1.ReadyCondition); ready == nil || ready.Status == metav1.ConditionTrue {
		t.Errorf("Ready is %+v after the CRD was deleted mid-pass, want False", ready)
	}
}

// TestContinueTokenExpires: a slow pass (pages of 50, one worker) outlives
// its continue token: the API server compacts etcd every 5 s. The pass goes
// on with the token the API server offers and still covers every object.
func TestContinueTokenExpires(t *testing.T) {
	s := scenario.New(t, env, "expiry")
	// A user's StorageMigration, slow on purpose; the trigger defers to it.
	sm := &migrationv1alpha1.StorageMigration{}
	sm.Name = s.CRDName
	sm.Spec.Resource = migrationv1alpha1.GroupResource{Group: s.Group, Resource: scenario.Plural}
	sm.Spec.PageSize = ptr.To[int32](50)
	sm.Spec.Concurrency = ptr.To[int32](1)
	if err := env.Client.Create(t.Context(), sm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), sm) })
	// A client-side limit of 150 requests a second stretches the pass over
	// 40 s or more, several compactions: at the manager's own pace the
	// pass could end within one or two, and sometimes no token expired.
	manager := s.StartManager("manager", "--log-level=2", "--kube-api-qps=150", "--kube-api-burst=10")
	s.SwitchStorage("v1")
	s.WaitMigrated("v1")
	if !strings.Contains(manager.Logs(), "Continue token expired") {
		t.Errorf("no continue token expired, so the scenario tested nothing; the pass was too fast for compaction every %s", scenario.CompactionInterval)
	}
	s.AssertDone("v1")
}
