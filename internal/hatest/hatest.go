// Package hatest runs the migration engine on control planes of several
// kube-apiservers on one etcd, one of them seeing the storage switch late:
// behind a balancer on loopback (no address of their own to reach them at),
// and each on an address of its own in a network namespace, published in
// the default/kubernetes Service's endpoints as a production control
// plane's are. This package holds the case and its checks; the tests are
// in two packages of their own, so that each runs beside the others rather
// than inside their time: knowing (restow reads each server) and bound
// (restow counts servers it cannot reach and waits for the lag bound).
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
	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/testenv"
)

// Main runs a test package of these cases.
func Main(m *testing.M) {
	// Without a logger, controller-runtime prints a stack trace after 30 s.
	ctrllog.SetLogger(logr.Discard())
	os.Exit(m.Run())
}

// LagCase is one migration behind a lagging API server.
type LagCase struct {
	Group string
	// N objects; 3,000 when zero.
	N int
	// Lag is how late the lagging server sees the switch; EndsAfter, when
	// set, ends the lag that long after the switch.
	Lag, EndsAfter time.Duration
	// LagBound and LagLimit set the Migrator's.
	LagBound, LagLimit time.Duration
	// Servers and Addresses are what Resolve must count, and find to
	// reach the servers at.
	Servers, Addresses int
	// Knows: the first pass must start once every server showed the
	// switch in its own discovery (after the lag, before the bound when
	// the lag is shorter); otherwise it must rely on the bound.
	Knows bool
	// Says are what one of the messages the pass showed while it waited
	// for the servers must each hold.
	Says []string
	// MidPass runs once the first objects are done.
	MidPass func(ctx context.Context) error
	// Stalled: the lag outlasts LagLimit, and the migration, run as
	// `kubectl restow run`, must stop with exit 2, naming the server, with
	// nothing written or pruned.
	Stalled bool
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

// MigrateBehindLag migrates the objects of a new CRD while one API server
// of ha sees the storage switch tc.Lag late, and checks what tc says: how
// many API servers restow counted and could reach, when its first pass
// started, what it said while it waited, that it pruned nothing early (read
// from etcd throughout) and that it ended with every object at v1 and
// storedVersions [v1], or, run as `kubectl restow run`, exited 2 with
// nothing written or pruned.
func MigrateBehindLag(t *testing.T, ha *testenv.Env, tc LagCase) {
	n := tc.N
	if n == 0 {
		n = 3000
	}
	ctx := testenv.Context(t, 5*time.Minute)
	fx := testenv.Fixture{Env: ha, Group: tc.Group, Kind: "Widget", Plural: "widgets", Namespaced: true}
	fx.Install(t, "v1beta1", "v1")
	fx.CreateObjects(t, "v1beta1", n, func(i int) map[string]any { return map[string]any{"n": int64(i)} }, "ha-0", "ha-1")
	observer := ha.ObservePrunes(t, fx.Group, fx.Plural, 20*time.Millisecond)

	ha.SetWatchLag(tc.Lag)
	// Deferred, not a cleanup: it waits on the test's context.
	defer waitCaughtUp(t, ha, fx)
	// Taken before the update: the lagging server sees it Lag after etcd
	// committed it, which is after this and may be before the update's
	// answer came back (a run measured the first page 2 ms "early" when
	// this was taken after).
	switched := time.Now()
	fx.SwitchStorage(t, "v1")
	if tc.EndsAfter > 0 {
		end := time.AfterFunc(tc.EndsAfter, func() { ha.SetWatchLag(0) })
		t.Cleanup(func() { end.Stop() })
	}
	if tc.Stalled {
		stalledThroughPlugin(t, ha, tc, fx, observer, n)
		return
	}
	m, target := resolveBehindLag(ctx, t, ha, tc, fx)
	run := migrateBehindLag(ctx, t, m, target, tc)
	if run.err != nil {
		t.Fatal(run.err)
	}
	observer.AssertNoEarlyPrune(t, true)
	if !slices.Equal(run.result.Pruned, []string{"v1beta1"}) || run.result.Failed != 0 {
		t.Errorf("result = %+v, want v1beta1 pruned and no failure", run.result)
	}
	assertFirstPage(t, tc, run.firstPage.Sub(switched), run.firstPage.Sub(run.start))
	fx.AssertAllStoredAt(t, "v1", n)
	fx.AssertStoredVersions(t, "v1")
}

// resolveBehindLag resolves fx's resource once the readiness gate passes,
// through the balancer or, for a case in which restow reads each server,
// through the first server, and checks what Resolve counted.
func resolveBehindLag(ctx context.Context, t *testing.T, ha *testenv.Env, tc LagCase, fx testenv.Fixture) (*migrator.Migrator, migrator.Target) {
	t.Helper()
	// restow's connection, behind the balancer, lands on one server and
	// stays there (HTTP/2) until a GOAWAY moves it. On the lagging server,
	// the readiness gate's discovery read holds Resolve until the lag ends,
	// as the controller's would, and the per-server wait a case that knows
	// each server checks never happens. A case in which restow reads each
	// server talks to the first, which has switched: its gate passes at
	// once, and only the reads of each server at its own address can hold
	// the first pass.
	config := ha.Config
	if tc.Knows {
		config = ha.ServerConfig(0)
	}
	m, err := migrator.NewForConfig(config, ha.Client)
	if err != nil {
		t.Fatal(err)
	}
	m.LagBound, m.LagLimit = tc.LagBound, tc.LagLimit
	target := resolveOnceReady(ctx, t, m, fx)
	t.Logf("Resolve: %d API servers (%s) at %v, waits at most %s", target.APIServers, target.APIServerSignals, target.APIServerAddresses, target.LagWait)
	if target.APIServers != tc.Servers || len(target.APIServerAddresses) != tc.Addresses || target.LagWait != tc.LagBound {
		t.Fatalf("Resolve counted %d API servers (%s) at %v and waits at most %s; want %d, %d addresses and the lag bound %s",
			target.APIServers, target.APIServerSignals, target.APIServerAddresses, target.LagWait, tc.Servers, tc.Addresses, tc.LagBound)
	}
	return m, target
}

// resolveOnceReady resolves fx's resource with m, looking again every
// 100 ms while Resolve says to wait, for up to a minute.
func resolveOnceReady(ctx context.Context, t *testing.T, m *migrator.Migrator, fx testenv.Fixture) migrator.Target {
	t.Helper()
	var target migrator.Target
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
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
	return target
}

// lagRun is what one migration behind a lagging server did.
type lagRun struct {
	result           migrator.Result
	err              error
	start, firstPage time.Time
}

// migrateBehindLag migrates target, runs tc.MidPass once the first objects
// are done, and checks that what the pass said while it waited for the
// servers holds each of tc.Says.
func migrateBehindLag(ctx context.Context, t *testing.T, m *migrator.Migrator, target migrator.Target, tc LagCase) lagRun {
	t.Helper()
	run := lagRun{start: time.Now()}
	var (
		mu      sync.Mutex
		said    []string
		midPass = make(chan error, 1)
	)
	run.result, run.err = m.Migrate(ctx, target, migrator.Options{Prune: true, SettleWindow: 5 * time.Second}, func(p migrator.Progress) {
		mu.Lock()
		defer mu.Unlock()
		if p.Switching != "" && !slices.Contains(said, p.Switching) {
			said = append(said, p.Switching)
		}
		if run.firstPage.IsZero() && p.Done() > 0 {
			run.firstPage = time.Now()
			if tc.MidPass != nil {
				go func() { midPass <- tc.MidPass(ctx) }()
			}
		}
	})
	mu.Lock()
	defer mu.Unlock()
	for _, s := range said {
		t.Logf("While it waited: %s", s)
	}
	for _, want := range tc.Says {
		if !slices.ContainsFunc(said, func(s string) bool { return strings.Contains(s, want) }) {
			t.Errorf("no message while the pass waited says %q; it said %q", want, said)
		}
	}
	if run.err == nil && tc.MidPass != nil {
		if err := <-midPass; err != nil {
			t.Fatal(err)
		}
	}
	return run
}

// assertFirstPage checks when the first page was done: after the lagging
// server switched and before the lag bound when restow reads each server
// and the lag is shorter, after the bound when it cannot.
func assertFirstPage(t *testing.T, tc LagCase, afterSwitch, afterStart time.Duration) {
	t.Helper()
	t.Logf("First page done %s after the switch, %s after the migration began", afterSwitch.Round(time.Millisecond), afterStart.Round(time.Millisecond))
	switch {
	case tc.Knows && afterSwitch < tc.Lag:
		t.Errorf("the first page was done %s after the switch, before the lagging server switched (%s)", afterSwitch, tc.Lag)
	case tc.Knows && tc.Lag+5*time.Second < tc.LagBound && afterStart >= tc.LagBound:
		t.Errorf("the first page was done %s after the migration began, past the lag bound of %s: every server showed the switch %s after it", afterStart, tc.LagBound, tc.Lag)
	case !tc.Knows && afterStart < tc.LagBound-time.Second:
		t.Errorf("the first page was done %s after the migration began, before the lag bound of %s", afterStart, tc.LagBound)
	}
}

// MigrateBehindLaggingCache migrates the objects of a new CRD with restow's
// client on the lagging API server of ha (the last), whose watch cache
// falls a minute behind etcd once the first objects are done: a list page
// there waits for that cache and is answered "Too large resource version"
// after seconds, and client-go follows its Retry-After for about 40 s.
// restow lists such pages through another server at its own address (said
// in its log), and the migration ends with every object at v1 in etcd and
// storedVersions [v1]. Without that, the same run took 95 s.
func MigrateBehindLaggingCache(t *testing.T, ha *testenv.Env, group string) {
	const n, lag = 600, time.Minute
	ctx := testenv.Context(t, 5*time.Minute)
	fx := testenv.Fixture{Env: ha, Group: group, Kind: "Widget", Plural: "widgets", Namespaced: true}
	fx.Install(t, "v1beta1", "v1")
	fx.CreateObjects(t, "v1beta1", n, func(i int) map[string]any { return map[string]any{"n": int64(i)} }, "ha-0", "ha-1")
	fx.SwitchStorage(t, "v1")
	waitCaughtUp(t, ha, fx)
	m, err := migrator.NewForConfig(ha.ServerConfig(ha.APIServers()-1), ha.Client)
	if err != nil {
		t.Fatal(err)
	}
	target := resolveOnceReady(ctx, t, m, fx)
	defer waitCaughtUp(t, ha, fx)
	var (
		mu        sync.Mutex
		elsewhere []string
		written   = make(chan error, 1)
		ahead     = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "ahead-", Namespace: "ha-0"}}
		once      sync.Once
	)
	logged := funcr.New(func(_, args string) {
		if strings.Contains(args, "Listing pages through another API server") {
			mu.Lock()
			defer mu.Unlock()
			elsewhere = append(elsewhere, args)
		}
	}, funcr.Options{Verbosity: 1})
	start := time.Now()
	result, err := m.Migrate(logr.NewContext(ctx, logged), target, migrator.Options{Prune: true, PageSize: 100, SettleWindow: 2 * time.Second}, func(p migrator.Progress) {
		if p.Done() == 0 {
			return
		}
		// The lag holds back what the cache sees from now on; the write
		// puts etcd ahead of it.
		once.Do(func() {
			ha.SetWatchLag(lag)
			go func() {
				written <- ha.Client.Create(ctx, ahead)
			}()
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-written; err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("Migrated in %s; moves to another server: %d", took.Round(time.Millisecond), len(elsewhere))
	if len(elsewhere) == 0 {
		t.Errorf("no page was listed through another API server (the migration took %s beside a cache %s behind)", took, lag)
	}
	if !slices.Equal(result.Pruned, []string{"v1beta1"}) || result.Failed != 0 {
		t.Errorf("result = %+v, want v1beta1 pruned and no failure", result)
	}
	fx.AssertAllStoredAt(t, "v1", n)
	fx.AssertStoredVersions(t, "v1")
}
