package migrator_test

// A CRD that changes during a migration: a spec change that keeps the
// storage version does not cost the migration, and a switch away and back
// ends it when it happens. Storage is read from etcd.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/storedversions"
)

// TestMigrateThroughSpecChanges: the CRD's schema description changes every
// second while a migration runs, from before its first page to after its
// prune would come, so its generation moves during the first pass, the
// settle window and the re-check. The migration ends in one go: every
// object at v1 in etcd, v1beta1 pruned. (Before the CRD's history was
// watched, any change of generation ended the migration with ErrCRDChanged.)
func TestMigrateThroughSpecChanges(t *testing.T) {
	const n = 600
	fx := switched(t, "churn.migrator.restow.dev", n)
	m, _ := newMigrator(t)
	target := resolve(t, m, fx)

	ctx, stop := context.WithCancel(t.Context())
	var changes atomic.Int64
	var churn sync.WaitGroup
	churn.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			if _, err := fx.DescribeSchema(ctx, "v1", fmt.Sprintf("change %d", i)); err == nil {
				changes.Add(1)
			} else if ctx.Err() == nil {
				t.Errorf("changing the CRD: %v", err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	})
	start := time.Now()
	result, err := m.Migrate(t.Context(), target, migrator.Options{Prune: true, SettleWindow: 3 * time.Second, Concurrency: 2, PageSize: 50}, nil)
	stop()
	churn.Wait()
	if err != nil {
		t.Fatalf("Migrate after %s and %d changes of the CRD: %v", time.Since(start).Round(time.Millisecond), changes.Load(), err)
	}
	t.Logf("one migration in %s while the CRD changed %d times (generation %d at the start, %d now)",
		time.Since(start).Round(time.Millisecond), changes.Load(), target.CRD.Generation, fx.CRD(t).Generation)
	if changes.Load() < 3 {
		t.Fatalf("the CRD changed %d times during the migration: this test shows nothing", changes.Load())
	}
	if !slices.Equal(result.Pruned, []string{"v1beta1"}) || result.Failed != 0 {
		t.Errorf("result = %+v, pruned %v; want none failed, v1beta1 pruned", result.Counts, result.Pruned)
	}
	fx.AssertAllStoredAt(t, "v1", n)
	fx.AssertStoredVersions(t, "v1")
}

// TestStorageSwitchAwayAndBackEndsTheMigration: while the first pass runs,
// after the settle window has closed (so the re-check would take writes
// from now on as made on the new storage), the CRD's storage version goes
// back to v1beta1, objects are created at it, and the storage version
// returns to v1. The migration must end when the switch away happens, with
// ErrCRDChanged, the first pass still held: had it gone on, it would have
// pruned v1beta1 with those objects stored at it. A new migration then
// stores every object at v1.
func TestStorageSwitchAwayAndBackEndsTheMigration(t *testing.T) {
	const n, away = 400, 20
	fx := switched(t, "awayandback.migrator.restow.dev", n)
	// Writes pass one at a time until the gate is armed; then the next one
	// waits until the gate opens.
	var armed atomic.Bool
	held, release := make(chan struct{}), make(chan struct{})
	var holdOnce sync.Once
	cfg := rest.CopyConfig(env.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if (req.Method == http.MethodPut || req.Method == http.MethodPatch) && armed.Load() {
				holdOnce.Do(func() { close(held) })
				select {
				case <-release:
				case <-req.Context().Done():
					return nil, req.Context().Err()
				}
			}
			return rt.RoundTrip(req)
		})
	})
	m, _ := newMigratorFor(t, cfg)
	target := resolve(t, m, fx)

	var windowClosed atomic.Bool
	type ended struct {
		result migrator.Result
		err    error
		at     time.Time
	}
	done := make(chan ended, 1)
	go func() {
		result, err := m.Migrate(t.Context(), target, migrator.Options{Prune: true, SettleWindow: time.Second, Concurrency: 1, PageSize: 20}, func(p migrator.Progress) {
			if p.WindowEnd != "" && p.Phase == migrator.PhaseRewriting {
				windowClosed.Store(true)
			}
		})
		done <- ended{result, err, time.Now()}
	}()
	deadline := time.After(2 * time.Minute)
	for !windowClosed.Load() {
		select {
		case e := <-done:
			t.Fatalf("the migration ended before its settle window closed during the first pass (%+v, %v): this test shows nothing", e.result.Counts, e.err)
		case <-deadline:
			t.Fatal("the settle window did not close during the first pass within 2 minutes")
		case <-time.After(20 * time.Millisecond):
		}
	}
	armed.Store(true)
	select {
	case <-held:
	case e := <-done:
		t.Fatalf("the first pass ended (%+v, %v) before a write was held: this test shows nothing", e.result.Counts, e.err)
	}
	switchedAway := time.Now()
	fx.SwitchStorage(t, "v1beta1")
	for i := range away {
		if err := env.Client.Create(t.Context(), fx.Object("v1beta1", "m-0", fmt.Sprintf("away-%02d", i), map[string]any{"n": int64(i)})); err != nil {
			t.Fatal(err)
		}
	}
	fx.SwitchStorage(t, "v1")
	var e ended
	select {
	case e = <-done:
	case <-time.After(30 * time.Second):
		close(release)
		e = <-done
		t.Fatalf("the migration went on after the switch away and back: it ended only once its held write was let through, %s after the switch away, with %v and %v pruned; etcd holds %v",
			e.at.Sub(switchedAway).Round(time.Millisecond), e.err, e.result.Pruned, storedCounts(t, fx.StoredCounts))
	}
	close(release)
	if !errors.Is(e.err, storedversions.ErrCRDChanged) || !strings.Contains(e.err.Error(), "storage version became v1beta1") {
		t.Fatalf("Migrate = %v, want ErrCRDChanged naming the switch to v1beta1", e.err)
	}
	t.Logf("ended %s after the switch away, with %d of %d objects done: %v", e.at.Sub(switchedAway).Round(time.Millisecond), e.result.Done(), n, e.err)
	fx.AssertStoredVersions(t, "v1beta1", "v1")
	if got := storedCounts(t, fx.StoredCounts); got["v1beta1"] < away {
		t.Fatalf("etcd holds %v: the objects created at v1beta1 are not there, so this test shows nothing", got)
	}

	m2, _ := newMigrator(t)
	result, err := m2.Migrate(t.Context(), resolve(t, m2, fx), migrator.Options{Prune: true, SettleWindow: time.Second}, nil)
	if err != nil || !slices.Equal(result.Pruned, []string{"v1beta1"}) {
		t.Fatalf("the next migration: %+v, pruned %v, %v; want v1beta1 pruned", result.Counts, result.Pruned, err)
	}
	fx.AssertAllStoredAt(t, "v1", n+away)
	fx.AssertStoredVersions(t, "v1")
}

// storedCounts reads etcd's counts for a failure message.
func storedCounts(t *testing.T, read func(context.Context) (map[string]int, error)) map[string]int {
	t.Helper()
	got, err := read(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return got
}
