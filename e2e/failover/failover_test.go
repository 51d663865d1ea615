//go:build e2e

// Package failover runs the manager binary against the source-built control
// plane and kills it mid-pass: a manager killed and replaced (also while
// the storage version goes away and back), and a leader killed beside a
// second replica. Every scenario ends with proof read from etcd. Run with
// `make test-e2e`.
package failover

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/restow/restow/e2e/scenario"
	"github.com/restow/restow/internal/operator"
	"github.com/restow/restow/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { scenario.Main(m, &env) }

// TestManagerKilledMidPass: the manager is killed (SIGKILL) mid-pass; a new
// one resumes from the recorded continue token and completes.
func TestManagerKilledMidPass(t *testing.T) {
	s := scenario.New(t, env, "kill")
	first := s.StartManager("first")
	s.SwitchStorage("v1")
	s.WaitMidPass()
	first.Kill()
	if sm, err := s.Migration(t.Context()); err != nil || sm.Status.Progress == nil {
		t.Fatalf("no progress recorded before the kill: %+v, %v", sm.Status, err)
	}
	second := s.StartManager("second")
	s.WaitMigrated("v1")
	if !strings.Contains(second.Logs(), `"resumed":true`) {
		t.Errorf("the second manager did not resume the pass from its continue token:\n%s", second.Logs())
	}
	s.AssertDone("v1")
}

// TestManagerKilledSwitchAwayAndBack: the manager is killed mid-pass; while
// it is down the storage version goes v1 -> v2 -> v1, with writes at v2 to
// objects the pass had already rewritten. The saved continue token would
// skip them: the next manager must start over, not resume.
func TestManagerKilledSwitchAwayAndBack(t *testing.T) {
	s := scenario.New(t, env, "away", scenario.WithVersions("v1beta1", "v1", "v2"))
	first := s.StartManager("first")
	s.SwitchStorage("v1")
	s.WaitMidPass()
	first.Kill()
	s.SwitchStorage("v2")
	// The first objects of the first namespace: the first pages of the pass.
	for i := 0; i < 500; i += len(s.Namespaces) {
		patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"writer":"away"}}`))
		if err := env.Client.Patch(t.Context(), s.Object("v2", i), patch); err != nil {
			t.Fatal(err)
		}
	}
	s.SwitchStorage("v1")
	if counts, err := s.StoredCounts(t.Context()); err != nil || counts["v2"] != 100 {
		t.Fatalf("etcd holds %v (%v) before the restart, want 100 objects at v2", counts, err)
	}
	second := s.StartManager("second")
	s.WaitMigrated("v1")
	if !strings.Contains(second.Logs(), "starting over") {
		t.Errorf("the second manager did not start the pass over:\n%s", second.Logs())
	}
	s.AssertDone("v1")
}

// TestLeaderKilledMidPass: two replicas; the leader is killed mid-pass, the
// other takes the lease over and completes the pass.
func TestLeaderKilledMidPass(t *testing.T) {
	s := scenario.New(t, env, "failover")
	a, b := s.StartManager("replica-a"), s.StartManager("replica-b")
	leader, follower := whoLeads(t, a, b)
	s.SwitchStorage("v1")
	s.WaitMidPass()
	killed := time.Now()
	leader.Kill()
	// The lease lasts 60 s: the follower takes over within about that.
	if err := follower.WaitLeader(t.Context(), 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s took the lease over %s after %s was killed", follower.Name, time.Since(killed).Round(time.Millisecond), leader.Name)
	s.WaitMigrated("v1")
	if !strings.Contains(follower.Logs(), "Starting a migration") {
		t.Errorf("%s never ran a pass:\n%s", follower.Name, follower.Logs())
	}
	s.AssertDone("v1")
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
