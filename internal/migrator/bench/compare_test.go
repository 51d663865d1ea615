package bench

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
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
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/operator"
	"github.com/restow/restow/internal/testenv"
)

// sizes are the object counts BenchmarkCompare runs at:
// RESTOW_BENCH_SIZES (comma-separated), by default 1,000, 10,000 and 50,000.
func sizes(b *testing.B) []int {
	spec := os.Getenv("RESTOW_BENCH_SIZES")
	if spec == "" {
		return []int{1000, 10000, 50000}
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

// sweepObjects is the object count at which the concurrency and page-size
// sweeps run; the other sizes run the main comparison only.
const sweepObjects = 10000

// strategy is one way to rewrite every object of a resource.
type strategy struct {
	name string
	// noop runs over objects already stored at the storage version.
	noop bool
	// sweep strategies run at sweepObjects only.
	sweep bool
	// series and concurrency place the strategy in the plot of objects/s
	// against concurrency; an empty series leaves it out.
	series      string
	concurrency int
	pass        func(ctx context.Context, c *clients, gvr schema.GroupVersionResource) error
	// operator, when not nil, runs cmd/manager as a process with these
	// extra flags and times its automatic migration instead of pass.
	operator []string
}

func strategies() []strategy {
	restow := func(opts migrator.Options) func(ctx context.Context, c *clients, gvr schema.GroupVersionResource) error {
		return func(ctx context.Context, c *clients, gvr schema.GroupVersionResource) error {
			target, err := c.migrator.Resolve(ctx, gvr.GroupResource())
			if err != nil {
				return err
			}
			result, err := c.migrator.Rewrite(ctx, target, opts, nil)
			if err == nil && result.Failed > 0 {
				err = fmt.Errorf("%d objects failed: %+v", result.Failed, result.Failures)
			}
			return err
		}
	}
	c16 := migrator.DefaultConcurrency
	out := append(make([]strategy, 0, 17),
		strategy{name: "restow", series: "restow", concurrency: c16, pass: restow(migrator.Options{})},
		strategy{name: "restow-c64", series: "restow", concurrency: 64, pass: restow(migrator.Options{Concurrency: 64})},
		strategy{name: "restow-noop", noop: true, pass: restow(migrator.Options{})},
		strategy{name: "operator", operator: []string{}},
		strategy{name: "bare-patch-c16", series: "bare patch loop", concurrency: c16, pass: barePatchLoop(c16)},
		strategy{name: "bare-patch-c64", series: "bare patch loop", concurrency: 64, pass: barePatchLoop(64)},
		strategy{name: "sequential-patch", series: "sequential patch", concurrency: 1, pass: sequentialPatch},
		strategy{name: "sequential-put", series: "sequential PUT", concurrency: 1, pass: sequentialPut},
	)
	for _, c := range []int{4, 8, 32} {
		out = append(out,
			strategy{name: fmt.Sprintf("restow-c%d", c), sweep: true, series: "restow", concurrency: c, pass: restow(migrator.Options{Concurrency: c})},
			strategy{name: fmt.Sprintf("bare-patch-c%d", c), sweep: true, series: "bare patch loop", concurrency: c, pass: barePatchLoop(c)})
	}
	for _, size := range []int64{100, 2000} {
		out = append(out, strategy{name: fmt.Sprintf("restow-p%d", size), sweep: true, pass: restow(migrator.Options{PageSize: size})})
	}
	// The manager's former client-side limit, for the record of why it went.
	out = append(out, strategy{name: "operator-qps200", sweep: true, operator: []string{"--kube-api-qps=200", "--kube-api-burst=400"}})
	return out
}

// clients reach the control plane through a transport that counts requests.
// The in-process strategies share them.
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
	if c.migrator, err = migrator.NewForConfig(cfg, env.Client); err != nil {
		b.Fatal(err)
	}
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
// kube-apiserver process's CPU time per object (from /proc) and the peak
// memory of the process doing the work: the heap growth of this one, or the
// resident set of the manager process for the operator rows, with the
// StorageMigration status writes it made.
func BenchmarkCompare(b *testing.B) {
	for _, n := range sizes(b) {
		b.Run(fmt.Sprintf("objects=%d", n), func(b *testing.B) {
			f := newCompareFixture(b, n)
			for _, s := range strategies() {
				b.Run(s.name, func(b *testing.B) {
					if s.sweep && n != sweepObjects {
						b.Skipf("sweeps run at %d objects only", sweepObjects)
					}
					if s.operator != nil {
						f.runOperator(b, s)
					} else {
						f.run(b, s)
					}
				})
			}
		})
	}
}

type compareFixture struct {
	fx      testenv.Fixture
	n       int
	group   string
	crdName string
	clients *clients
	// storage is the current storage version.
	storage string
}

// benchLabel marks a fixture's CRD, so a manager run by the benchmark
// migrates that CRD and no other.
const benchLabel = "bench.restow.dev/objects"

func newCompareFixture(b *testing.B, n int) *compareFixture {
	fx := blobs(fmt.Sprintf("n%d.compare.bench.restow.dev", n))
	fx.Labels = map[string]string{benchLabel: strconv.Itoa(n)}
	fx.Install(b, "v1beta1", "v1")
	createObjects(b, fx, n)
	return &compareFixture{fx: fx, n: n, group: fx.Group, crdName: fx.CRDName(), clients: newClients(b), storage: "v1beta1"}
}

func (f *compareFixture) gvr() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: f.group, Version: f.storage, Resource: "blobs"}
}

