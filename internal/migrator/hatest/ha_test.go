// Package hatest runs the migration engine on control planes of several
// kube-apiservers on one etcd, one of them seeing the storage switch late:
// behind a balancer on loopback (no address of their own to reach them at),
// and each on an address of its own in a network namespace, published in
// the default/kubernetes Service's endpoints as a production control
// plane's are. Each test starts its control plane, so the package runs
// beside internal/migrator rather than inside its time.
package hatest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/testenv"
)

func TestMain(m *testing.M) {
	// Without a logger, controller-runtime prints a stack trace after 30 s.
	ctrllog.SetLogger(logr.Discard())
	os.Exit(m.Run())
}

// lagCase is one migration behind a lagging API server.
type lagCase struct {
	group string
	// n objects; 3,000 when zero.
	n int
	// lag is how late the lagging server sees the switch; endsAfter, when
	// set, ends the lag that long after the switch.
	lag, endsAfter time.Duration
	// lagBound and lagLimit set the Migrator's.
	lagBound, lagLimit time.Duration
	// servers and addresses are what Resolve must count, and find to
	// reach the servers at.
	servers, addresses int
	// knows: the first pass must start once every server showed the
	// switch in its own discovery (after the lag, before the bound when
	// the lag is shorter); otherwise it must rely on the bound.
	knows bool
	// says are what one of the messages the pass showed while it waited
	// for the servers must each hold.
	says []string
	// midPass runs once the first objects are done.
	midPass func(ctx context.Context) error
	// stalled: the lag outlasts lagLimit, and the migration must stop,
	// Stalled, naming the server, with nothing written or pruned.
	stalled bool
}

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
			migrateBehindLag(t, ha, lagCase{
				group: fmt.Sprintf("ha%d.migrator.restow.dev", i), lag: tc.lag, endsAfter: tc.endsAfter,
				lagBound: lagBound, servers: 3, addresses: 0,
			})
		})
	}
}

