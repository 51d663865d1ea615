package controllers_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/controllers"
)

// TestCRDThatKeepsChanging: a CRD whose spec changes every 15 s (as a
// cert-manager injector rewriting a caBundle, or a GitOps tool re-applying
// the CRD, does) while its 2,000 objects migrate with a 20 s settle window.
// The storage version never changes, so the first run finishes: Ready, every
// object at v1 in etcd, storedVersions [v1], and no run restarted for the
// CRD's sake. Before the CRD's history was watched, every change of
// generation during a run started another one, and with changes 15 s apart
// and a 20 s window none ever finished (measured: 21 runs in 6 minutes,
// nothing pruned).
func TestCRDThatKeepsChanging(t *testing.T) {
	const n, every, settle = 2000, 15 * time.Second, 20 * time.Second
	f := fixture{group: "churn.controllers.restow.dev", kind: "Widget", plural: "widgets", namespaced: true}
	f.install(t, "v1beta1", "v1")
	f.createObjects(t, n, tenNamespaces...)
	f.switchStorage(t, "v1")
	startManagerWith(t, nil, controllers.Options{SettleWindow: settle})

	ctx, stop := context.WithCancel(t.Context())
	var mu sync.Mutex
	var changes []time.Time
	var churn sync.WaitGroup
	defer churn.Wait()
	defer stop()
	churn.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-time.After(min(every, time.Duration(i+1)*5*time.Second)):
			}
			if _, err := f.fx().DescribeSchema(ctx, "v1", fmt.Sprintf("change %d", i)); err != nil {
				if ctx.Err() == nil {
					t.Errorf("changing the CRD: %v", err)
				}
				return
			}
			mu.Lock()
			changes = append(changes, time.Now())
			mu.Unlock()
		}
	})

	sm := f.createMigration(t, nil)
	restarted := func() float64 {
		return metricValue(t, "restow_passes_total", map[string]string{"resource": f.crdName(), "result": "restarted"})
	}
	var firstPassEnd time.Time
	sm = waitFor(t, sm.Name, 2*time.Minute, "Ready, or restarted", func(sm *migrationv1alpha1.StorageMigration) bool {
		if p := sm.Status.Progress; firstPassEnd.IsZero() && p != nil && p.Phase != migrationv1alpha1.PassRewriting {
			firstPassEnd = time.Now()
		}
		return sm.ReadyAt("v1") || restarted() > 0
	})
	stop()
	churn.Wait()
	if got := restarted(); got > 0 {
		t.Fatalf("the run restarted %v times for a CRD whose storage version never changed", got)
	}
	last := sm.Status.LastPass
	if last == nil || !slices.Equal(last.PrunedVersions, []string{"v1beta1"}) {
		t.Fatalf("lastPass = %+v, want v1beta1 pruned", last)
	}
	mu.Lock()
	during := 0
	for _, at := range changes {
		if at.After(last.StartTime.Time) && at.Before(last.CompletionTime.Time) {
			during++
		}
	}
	mu.Unlock()
	if during < 2 {
		t.Fatalf("the CRD changed %d times during the run (%s to %s): this test shows nothing", during, last.StartTime.Format(time.RFC3339), last.CompletionTime.Format(time.RFC3339))
	}
	// The settle window counts from the switch, so the prune comes at most
	// a window, and the re-check's one list, after the first pass.
	finish := last.CompletionTime.Sub(firstPassEnd)
	t.Logf("one run of %s, its first pass over %s before the end; %s settle window; the CRD changed %d times meanwhile, generation now %d",
		last.CompletionTime.Sub(last.StartTime.Time).Round(time.Second), finish.Round(time.Second), settle, during, f.crd(t).Generation)
	if firstPassEnd.IsZero() || finish > settle+20*time.Second {
		t.Errorf("the run ended %s after its first pass, want within the %s settle window and the re-check", finish.Round(time.Second), settle)
	}
	f.assertStored(t, "v1", n)
	f.assertStoredVersions(t, "v1")
	if got := metricValue(t, "restow_passes_total", map[string]string{"resource": f.crdName(), "result": "succeeded"}); got != 1 {
		t.Errorf("restow_passes_total{result=succeeded} = %v, want 1", got)
	}
}