// switchStorage makes the other version the storage version, so the next
// pass must re-encode every object.
func (f *compareFixture) switchStorage(ctx context.Context) error {
	next := map[string]string{"v1beta1": "v1", "v1": "v1beta1"}[f.storage]
	if err := env.SetStorageVersion(ctx, f.crdName, next); err != nil {
		return err
	}
	f.storage = next
	return nil
}

// figures are one strategy's results at one size, per object where it says so.
type figures struct {
	Objects        int     `json:"objects"`
	Strategy       string  `json:"strategy"`
	Series         string  `json:"series,omitempty"`
	Concurrency    int     `json:"concurrency,omitempty"`
	ObjectsPerSec  float64 `json:"objectsPerSecond"`
	Requests       float64 `json:"requestsPerObject"`
	APIServerCPUMs float64 `json:"apiserverCPUMillisecondsPerObject"`
	// PeakHeapGrowthMiB is this process's, for strategies run in it.
	PeakHeapGrowthMiB float64 `json:"peakHeapGrowthMiB,omitempty"`
	// PeakRSSMiB and StatusWrites are the manager process's, for the
	// operator rows.
	PeakRSSMiB   float64 `json:"peakRSSMiB,omitempty"`
	StatusWrites float64 `json:"statusWritesPerPass,omitempty"`
}

// report attaches the figures to the benchmark's output and keeps them for
// the table and the plots written after the run.
func report(b *testing.B, fig figures) {
	b.ReportMetric(fig.ObjectsPerSec, "objects/s")
	b.ReportMetric(fig.Requests, "requests/object")
	b.ReportMetric(fig.APIServerCPUMs, "apiserver-cpu-ms/object")
	if fig.PeakRSSMiB > 0 {
		b.ReportMetric(fig.PeakRSSMiB, "manager-peak-rss-MiB")
		b.ReportMetric(fig.StatusWrites, "status-writes/pass")
	} else {
		b.ReportMetric(fig.PeakHeapGrowthMiB, "peak-heap-growth-MiB")
	}
	record(fig)
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
		} else if err := f.switchStorage(ctx); err != nil {
			b.Fatal(err)
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
	report(b, figures{
		Objects: f.n, Strategy: s.name, Series: s.series, Concurrency: s.concurrency,
		ObjectsPerSec:     objects / b.Elapsed().Seconds(),
		Requests:          float64(requests) / objects,
		APIServerCPUMs:    float64(apiserverCPU.Microseconds()) / 1000 / objects,
		PeakHeapGrowthMiB: float64(peakGrowth) / (1 << 20),
	})
}