// TestMigrateKnowingEachAPIServer: two API servers on addresses of their
// own, each published in default/kubernetes's EndpointSlices with a serving
// certificate for the kubernetes Service's name, one seeing the storage
// switch late. restow reads each server's own discovery at its address and
// starts the first pass once both show the target's storageVersionHash:
// after the lag, before the lag bound when the lag is shorter, and held
// back past the bound while the server still lags, up to the lag limit,
// where it stops Stalled with nothing written or pruned. No case prunes
// early (read from etcd throughout).
func TestMigrateKnowingEachAPIServer(t *testing.T) {
	ha := testenv.Start(t, testenv.Options{APIServers: 2, OwnAddresses: true, LaggingAPIServer: true,
		APIServerArgs: map[string]string{"goaway-chance": "0.02"}})
	waitForSignals(t, ha, 2, 2)
	// The lagging server is the last one.
	lagging := strings.TrimPrefix(ha.ServerConfig(1).Host, "https://")
	t.Run("4s late", func(t *testing.T) {
		migrateBehindLag(t, ha, lagCase{
			group: "late4.hatest.restow.dev", lag: 4 * time.Second, lagBound: 30 * time.Second,
			servers: 2, addresses: 2, knows: true, says: []string{lagging + " stores at v1beta1 (since"},
		})
	})
	t.Run("45s late, past the bound", func(t *testing.T) {
		migrateBehindLag(t, ha, lagCase{
			group: "late45.hatest.restow.dev", n: 1000, lag: 45 * time.Second, lagBound: 10 * time.Second, lagLimit: 5 * time.Minute,
			servers: 2, addresses: 2, knows: true, says: []string{lagging + " stores at v1beta1 (since", "past the lag bound of 10s"},
		})
	})
	t.Run("a server restarting mid-pass", func(t *testing.T) {
		migrateBehindLag(t, ha, lagCase{
			group: "restart.hatest.restow.dev", lag: 4 * time.Second, lagBound: 30 * time.Second,
			servers: 2, addresses: 2, knows: true,
			midPass: func(ctx context.Context) error { return ha.RestartOwnAPIServer(ctx, 1) },
		})
	})
	// Last: the lagging server's held watch events outlast the test.
	t.Run("past the lag limit", func(t *testing.T) {
		migrateBehindLag(t, ha, lagCase{
			group: "limit.hatest.restow.dev", n: 300, lag: 40 * time.Second, lagBound: 2 * time.Second, lagLimit: 8 * time.Second,
			servers: 2, addresses: 2, stalled: true, says: []string{lagging + " stores at v1beta1 (since"},
		})
	})
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
	waitForSignals(t, ha, 1, 2)
	migrateBehindLag(t, ha, lagCase{
		group: "hostname.migrator.restow.dev", lag: 4 * time.Second, lagBound: 30 * time.Second,
		servers: 2, addresses: 2, knows: true,
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
	waitForSignals(t, ha, 2, 1)
	migrateBehindLag(t, ha, lagCase{
		group: "unlisted.hatest.restow.dev", lag: 12 * time.Second, lagBound: 15 * time.Second,
		servers: 2, addresses: 1, says: []string{"2 API servers counted, 1 of them at an address in default/kubernetes's EndpointSlices"},
	})
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

// waitCaughtUp ends the lag and waits until the lagging API server (the
// last) has seen fx's CRD as it is: the watch events it held back, such as
// the prune, are due up to the lag after they happened, and the next case's
// CRD comes after them.
func waitCaughtUp(t *testing.T, ha *testenv.Env, fx testenv.Fixture) {
	ha.SetWatchLag(0)
	lagging, err := client.New(ha.ServerConfig(ha.APIServers()-1), client.Options{Scheme: ha.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitProgress(t, "the lagging API server to catch up", time.Minute, func(ctx context.Context) (bool, string, error) {
		current, seen := &apiextensionsv1.CustomResourceDefinition{}, &apiextensionsv1.CustomResourceDefinition{}
		if err := ha.Client.Get(ctx, client.ObjectKey{Name: fx.CRDName()}, current); err != nil {
			return false, "", err
		}
		// resourceVersion 0: what its watch cache has seen.
		if err := lagging.Get(ctx, client.ObjectKey{Name: fx.CRDName()}, seen, &client.GetOptions{Raw: &metav1.GetOptions{ResourceVersion: "0"}}); err != nil {
			return false, "", err
		}
		return seen.ResourceVersion == current.ResourceVersion, fmt.Sprintf("it has seen the CRD at resourceVersion %s of %s", seen.ResourceVersion, current.ResourceVersion), nil
	})
}

// migrateBehindLag migrates the objects of a new CRD while one API server
// of ha sees the storage switch tc.lag late, and checks what tc says: how
// many API servers restow counted and could reach, when its first pass
// started, what it said while it waited, that it pruned nothing early (read
// from etcd throughout) and that it ended with every object at v1 and
// storedVersions [v1], or stopped Stalled with nothing written or pruned.
func migrateBehindLag(t *testing.T, ha *testenv.Env, tc lagCase) {
	n := tc.n
	if n == 0 {
		n = 3000
	}
	ctx := testenv.Context(t, 5*time.Minute)
	fx := testenv.Fixture{Env: ha, Group: tc.group, Kind: "Widget", Plural: "widgets", Namespaced: true}
	fx.Install(t, "v1beta1", "v1")
	fx.CreateObjects(t, "v1beta1", n, func(i int) map[string]any { return map[string]any{"n": int64(i)} }, "ha-0", "ha-1")
	observer := ha.ObservePrunes(t, fx.Group, fx.Plural, 20*time.Millisecond)

	ha.SetWatchLag(tc.lag)
	// Deferred, not a cleanup: it waits on the test's context.
	defer waitCaughtUp(t, ha, fx)
	fx.SwitchStorage(t, "v1")
	switched := time.Now()
	if tc.endsAfter > 0 {
		end := time.AfterFunc(tc.endsAfter, func() { ha.SetWatchLag(0) })
		t.Cleanup(func() { end.Stop() })
	}

	m, err := migrator.NewForConfig(ha.Config, ha.Client)
	if err != nil {
		t.Fatal(err)
	}
	m.LagBound, m.LagLimit = tc.lagBound, tc.lagLimit
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
	t.Logf("Resolve: %d API servers (%s) at %v, waits at most %s", target.APIServers, target.APIServerSignals, target.APIServerAddresses, target.LagWait)
	if target.APIServers != tc.servers || len(target.APIServerAddresses) != tc.addresses || target.LagWait != tc.lagBound {
		t.Fatalf("Resolve counted %d API servers (%s) at %v and waits at most %s; want %d, %d addresses and the lag bound %s",
			target.APIServers, target.APIServerSignals, target.APIServerAddresses, target.LagWait, tc.servers, tc.addresses, tc.lagBound)
	}

	start := time.Now()
	var (
		mu        sync.Mutex
		firstPage time.Time
		said      []string
		midPass   = make(chan error, 1)
	)
	result, err := m.Migrate(ctx, target, migrator.Options{Prune: true, SettleWindow: 5 * time.Second}, func(p migrator.Progress) {
		mu.Lock()
		defer mu.Unlock()
		if p.Switching != "" && !slices.Contains(said, p.Switching) {
			said = append(said, p.Switching)
		}
		if firstPage.IsZero() && p.Done() > 0 {
			firstPage = time.Now()
			if tc.midPass != nil {
				go func() { midPass <- tc.midPass(ctx) }()
			}
		}
	})
	mu.Lock()
	defer mu.Unlock()
	for _, s := range said {
		t.Logf("While it waited: %s", s)
	}
	for _, want := range tc.says {
		if !slices.ContainsFunc(said, func(s string) bool { return strings.Contains(s, want) }) {
			t.Errorf("no message while the pass waited says %q; it said %q", want, said)
		}
	}
	if tc.stalled {
		var stalled *migrator.StalledError
		if !errors.As(err, &stalled) || !strings.Contains(stalled.Message, "--apiserver-lag-limit") {
			t.Fatalf("Migrate = %v, want it Stalled at the lag limit", err)
		}
		t.Logf("Stalled after %s: %s", time.Since(start).Round(time.Millisecond), stalled.Message)
		if result.Done() != 0 {
			t.Errorf("%d objects were done before every API server switched", result.Done())
		}
		observer.AssertNoEarlyPrune(t, false)
		fx.AssertStored(t, map[string]int{"v1beta1": n})
		fx.AssertStoredVersions(t, "v1beta1", "v1")
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if tc.midPass != nil {
		if err := <-midPass; err != nil {
			t.Fatal(err)
		}
	}
	observer.AssertNoEarlyPrune(t, true)
	if !slices.Equal(result.Pruned, []string{"v1beta1"}) || result.Failed != 0 {
		t.Errorf("result = %+v, want v1beta1 pruned and no failure", result)
	}
	afterSwitch, afterStart := firstPage.Sub(switched), firstPage.Sub(start)
	t.Logf("First page done %s after the switch, %s after the migration began", afterSwitch.Round(time.Millisecond), afterStart.Round(time.Millisecond))
	switch {
	case tc.knows && afterSwitch < tc.lag:
		t.Errorf("the first page was done %s after the switch, before the lagging server switched (%s)", afterSwitch, tc.lag)
	case tc.knows && tc.lag+5*time.Second < tc.lagBound && afterStart >= tc.lagBound:
		t.Errorf("the first page was done %s after the migration began, past the lag bound of %s: every server showed the switch %s after it", afterStart, tc.lagBound, tc.lag)
	case !tc.knows && afterStart < tc.lagBound-time.Second:
		t.Errorf("the first page was done %s after the migration began, before the lag bound of %s", afterStart, tc.lagBound)
	}
	fx.AssertAllStoredAt(t, "v1", n)
	fx.AssertStoredVersions(t, "v1")
}
