package bench

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/testenv"
)

// sizes are the object counts BenchmarkCompare runs at:
// RESTOW_BENCH_SIZES (comma-separated), by default 1,000 and 10,000.
func sizes(b *testing.B) []int {
	spec := os.Getenv("RESTOW_BENCH_SIZES")
	if spec == "" {
		return []int{1000, 10000}
	}
	var out []int
	for _, s := range strings.Split(spec, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			b.Fatalf("RESTOW_BENCH_SIZES: %q is not a positive number", s)
		}
		out = append(out, n)
	}
	return out
}

// strategy is one way to rewrite every object of a resource.
type strategy struct {
	name string
	// noop runs over objects already stored at the storage version.
	noop bool
	pass func(ctx context.Context, c *clients, gvr schema.GroupVersionResource) error
}

func strategies() []strategy {
	restow := func(concurrency int) func(ctx context.Context, c *clients, gvr schema.GroupVersionResource) error {
		return func(ctx context.Context, c *clients, gvr schema.GroupVersionResource) error {
			target, err := c.migrator.Resolve(ctx, gvr.GroupResource())
			if err != nil {
				return err
			}
			result, err := c.migrator.Rewrite(ctx, target, migrator.Options{Concurrency: concurrency}, nil)
			if err == nil && result.Failed > 0 {
				err = fmt.Errorf("%d objects failed: %+v", result.Failed, result.Failures)
			}
			return err
		}
	}
	return []strategy{
		{name: "restow", pass: restow(0)},
		{name: "restow-c32", pass: restow(32)},
		{name: "restow-c64", pass: restow(64)},
		{name: "restow-noop", noop: true, pass: restow(0)},
		{name: "bare-patch-c16", pass: barePatchLoop(migrator.DefaultConcurrency)},
		{name: "bare-patch-c64", pass: barePatchLoop(64)},
		{name: "sequential-patch", pass: sequentialPatch},
		{name: "sequential-put", pass: sequentialPut},
	}
}

// clients reach the control plane through a transport that counts requests.
type clients struct {
	requests atomic.Int64
	migrator *migrator.Migrator
	metadata metadata.Interface
	dynamic  dynamic.Interface
}

type countingTransport struct {
	rt http.RoundTripper
	n  *atomic.Int64
}

func (t countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	t.n.Add(1)
	return t.rt.RoundTrip(r)
}

func newClients(b *testing.B) *clients {
	c := &clients{}
	cfg := rest.CopyConfig(env.Config)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return countingTransport{rt: rt, n: &c.requests} }
	var err error
	if c.metadata, err = metadata.NewForConfig(cfg); err != nil {
		b.Fatal(err)
	}
	if c.dynamic, err = dynamic.NewForConfig(cfg); err != nil {
		b.Fatal(err)
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		b.Fatal(err)
	}
	mapper, err := apiutil.NewDynamicRESTMapper(cfg, hc)
	if err != nil {
		b.Fatal(err)
	}
	c.migrator = &migrator.Migrator{Client: env.Client, Reader: env.Client, Metadata: c.metadata, Discovery: disco, Mapper: mapper}
	return c
}

// noopPatch is the rewrite every strategy but the PUT sends: a merge patch
// that changes nothing but carries the resourceVersion read, so a concurrent
// writer's change is never overwritten.
func noopPatch(resourceVersion string) []byte {
	return fmt.Appendf(nil, `{"metadata":{"resourceVersion":%q}}`, resourceVersion)
}

// patchOne patches one object; a conflict means someone else rewrote it.
func patchOne(ctx context.Context, c *clients, gvr schema.GroupVersionResource, obj metav1.PartialObjectMetadata) error {
	_, err := c.metadata.Resource(gvr).Namespace(obj.Namespace).Patch(ctx, obj.Name, types.MergePatchType, noopPatch(obj.ResourceVersion), metav1.PatchOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// eachMetadataPage lists the resource as metadata in pages of 500.
func eachMetadataPage(ctx context.Context, c *clients, gvr schema.GroupVersionResource, fn func([]metav1.PartialObjectMetadata) error) error {
	token := ""
	for {
		list, err := c.metadata.Resource(gvr).List(ctx, metav1.ListOptions{Limit: migrator.DefaultPageSize, Continue: token})
		if err != nil {
			return err
		}
		if err := fn(list.Items); err != nil {
			return err
		}
		if token = list.Continue; token == "" {
			return nil
		}
	}
}

// sequentialPatch is how cluster-api's CRD migrator and the in-tree storage
// version migration controller work: a metadata list, then one
// resourceVersion-guarded merge patch after another.
func sequentialPatch(ctx context.Context, c *clients, gvr schema.GroupVersionResource) error {
	return eachMetadataPage(ctx, c, gvr, func(items []metav1.PartialObjectMetadata) error {
		for _, obj := range items {
			if err := patchOne(ctx, c, gvr, obj); err != nil {
				return err
			}
		}
		return nil
	})
}

// sequentialPut is how kube-storage-version-migrator works: a list of full
// objects, then a PUT of each, unchanged, one after another.
func sequentialPut(ctx context.Context, c *clients, gvr schema.GroupVersionResource) error {
	token := ""
	for {
		list, err := c.dynamic.Resource(gvr).List(ctx, metav1.ListOptions{Limit: migrator.DefaultPageSize, Continue: token})
		if err != nil {
			return err
		}
		for i := range list.Items {
			obj := &list.Items[i]
			_, err := c.dynamic.Resource(gvr).Namespace(obj.GetNamespace()).Update(ctx, obj, metav1.UpdateOptions{})
			if err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				return err
			}
		}
		if token = list.GetContinue(); token == "" {
			return nil
		}
	}
}

// barePatchLoop is the practical limit of the API server: the same no-op
// patches from a bounded pool of workers, with no bookkeeping at all.
func barePatchLoop(workers int) func(ctx context.Context, c *clients, gvr schema.GroupVersionResource) error {
	return func(ctx context.Context, c *clients, gvr schema.GroupVersionResource) error {
		ctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		work := make(chan metav1.PartialObjectMetadata, workers)
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for obj := range work {
					if err := patchOne(ctx, c, gvr, obj); err != nil {
						cancel(err)
					}
				}
			})
		}
		err := eachMetadataPage(ctx, c, gvr, func(items []metav1.PartialObjectMetadata) error {
			for _, obj := range items {
				select {
				case work <- obj:
				case <-ctx.Done():
					return context.Cause(ctx)
				}
			}
			return nil
		})
		close(work)
		wg.Wait()
		if err != nil {
			return err
		}
		return context.Cause(ctx)
	}
}