// runOperator times the operator as users run it: cmd/manager as a process
// of its own, with its defaults unless the strategy adds flags, started
// while there is nothing to migrate. The timed part is the storage switch
// and the automatic migration it triggers, up to the manager's pruning of
// status.storedVersions, which it does only after a complete pass.
func (f *compareFixture) runOperator(b *testing.B, s strategy) {
	ctx := b.Context()
	kubeconfig := filepath.Join(b.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		b.Fatal(err)
	}
	var requests, statusWrites float64
	var apiserverCPU time.Duration
	var peakRSS uint64
	for b.Loop() {
		b.StopTimer()
		f.pruneStoredVersions(b)
		manager := operator.StartProcess(b, operator.ProcessOptions{
			Kubeconfig: kubeconfig,
			// The settle window is a safety wait, not work: kept short here
			// so the figure is the pass itself.
			Args: append([]string{"--auto-migrate-selector=" + benchLabel + "=" + strconv.Itoa(f.n), "--settle-window=1s"}, s.operator...),
		})
		if err := manager.WaitLeader(ctx, time.Minute); err != nil {
			b.Fatal(err)
		}
		requestsBefore, err := manager.Metric(ctx, "rest_client_requests_total", nil)
		if err != nil {
			b.Fatal(err)
		}
		writes, stopCounting := f.countMigrationWrites(b)
		cpuBefore, err := env.APIServerCPU()
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := f.switchStorage(ctx); err != nil {
			b.Fatal(err)
		}
		err = f.waitPruned(ctx)
		b.StopTimer()
		cpuAfter, cpuErr := env.APIServerCPU()
		if err != nil || cpuErr != nil {
			b.Fatalf("%s: %v %v\n%s", s.name, err, cpuErr, manager.Logs())
		}
		stopCounting()
		requestsAfter, err := manager.Metric(ctx, "rest_client_requests_total", nil)
		if err != nil {
			b.Fatal(err)
		}
		rss, err := manager.PeakRSS()
		if err != nil {
			b.Fatal(err)
		}
		if err := manager.Stop(); err != nil {
			b.Fatalf("%v\n%s", err, manager.Logs())
		}
		requests += requestsAfter - requestsBefore
		statusWrites += float64(writes.Load())
		apiserverCPU += cpuAfter - cpuBefore
		peakRSS = max(peakRSS, rss)
		f.assertStored(b)
		f.deleteAutomaticMigration(b)
		b.StartTimer()
	}
	b.StopTimer()
	objects := float64(f.n) * float64(b.N)
	report(b, figures{
		Objects: f.n, Strategy: s.name,
		ObjectsPerSec:  objects / b.Elapsed().Seconds(),
		Requests:       requests / objects,
		APIServerCPUMs: float64(apiserverCPU.Microseconds()) / 1000 / objects,
		PeakRSSMiB:     float64(peakRSS) / (1 << 20),
		StatusWrites:   statusWrites / float64(b.N),
	})
}

// pruneStoredVersions leaves only the storage version in the CRD's
// status.storedVersions, after checking in etcd that nothing is stored at
// another, so a manager started now has nothing to do until the switch.
func (f *compareFixture) pruneStoredVersions(b *testing.B) {
	f.assertStored(b)
	ctx := b.Context()
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: f.crdName}, crd); err != nil {
		b.Fatal(err)
	}
	patch := client.MergeFrom(crd.DeepCopy())
	crd.Status.StoredVersions = []string{f.storage}
	if err := env.Client.Status().Patch(ctx, crd, patch); err != nil {
		b.Fatal(err)
	}
}

// waitPruned waits until status.storedVersions is the storage version alone.
func (f *compareFixture) waitPruned(ctx context.Context) error {
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Hour, true, func(ctx context.Context) (bool, error) {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: f.crdName}, crd); err != nil {
			return false, err
		}
		return slices.Equal(crd.Status.StoredVersions, []string{f.storage}), nil
	})
}

// countMigrationWrites counts the updates of the StorageMigration named
// after the CRD (the automatic one), seen by a watch, until stop is called.
func (f *compareFixture) countMigrationWrites(b *testing.B) (*atomic.Int64, func()) {
	watcher, err := f.clients.dynamic.Resource(migrationv1alpha1.GroupVersion.WithResource("storagemigrations")).
		Watch(b.Context(), metav1.ListOptions{FieldSelector: "metadata.name=" + f.crdName})
	if err != nil {
		b.Fatal(err)
	}
	var n atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for event := range watcher.ResultChan() {
			if event.Type == watch.Modified {
				n.Add(1)
			}
		}
	}()
	return &n, func() {
		watcher.Stop()
		<-done
	}
}

// deleteAutomaticMigration removes the StorageMigration the manager created:
// the test control plane runs no garbage collector.
func (f *compareFixture) deleteAutomaticMigration(b *testing.B) {
	sm := &migrationv1alpha1.StorageMigration{ObjectMeta: metav1.ObjectMeta{Name: f.crdName}}
	if err := env.Client.Delete(b.Context(), sm); err != nil {
		b.Fatal(err)
	}
}

// assertStored checks in etcd that every object is stored at the storage version.
func (f *compareFixture) assertStored(b *testing.B) {
	b.Helper()
	f.fx.AssertAllStoredAt(b, f.storage, f.n)
}
