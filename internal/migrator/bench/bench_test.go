// Package bench measures migration passes on the source-built control plane:
// throughput and the heap a pass grows, which must stay flat in the number of
// objects. Run with `make bench`.
package bench

import (
	"fmt"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	testenv.Main(m, testenv.Options{}, &env)
}

// BenchmarkPass times full passes over n objects of about 1 KiB each, spread
// over 10 namespaces. Each iteration switches the storage version (v1beta1
// and v1 in turn), so every pass re-encodes every object.
func BenchmarkPass(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("objects=%d", n), func(b *testing.B) { benchmarkPass(b, n) })
	}
}

func benchmarkPass(b *testing.B, n int) {
	ctx := b.Context()
	group := fmt.Sprintf("n%d.bench.restow.dev", n)
	crd := testenv.NewCRD(group, "Blob", "blobs", apiextensionsv1.NamespaceScoped,
		testenv.CRDVersion{Name: "v1beta1", Served: true, Storage: true},
		testenv.CRDVersion{Name: "v1", Served: true})
	env.InstallCRDForTest(b, crd)
	createObjects(b, group, n)

	m := newClients(b).migrator

	versions := []string{"v1", "v1beta1"}
	var peakGrowth uint64
	var migrated int64
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		if err := env.SetStorageVersion(ctx, crd.Name, versions[i%2]); err != nil {
			b.Fatal(err)
		}
		target, err := m.Resolve(ctx, schema.GroupResource{Group: group, Resource: "blobs"})
		if err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		sampler := startHeapSampler()
		b.StartTimer()
		result, err := m.Rewrite(ctx, target, migrator.Options{}, nil)
		b.StopTimer()
		peakGrowth = max(peakGrowth, sampler.stop())
		if err != nil || result.Failed > 0 || result.Listed != int64(n) {
			b.Fatalf("pass: %+v, %v", result.Counts, err)
		}
		migrated += result.Migrated
		b.StartTimer()
	}
	b.StopTimer()
	counts, err := env.StoredVersions(ctx, group, "blobs")
	if err != nil {
		b.Fatal(err)
	}
	if counts[group+"/"+versions[(b.N-1)%2]] != n {
		b.Fatalf("etcd holds %v after the last pass", counts)
	}
	b.ReportMetric(float64(migrated)/b.Elapsed().Seconds(), "objects/s")
	b.ReportMetric(float64(peakGrowth)/(1<<20), "peak-heap-growth-MiB")
}

// heapSampler records the largest live heap above the level at its start.
type heapSampler struct {
	base, peak atomic.Uint64
	done       chan struct{}
	wg         sync.WaitGroup
}

func heapBytes() uint64 {
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(sample)
	return sample[0].Value.Uint64()
}

func startHeapSampler() *heapSampler {
	s := &heapSampler{done: make(chan struct{})}
	s.base.Store(heapBytes())
	s.wg.Go(func() {
		ticker := time.NewTicker(5 * time.Millisecond)
		defer ticker.Stop()
		for {
			select {
			case <-s.done:
				return
			case <-ticker.C:
				if h := heapBytes(); h > s.peak.Load() {
					s.peak.Store(h)
				}
			}
		}
	})
	return s
}

func (s *heapSampler) stop() uint64 {
	close(s.done)
	s.wg.Wait()
	if s.peak.Load() < s.base.Load() {
		return 0
	}
	return s.peak.Load() - s.base.Load()
}

func createObjects(b *testing.B, group string, n int) {
	b.Helper()
	ctx := b.Context()
	namespaces := make([]string, 10)
	for i := range namespaces {
		namespaces[i] = fmt.Sprintf("bench-%d", i)
	}
	if err := env.EnsureNamespaces(ctx, namespaces...); err != nil {
		b.Fatal(err)
	}
	payload := strings.Repeat("x", 1024)
	err := env.CreateObjects(ctx, n, func(i int) client.Object {
		u := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"payload": payload}}}
		u.SetGroupVersionKind(schema.GroupVersionKind{Group: group, Version: "v1beta1", Kind: "Blob"})
		u.SetNamespace(namespaces[i%len(namespaces)])
		u.SetName(fmt.Sprintf("blob-%06d", i))
		return u
	})
	if err != nil {
		b.Fatal(err)
	}
}