// BenchmarkCompare times restow's pass against the baselines on the same API
// server, each over the same n objects of about 1 KiB in 10 namespaces, and
// checks in etcd after every run that all are stored at the new version.
// Besides time per pass it reports objects/s, API requests per object, the
// kube-apiserver process's CPU time per object (from /proc) and the peak heap
// growth of this process, which does the work.
func BenchmarkCompare(b *testing.B) {
	for _, n := range sizes(b) {
		b.Run(fmt.Sprintf("objects=%d", n), func(b *testing.B) {
			f := newCompareFixture(b, n)
			for _, s := range strategies() {
				b.Run(s.name, func(b *testing.B) { f.run(b, s) })
			}
		})
	}
}

type compareFixture struct {
	n       int
	group   string
	crdName string
	clients *clients
	// storage is the current storage version.
	storage string
}

func newCompareFixture(b *testing.B, n int) *compareFixture {
	group := fmt.Sprintf("n%d.compare.bench.restow.dev", n)
	crd := testenv.NewCRD(group, "Blob", "blobs", apiextensionsv1.NamespaceScoped,
		testenv.CRDVersion{Name: "v1beta1", Served: true, Storage: true},
		testenv.CRDVersion{Name: "v1", Served: true})
	env.InstallCRDForTest(b, crd)
	createObjects(b, group, n)
	return &compareFixture{n: n, group: group, crdName: crd.Name, clients: newClients(b), storage: "v1beta1"}
}

func (f *compareFixture) gvr() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: f.group, Version: f.storage, Resource: "blobs"}
}

// switchStorage makes the other version the storage version, so the next
// pass must re-encode every object.
func (f *compareFixture) switchStorage(b *testing.B) {
	next := map[string]string{"v1beta1": "v1", "v1": "v1beta1"}[f.storage]
	if err := env.SetStorageVersion(b.Context(), f.crdName, next); err != nil {
		b.Fatal(err)
	}
	f.storage = next
}

func (f *compareFixture) run(b *testing.B, s strategy) {
	ctx := b.Context()
	var requests int64
	var apiserverCPU time.Duration
	var peakGrowth uint64
	for b.Loop() {
		b.StopTimer()
		if s.noop {
			// Objects are at the storage version already: make sure of it.
			f.assertStored(b)
		} else {
			f.switchStorage(b)
		}
		runtime.GC()
		sampler := startHeapSampler()
		f.clients.requests.Store(0)
		cpuBefore, err := env.APIServerCPU()
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		err = s.pass(ctx, f.clients, f.gvr())
		b.StopTimer()
		cpuAfter, cpuErr := env.APIServerCPU()
		peakGrowth = max(peakGrowth, sampler.stop())
		if err != nil || cpuErr != nil {
			b.Fatalf("%s: %v %v", s.name, err, cpuErr)
		}
		requests += f.clients.requests.Load()
		apiserverCPU += cpuAfter - cpuBefore
		f.assertStored(b)
		b.StartTimer()
	}
	b.StopTimer()
	objects := float64(f.n) * float64(b.N)
	b.ReportMetric(objects/b.Elapsed().Seconds(), "objects/s")
	b.ReportMetric(float64(requests)/objects, "requests/object")
	b.ReportMetric(float64(apiserverCPU.Microseconds())/1000/objects, "apiserver-cpu-ms/object")
	b.ReportMetric(float64(peakGrowth)/(1<<20), "peak-heap-growth-MiB")
}

// assertStored checks in etcd that every object is stored at the storage version.
func (f *compareFixture) assertStored(b *testing.B) {
	counts, err := env.StoredVersions(b.Context(), f.group, "blobs")
	if err != nil {
		b.Fatal(err)
	}
	if counts[f.group+"/"+f.storage] != f.n || len(counts) != 1 {
		b.Fatalf("etcd holds %v, want all %d at %s", counts, f.n, f.storage)
	}
}
