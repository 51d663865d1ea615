// Package bound: API servers restow counts but cannot all reach, so it
// waits for the lag bound, or counts by the addresses they publish (hatest).
package bound

import (
	"fmt"
	"testing"
	"time"

	"github.com/restow/restow/internal/hatest"
	"github.com/restow/restow/internal/testenv"
)

func TestMain(m *testing.M) { hatest.Main(m) }

// TestMigrateBehindLaggingAPIServer: the one promise on a control plane of
// three API servers on one etcd behind a round-robin balancer on loopback,
// connections moving between them (GOAWAY), one of them seeing the storage
// switch late. That server answers a write of an unchanged object still
// stored at v1beta1 with "unchanged" (TestSeveralAPIServersOneLagging), so a
// migration that took its answers as proof would prune while etcd still
// holds v1beta1 objects. These servers publish no address (kube-apiserver
// refuses loopback ones), so restow cannot reach each one: it waits for the
// lag bound before its first page. Nothing is pruned early (read from etcd
// throughout), and it still ends with every object at v1 and storedVersions
// [v1]. Without the wait (the lag bound of a single API server), this test
// finds early prunes.
func TestMigrateBehindLaggingAPIServer(t *testing.T) {
	ha := testenv.Start(t, testenv.Options{APIServers: 3, LaggingAPIServer: true, APIServerArgs: map[string]string{"goaway-chance": "0.02"}})
	const lagBound = 15 * time.Second
	for i, tc := range []struct {
		name string
		lag  time.Duration
		// endsAfter, when set, ends the lag that long after the switch.
		endsAfter time.Duration
	}{
		{name: "lag of 4s that lasts", lag: 4 * time.Second},
		{name: "lag of 10s that ends mid-pass", lag: 10 * time.Second, endsAfter: lagBound + 2*time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hatest.MigrateBehindLag(t, ha, hatest.LagCase{
				Group: fmt.Sprintf("ha%d.migrator.restow.dev", i), Lag: tc.lag, EndsAfter: tc.endsAfter,
				LagBound: lagBound, Servers: 3, Addresses: 0,
			})
		})
	}
}

// TestMigrateBehindServersSharingAHostName: two API servers on addresses of
// their own that share a host name, and so one identity Lease, one of them
// seeing the storage switch 4 s late. Counted by their Leases alone, they
// were one server: no wait, and a prune while etcd held objects at v1beta1
// (1,339 of 3,000 when it was measured). Each publishes its address in the
// default/kubernetes Service's EndpointSlices, so restow counts two, reads
// each one's discovery, and starts once both show the switch: after the
// lag, long before the bound. Nothing is pruned early.
func TestMigrateBehindServersSharingAHostName(t *testing.T) {
	ha := testenv.Start(t, testenv.Options{APIServers: 2, OwnAddresses: true, SharedHostName: true, LaggingAPIServer: true,
		APIServerArgs: map[string]string{"goaway-chance": "0.02"}})
	ha.WaitForSignals(t, 1, 2)
	hatest.MigrateBehindLag(t, ha, hatest.LagCase{
		Group: "hostname.migrator.restow.dev", Lag: 4 * time.Second, LagBound: 30 * time.Second,
		Servers: 2, Addresses: 2, Knows: true,
	})
}

// TestMigrateBehindAServerWithoutAnAddress: two API servers on addresses of
// their own, the lagging one publishing none (--endpoint-reconciler-type=
// none), as a server restow cannot reach directly. restow counts two by
// their identity Leases and has one address: it cannot see the second
// server switch, so it relies on the lag bound and says which server count
// it could not reach. Reading the one server it can reach and starting
// when that one shows the switch prunes while the other still stores
// objects at v1beta1.
func TestMigrateBehindAServerWithoutAnAddress(t *testing.T) {
	ha := testenv.Start(t, testenv.Options{APIServers: 2, OwnAddresses: true, UnpublishedAPIServer: true, LaggingAPIServer: true,
		APIServerArgs: map[string]string{"goaway-chance": "0.02"}})
	ha.WaitForSignals(t, 2, 1)
	hatest.MigrateBehindLag(t, ha, hatest.LagCase{
		Group: "unlisted.hatest.restow.dev", Lag: 12 * time.Second, LagBound: 15 * time.Second,
		Servers: 2, Addresses: 1, Says: []string{"2 API servers counted, 1 of them at an address in default/kubernetes's EndpointSlices"},
	})
}
