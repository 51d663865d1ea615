package testenv

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// PruneObserver watches over the one promise of a migration: whenever a
// CRD's status.storedVersions lists a single version, etcd holds every
// object of the resource at that version.
type PruneObserver struct {
	stop func()

	mu sync.Mutex
	// early records each sample that broke the promise.
	early []string
	// samples counts the samples taken while storedVersions listed one version.
	samples int
}

// ObservePrunes polls the CRD of group and resource every interval until the
// test ends or Stop is called. A sample counts only if the CRD did not change
// while etcd was read: a storage switch in between lets writers store at the
// new version before storedVersions lists it.
func (e *Env) ObservePrunes(t testing.TB, group, resource string, interval time.Duration) *PruneObserver {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	o := &PruneObserver{}
	var once sync.Once
	o.stop = func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
	t.Cleanup(o.stop)
	name := resource + "." + group
	go func() {
		defer close(done)
		_ = wait.PollUntilContextCancel(ctx, interval, true, func(ctx context.Context) (bool, error) {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			if err := e.Client.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil || len(crd.Status.StoredVersions) != 1 {
				return false, nil // keep observing through API server restarts
			}
			only := group + "/" + crd.Status.StoredVersions[0]
			counts, err := e.StoredVersions(ctx, group, resource)
			if err != nil {
				return false, nil // keep observing; etcd errors here are the test's own
			}
			after := &apiextensionsv1.CustomResourceDefinition{}
			if err := e.Client.Get(ctx, client.ObjectKey{Name: name}, after); err != nil || after.ResourceVersion != crd.ResourceVersion {
				return false, nil // a changed or unreadable CRD: take the next sample
			}
			o.mu.Lock()
			defer o.mu.Unlock()
			o.samples++
			for version, n := range counts {
				if version != only && n > 0 {
					o.early = append(o.early, fmt.Sprintf("storedVersions %v while etcd held %v", crd.Status.StoredVersions, counts))
					break
				}
			}
			return false, nil
		})
	}()
	return o
}

// Stop ends the observation and waits for the last sample.
func (o *PruneObserver) Stop() { o.stop() }

// EarlyPrunes returns the samples that found storedVersions pruned while
// etcd still held objects at another version.
func (o *PruneObserver) EarlyPrunes() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.early...)
}

// AssertNoEarlyPrune stops the observer and fails the test if it saw a
// prune before etcd was through, or if it never saw storedVersions with a
// single version at all (when wantSamples), so it cannot pass vacuously.
func (o *PruneObserver) AssertNoEarlyPrune(t testing.TB, wantSamples bool) {
	t.Helper()
	if wantSamples {
		// The prune may have happened just now: give the observer its sample.
		_ = wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			o.mu.Lock()
			defer o.mu.Unlock()
			return o.samples > 0, nil
		})
	}
	o.Stop()
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.early) > 0 {
		t.Errorf("storedVersions was pruned while etcd held objects at another version: %v", o.early)
	}
	if wantSamples && o.samples == 0 {
		t.Error("the observer never saw storedVersions with a single version")
	}
}
