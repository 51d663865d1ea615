//go:build e2e

package e2e

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/operator"
	"github.com/restow/restow/internal/testenv"
)

// webhookDown is how long the conversion webhook stays away in
// TestConversionWebhookDown: RESTOW_E2E_WEBHOOK_DOWN, by default 30 s.
func webhookDown(t *testing.T) time.Duration {
	return durationFromEnv(t, "RESTOW_E2E_WEBHOOK_DOWN", 30*time.Second)
}

// TestBaseline: no fault. The automatic migration after a storage switch,
// with the manager binary, as every other scenario starts.
func TestBaseline(t *testing.T) {
	s := newScenario(t, "baseline")
	s.startManager("manager")
	start := time.Now()
	s.switchStorage("v1")
	s.waitMigrated("v1")
	t.Logf("%d objects migrated in %s", s.n, time.Since(start).Round(time.Millisecond))
	s.assertDone("v1")
}

// TestManagerKilledMidPass: the manager is killed (SIGKILL) mid-pass; a new
// one resumes from the recorded continue token and completes.
func TestManagerKilledMidPass(t *testing.T) {
	s := newScenario(t, "kill")
	first := s.startManager("first")
	s.switchStorage("v1")
	s.waitMidPass()
	first.Kill()
	if sm, err := s.migration(t.Context()); err != nil || sm.Status.Progress == nil {
		t.Fatalf("no progress recorded before the kill: %+v, %v", sm.Status, err)
	}
	second := s.startManager("second")
	s.waitMigrated("v1")
	if !strings.Contains(second.Logs(), `"resumed":true`) {
		t.Errorf("the second manager did not resume the pass from its continue token:\n%s", second.Logs())
	}
	s.assertDone("v1")
}

