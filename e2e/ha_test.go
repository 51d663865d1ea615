//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/testenv"
)

// haObjects is the object count of each HA scenario: four scenarios, each
// waiting the default lag bound of 30 s, on three API servers.
const haObjects = 2000

// TestLaggingAPIServer runs the manager binary, as users run it (the default
// lag bound), against a control plane of three kube-apiservers on one etcd
// behind a round-robin balancer, with GOAWAY sending connections from server
// to server, while writers update and delete objects. One server sees the
// storage switch late, by 4 s or by 10 s, a lag that lasts or ends mid-pass.
// Such a server answers the rewrite of an unchanged object still stored at
// v1beta1 with "unchanged"; counted as proof, that pruned storedVersions
// while etcd held hundreds of v1beta1 objects. The manager says in status
// that it waits for every API server, and the observer, reading etcd
// throughout, finds no early prune.
func TestLaggingAPIServer(t *testing.T) {
	ha := testenv.Start(t, testenv.Options{
		CRDDirectoryPaths: []string{"../config/crd/bases"},
		APIServers:        3,
		LaggingAPIServer:  true,
		APIServerArgs:     map[string]string{"goaway-chance": "0.02"},
	})
	for _, tc := range []struct {
		name string
		lag  time.Duration
		ends bool
	}{
		{name: "lag4s", lag: 4 * time.Second},
		{name: "lag4s-ends", lag: 4 * time.Second, ends: true},
		{name: "lag10s", lag: 10 * time.Second},
		{name: "lag10s-ends", lag: 10 * time.Second, ends: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newScenario(t, "ha-"+tc.name, withEnv(ha), withObjects(haObjects))
			manager := s.startManager("manager")
			// Started and leading before the lag: a lagging server slows
			// every client whose watches it serves, a starting manager's
			// cache sync too.
			if err := manager.WaitLeader(t.Context(), time.Minute); err != nil {
				t.Fatal(err)
			}
			s.startWriters(2)
			ha.SetWatchLag(tc.lag)
			t.Cleanup(func() { ha.SetWatchLag(0) })
			s.switchStorage("v1")
			s.waitLagMessage()
			if tc.ends {
				s.waitMidPass()
				ha.SetWatchLag(0)
			}
			s.waitMigrated("v1")
			s.assertDone("v1")
		})
	}
}

// waitLagMessage waits until the StorageMigration says, while it waits for
// every API server to switch, how many there are and what bound it assumes.
// (Before that it may wait for the readiness gate, with the same reason, if
// its discovery read reached the lagging server.)
func (s *scenario) waitLagMessage() {
	s.t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(s.t.Context(), 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		sm, err := s.migration(ctx)
		if err != nil {
			return false, client.IgnoreNotFound(err)
		}
		c := apimeta.FindStatusCondition(sm.Status.Conditions, migrationv1alpha1.ReconcilingCondition)
		if c == nil || c.Reason != migrationv1alpha1.WaitingForStorageVersionReason {
			return false, nil
		}
		last = c.Message
		return strings.Contains(c.Message, "3 API servers") && strings.Contains(c.Message, "--apiserver-lag-bound"), nil
	})
	if err != nil {
		s.t.Fatalf("status never said it waits for 3 API servers by the lag bound (last: %q): %v", last, err)
	}
}
