package migrator_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/testenv"
)

// TestMigrateBehindLaggingAPIServer: the one promise on a control plane of
// three API servers on one etcd behind a round-robin balancer, connections
// moving between them (GOAWAY), one of them seeing the storage switch late.
// That server answers a write of an unchanged object still stored at v1beta1
// with "unchanged" (TestSeveralAPIServersOneLagging), so a migration that
// took its answers as proof would prune while etcd still holds v1beta1
// objects. The migration waits for the lag bound before its first page:
// nothing is pruned early (read from etcd throughout), and it still ends
// with every object at v1 and storedVersions [v1]. Without the wait (the lag
// bound of a single API server), this test finds early prunes.
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
			migrateBehindLag(t, ha, fmt.Sprintf("ha%d.migrator.restow.dev", i), tc.lag, tc.endsAfter, lagBound, 3)
		})
	}
}

// TestMigrateBehindServersSharingAHostName: two API servers on addresses of
// their own that share a host name, and so one identity Lease, one of them
// seeing the storage switch 4 s late. Counted by their Leases alone, they
// were one server: no wait, and a prune while etcd held objects at v1beta1
// (1,339 of 3,000 when it was measured). Each publishes its address in the
// default/kubernetes Service's EndpointSlices, so restow counts two, waits
// for the lag bound, and prunes nothing early.
func TestMigrateBehindServersSharingAHostName(t *testing.T) {
	ha := testenv.Start(t, testenv.Options{APIServers: 2, OwnAddresses: true, SharedHostName: true, LaggingAPIServer: true,
		APIServerArgs: map[string]string{"goaway-chance": "0.02"}})
	waitForSignals(t, ha, 1, 2)
	migrateBehindLag(t, ha, "hostname.migrator.restow.dev", 4*time.Second, 0, 10*time.Second, 2)
}

// waitForSignals waits until the control plane's identity Leases and the
// addresses in default/kubernetes's EndpointSlices are as many as given.
func waitForSignals(t *testing.T, ha *testenv.Env, leases, addresses int) {
	t.Helper()
	testenv.WaitProgress(t, "the API servers' Leases and addresses", time.Minute, func(ctx context.Context) (bool, string, error) {
		hostnames, listed, err := ha.APIServerSignals(ctx)
		return len(hostnames) == leases && len(listed) == addresses, fmt.Sprintf("identity Leases of %v, addresses %v", hostnames, listed), err
	})
}

// migrateBehindLag migrates n objects of a new CRD while one API server of
// ha sees the storage switch lag late (until endsAfter after it, if set),
// with the lag bound lagBound, and checks that restow counted servers API
// servers, waited for the bound, pruned nothing early (read from etcd
// throughout) and ended with every object at v1 and storedVersions [v1].
func migrateBehindLag(t *testing.T, ha *testenv.Env, group string, lag, endsAfter, lagBound time.Duration, servers int) {
	const n = 3000
	ctx := testenv.Context(t, 5*time.Minute)
	fx := testenv.Fixture{Env: ha, Group: group, Kind: "Widget", Plural: "widgets", Namespaced: true}
	fx.Install(t, "v1beta1", "v1")
	fx.CreateObjects(t, "v1beta1", n, func(i int) map[string]any { return map[string]any{"n": int64(i)} }, "ha-0", "ha-1")
	observer := ha.ObservePrunes(t, fx.Group, fx.Plural, 20*time.Millisecond)

	ha.SetWatchLag(lag)
	t.Cleanup(func() { ha.SetWatchLag(0) })
	fx.SwitchStorage(t, "v1")
	if endsAfter > 0 {
		end := time.AfterFunc(endsAfter, func() { ha.SetWatchLag(0) })
		t.Cleanup(func() { end.Stop() })
	}

	m, err := migrator.NewForConfig(ha.Config, ha.Client)
	if err != nil {
		t.Fatal(err)
	}
	m.LagBound = lagBound
	// The readiness gate waits while its discovery read reaches the
	// lagging server, as the controller's would.
	var target migrator.Target
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		target, err = m.Resolve(ctx, schema.GroupResource{Group: fx.Group, Resource: fx.Plural})
		var waiting *migrator.WaitError
		if errors.As(err, &waiting) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Resolve: %d API servers (%s), waits %s", target.APIServers, target.APIServerSignals, target.LagWait)
	if target.APIServers != servers || target.LagWait != lagBound {
		t.Fatalf("Resolve counted %d API servers (%s) and waits %s, want %d and the lag bound %s", target.APIServers, target.APIServerSignals, target.LagWait, servers, lagBound)
	}
	start := time.Now()
	var firstPage time.Time
	result, err := m.Migrate(ctx, target, migrator.Options{Prune: true, SettleWindow: 5 * time.Second}, func(p migrator.Progress) {
		if firstPage.IsZero() && p.Done() > 0 {
			firstPage = time.Now()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	observer.AssertNoEarlyPrune(t, true)
	if !slices.Equal(result.Pruned, []string{"v1beta1"}) || result.Failed != 0 {
		t.Errorf("result = %+v, want v1beta1 pruned and no failure", result)
	}
	if waited := firstPage.Sub(start); waited < lagBound-time.Second {
		t.Errorf("the first page was done %s after the migration began, before the lag bound of %s", waited, lagBound)
	}
	fx.AssertAllStoredAt(t, "v1", n)
	fx.AssertStoredVersions(t, "v1")
}

// TestResolveCountsAPIServers: one API server (the package's control plane)
// waits only a moment before the first pass; told to assume several, the
// lag bound.
func TestResolveCountsAPIServers(t *testing.T) {
	fx := switched(t, "count.migrator.restow.dev", 1)
	m, _ := newMigrator(t)
	m.LagBound = time.Minute
	target := resolve(t, m, fx)
	if target.APIServers != 1 || target.LagWait > time.Second {
		t.Errorf("one API server: counted %d, waits %s; want 1 and at most a second", target.APIServers, target.LagWait)
	}
	m.AssumeSeveral = true
	target = resolve(t, m, fx)
	if target.APIServers != 0 || target.LagWait != time.Minute || target.APIServerSignals == "" {
		t.Errorf("assuming several: counted %d, waits %s (%q); want none counted, the lag bound, and why", target.APIServers, target.LagWait, target.APIServerSignals)
	}
}
