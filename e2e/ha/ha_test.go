//go:build e2e

// Package ha runs the manager binary against a control plane of several
// kube-apiservers on one etcd, one of them seeing the storage switch late.
// Run with `make test-e2e`.
package ha

import (
	"slices"
	"strings"
	"testing"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/e2e/scenario"
	"github.com/restow/restow/internal/testenv"
)

// haObjects is the object count of each HA scenario: four scenarios on
// three API servers.
const haObjects = 2000

// TestLaggingAPIServer runs the manager binary, as users run it (the default
// lag bound), against a control plane of three kube-apiservers on one etcd,
// each on an address of its own published in default/kubernetes's
// EndpointSlices, behind a round-robin balancer, with GOAWAY sending
// connections from server to server, while writers update and delete
// objects. One server sees the storage switch late, by 4 s or by 10 s, a lag
// that lasts or ends mid-pass. Such a server answers the rewrite of an
// unchanged object still stored at v1beta1 with "unchanged"; counted as
// proof, that pruned storedVersions while etcd held hundreds of v1beta1
// objects. The manager reads each server's own discovery and says so in
// status, and the observer, reading etcd throughout, finds no early prune.
func TestLaggingAPIServer(t *testing.T) {
	ha := testenv.Start(t, testenv.Options{
		CRDDirectoryPaths: []string{scenario.CRDDirectory},
		APIServers:        3,
		OwnAddresses:      true,
		LaggingAPIServer:  true,
		APIServerArgs:     map[string]string{"goaway-chance": "0.02"},
	})
	ha.WaitForSignals(t, 3, 3)
	// The lagging server is the last one.
	lagging := strings.TrimPrefix(ha.ServerConfig(2).Host, "https://")
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
			s := scenario.New(t, ha, "ha-"+tc.name, scenario.WithObjects(haObjects))
			manager := s.StartManager("manager")
			// Leading, its caches synced, before the lag: a server whose
			// watch cache lags by more than 3 s refuses a starting
			// informer's consistent watch for as long as it lags (client-go
			// retries without end), and the balancer may send every
			// request of the manager to it.
			if err := manager.WaitLeader(t.Context(), time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := manager.WaitWorking(t.Context(), time.Minute, "automigration", "storagemigration"); err != nil {
				t.Fatal(err)
			}
			s.StartWriters(2)
			ha.SetWatchLag(tc.lag)
			t.Cleanup(func() { ha.SetWatchLag(0) })
			s.SwitchStorage("v1")
			waitLagMessage(t, s, lagging)
			if tc.ends {
				s.WaitMidPass()
				ha.SetWatchLag(0)
			}
			s.WaitMigrated("v1")
			s.AssertDone("v1")
		})
	}
}

// waitLagMessage waits until the StorageMigration says, while it waits for
// every API server to switch, that it counts three and reads each one's own
// discovery, the lagging one's among them. (What each server showed is
// hatest's to check: here the manager's own CRD informer may run through
// the lagging server and see the switch after every server has.) It fails
// once the status has shown no progress for a minute.
func waitLagMessage(t *testing.T, s *scenario.Scenario, lagging string) {
	t.Helper()
	want := []string{"3 API servers", "restow reads each server's own discovery at ", lagging}
	s.Env.WaitForMigration(t, s.CRDName, time.Minute, "reading "+lagging, func(sm *migrationv1alpha1.StorageMigration) bool {
		c := apimeta.FindStatusCondition(sm.Status.Conditions, migrationv1alpha1.ReconcilingCondition)
		return c != nil && c.Reason == migrationv1alpha1.WaitingForStorageVersionReason &&
			!slices.ContainsFunc(want, func(w string) bool { return !strings.Contains(c.Message, w) })
	})
}
