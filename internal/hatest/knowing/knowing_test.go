// Package knowing: restow reads each API server's own discovery at its
// address, and starts when every one shows the switch (hatest).
package knowing

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/restow/restow/internal/hatest"
	"github.com/restow/restow/internal/testenv"
)

func TestMain(m *testing.M) { hatest.Main(m) }

// TestMigrateKnowingEachAPIServer: two API servers on addresses of their
// own, each published in default/kubernetes's EndpointSlices with a serving
// certificate for the kubernetes Service's name, one seeing the storage
// switch late. restow reads each server's own discovery at its address and
// starts the first pass once both show the target's storageVersionHash:
// after the lag, before the lag bound when the lag is shorter, and held
// back past the bound while the server still lags, up to the lag limit,
// where `kubectl restow run` exits 2 with nothing written or pruned. No
// case prunes early (read from etcd throughout).
func TestMigrateKnowingEachAPIServer(t *testing.T) {
	ha := testenv.Start(t, testenv.Options{APIServers: 2, OwnAddresses: true, LaggingAPIServer: true,
		APIServerArgs: map[string]string{"goaway-chance": "0.02"}})
	ha.WaitForSignals(t, 2, 2)
	// The lagging server is the last one.
	lagging := strings.TrimPrefix(ha.ServerConfig(1).Host, "https://")
	// 8 s: on a busy machine, the first server's own discovery shows the
	// switch 3 s after it here, alone on the machine, and the pass must
	// begin while the other still lags.
	t.Run("8s late", func(t *testing.T) {
		hatest.MigrateBehindLag(t, ha, hatest.LagCase{
			Group: "late8.hatest.restow.dev", Lag: 8 * time.Second, LagBound: 30 * time.Second,
			Servers: 2, Addresses: 2, Knows: true, Says: []string{lagging + " stores at v1beta1 (since"},
		})
	})
	t.Run("45s late, past the bound", func(t *testing.T) {
		hatest.MigrateBehindLag(t, ha, hatest.LagCase{
			Group: "late45.hatest.restow.dev", N: 1000, Lag: 45 * time.Second, LagBound: 10 * time.Second, LagLimit: 5 * time.Minute,
			Servers: 2, Addresses: 2, Knows: true, Says: []string{lagging + " stores at v1beta1 (since", "past the lag bound of 10s"},
		})
	})
	t.Run("a server restarting mid-pass", func(t *testing.T) {
		hatest.MigrateBehindLag(t, ha, hatest.LagCase{
			Group: "restart.hatest.restow.dev", Lag: 4 * time.Second, LagBound: 30 * time.Second,
			Servers: 2, Addresses: 2, Knows: true,
			MidPass: func(ctx context.Context) error { return ha.RestartOwnAPIServer(ctx, 1) },
		})
	})
	t.Run("a watch cache behind etcd", func(t *testing.T) {
		hatest.MigrateBehindLaggingCache(t, ha, "cache.hatest.restow.dev")
	})
	// Last: the lagging server's held watch events outlast the test. As
	// users meet it: kubectl restow run, which exits 2.
	t.Run("past the lag limit", func(t *testing.T) {
		hatest.MigrateBehindLag(t, ha, hatest.LagCase{
			Group: "limit.hatest.restow.dev", N: 300, Lag: 40 * time.Second, LagBound: 2 * time.Second, LagLimit: 8 * time.Second,
			Servers: 2, Addresses: 2, Stalled: true, Says: []string{lagging + " stores at v1beta1 (since"},
		})
	})
}