// TestManagerKilledSwitchAwayAndBack: the manager is killed mid-pass; while
// it is down the storage version goes v1 -> v2 -> v1, with writes at v2 to
// objects the pass had already rewritten. The saved continue token would
// skip them: the next manager must start over, not resume.
func TestManagerKilledSwitchAwayAndBack(t *testing.T) {
	s := newScenario(t, "away", withVersions("v1beta1", "v1", "v2"))
	first := s.startManager("first")
	s.switchStorage("v1")
	s.waitMidPass()
	first.Kill()
	s.switchStorage("v2")
	// The first objects of the first namespace: the first pages of the pass.
	for i := 0; i < 500; i += len(s.namespaces) {
		patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"writer":"away"}}`))
		if err := env.Client.Patch(t.Context(), s.object("v2", i), patch); err != nil {
			t.Fatal(err)
		}
	}
	s.switchStorage("v1")
	if counts, err := s.storedCounts(t.Context()); err != nil || counts["v2"] != 100 {
		t.Fatalf("etcd holds %v (%v) before the restart, want 100 objects at v2", counts, err)
	}
	second := s.startManager("second")
	s.waitMigrated("v1")
	if !strings.Contains(second.Logs(), "starting over") {
		t.Errorf("the second manager did not start the pass over:\n%s", second.Logs())
	}
	s.assertDone("v1")
}

// TestLeaderKilledMidPass: two replicas; the leader is killed mid-pass, the
// other takes the lease over and completes the pass.
func TestLeaderKilledMidPass(t *testing.T) {
	s := newScenario(t, "failover")
	a, b := s.startManager("replica-a"), s.startManager("replica-b")
	leader, follower := whoLeads(t, a, b)
	s.switchStorage("v1")
	s.waitMidPass()
	killed := time.Now()
	leader.Kill()
	// The lease lasts 60 s: the follower takes over within about that.
	if err := follower.WaitLeader(t.Context(), 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s took the lease over %s after %s was killed", follower.Name, time.Since(killed).Round(time.Millisecond), leader.Name)
	s.waitMigrated("v1")
	if !strings.Contains(follower.Logs(), "Starting pass") {
		t.Errorf("%s never ran a pass:\n%s", follower.Name, follower.Logs())
	}
	s.assertDone("v1")
}

// whoLeads waits until one of the managers holds the lease.
func whoLeads(t *testing.T, a, b *operator.Process) (leader, follower *operator.Process) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		for _, pair := range [][2]*operator.Process{{a, b}, {b, a}} {
			if v, err := pair[0].Metric(t.Context(), "leader_election_master_status", nil); err == nil && v == 1 {
				return pair[0], pair[1]
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("neither manager became the leader")
	return nil, nil
}

// TestAPIServerRestartMidPass: kube-apiserver is stopped mid-pass and
// started again over the same etcd; the manager rides it out.
func TestAPIServerRestartMidPass(t *testing.T) {
	s := newScenario(t, "restart")
	manager := s.startManager("manager")
	s.switchStorage("v1")
	s.waitMidPass()
	stopped, ready, err := env.RestartAPIServer(t.Context(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-apiserver stopped %s after SIGTERM and was ready again after %s", stopped.Round(time.Millisecond), ready.Round(time.Millisecond))
	s.waitMigrated("v1")
	if manager.Exited() {
		t.Fatalf("the manager exited:\n%s", manager.Logs())
	}
	s.assertDone("v1")
}

// TestConversionWebhookDown: the CRD converts through a webhook, which goes
// away mid-pass (connection refused) and comes back; meanwhile the
// migration says why it waits and nothing is pruned.
func TestConversionWebhookDown(t *testing.T) {
	webhook := testenv.StartConversionWebhook(t, func(*unstructured.Unstructured, string) error { return nil })
	s := newScenario(t, "webhook", withConversion(webhook.Conversion()))
	s.startManager("manager")
	s.switchStorage("v1")
	s.waitMidPass()
	webhook.Stop()
	down := time.Now()
	message := s.waitCondition(migrationv1alpha1.ReconcilingCondition, migrationv1alpha1.TransientErrorReason, webhookDown(t))
	t.Logf("while the webhook is down: Reconciling/TransientError %q", message)
	if !strings.Contains(message, "conversion webhook") {
		t.Errorf("the reason does not name the conversion webhook: %q", message)
	}
	time.Sleep(webhookDown(t) - time.Since(down))
	counts, err := s.storedCounts(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if counts["v1beta1"] == 0 {
		t.Fatalf("etcd holds %v: the pass finished without the webhook, so the fault hit nothing", counts)
	}
	t.Logf("webhook back after %s; etcd holds %v", time.Since(down).Round(time.Millisecond), counts)
	if err := webhook.Restart(); err != nil {
		t.Fatal(err)
	}
	s.waitMigrated("v1")
	s.assertDone("v1")
}

// TestWritersThroughout: writers update and delete objects during the whole
// pass; no update is lost and no deleted object comes back.
func TestWritersThroughout(t *testing.T) {
	s := newScenario(t, "writers")
	s.startWriters(4)
	s.startManager("manager")
	time.Sleep(time.Second)
	s.switchStorage("v1")
	s.waitMigrated("v1")
	s.assertDone("v1")
}

// TestSecondSwitchMidPass: the storage version switches again (v1 to v2)
// while the pass to v1 runs; the migration ends with everything at v2.
func TestSecondSwitchMidPass(t *testing.T) {
	s := newScenario(t, "switch", withVersions("v1beta1", "v1", "v2"))
	s.startManager("manager")
	s.switchStorage("v1")
	s.waitMidPass()
	s.switchStorage("v2")
	s.waitMigrated("v2")
	s.assertDone("v2")
}

// TestCRDDeletedMidPass: the CRD is deleted mid-pass. The manager keeps
// running, reports it, and does not retry in a tight loop.
func TestCRDDeletedMidPass(t *testing.T) {
	s := newScenario(t, "deleted")
	manager := s.startManager("manager")
	s.switchStorage("v1")
	s.waitMidPass()
	s.observer.AssertNoEarlyPrune(t, false)
	if err := env.DeleteCRD(testenv.Context(t, 2*time.Minute), s.crdName); err != nil {
		t.Fatal(err)
	}
	message := s.waitCondition(migrationv1alpha1.StalledCondition, migrationv1alpha1.UnsupportedReason, time.Minute)
	t.Logf("Stalled/Unsupported: %q", message)
	if !strings.Contains(message, s.crdName) {
		t.Errorf("the message does not name the resource %s: %q", s.crdName, message)
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
	sm, err := s.migration(t.Context())
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
	s := newScenario(t, "expiry")
	// A user's StorageMigration, slow on purpose; the trigger defers to it.
	sm := &migrationv1alpha1.StorageMigration{}
	sm.Name = s.crdName
	sm.Spec.Resource = migrationv1alpha1.GroupResource{Group: s.group, Resource: plural}
	sm.Spec.PageSize = ptr.To[int32](50)
	sm.Spec.Concurrency = ptr.To[int32](1)
	if err := env.Client.Create(t.Context(), sm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), sm) })
	// A client-side limit of 150 requests a second stretches the pass over
	// 40 s or more, several compactions: at the manager's own pace the
	// pass could end within one or two, and sometimes no token expired.
	manager := s.startManager("manager", "--log-level=2", "--kube-api-qps=150", "--kube-api-burst=10")
	s.switchStorage("v1")
	s.waitMigrated("v1")
	if !strings.Contains(manager.Logs(), "Continue token expired") {
		t.Errorf("no continue token expired, so the scenario tested nothing; the pass was too fast for compaction every %s", compactionInterval)
	}
	s.assertDone("v1")
}

func durationFromEnv(t *testing.T, name string, def time.Duration) time.Duration {
	if v := strings.TrimSpace(os.Getenv(name)); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("%s=%q: %v", name, v, err)
		}
		return d
	}
	return def
}
