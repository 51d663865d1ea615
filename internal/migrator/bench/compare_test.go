package bench

import (
	"context"
	"errors"
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
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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
	// migrate, when set, runs a whole migration (restow's default): the
	// pass is timed from its first request to its end, and the settle
	// window and the re-check are reported apart.
	migrate *migrator.Options
	// busy writes to this share of the objects during the first pass,
	// within the settle window, as another client would.
	busy float64
	// operator, when not nil, runs cmd/manager as a process with these
	// extra flags and times its automatic migration instead of pass.
	operator []string
	// fromStart starts the manager right after the storage switch, in
	// the timed part, instead of before it.
	fromStart bool
	// yield runs the pass as a service account under the shipped API
	// Priority and Fairness objects beside a steady writer, and reports the
	// writer's latency.
	yield bool
	// profile records CPU profiles of this process and the API server
	// during the pass, when RESTOW_BENCH_PROFILE names a directory.
	profile bool
	// scale strategies run only at sizes above scaleObjects, and only they.
	scale bool
	// interleave strategies run interleavedRounds times at the sizes of
	// the comparison's target (sweepObjects and scaleObjects), one round of
	// each after the other, and report the median round.
	interleave bool
}

// interleavedRounds is how often restow, the manager and the fastest bare
// loops run at the target's sizes, interleaved, so that a slow minute of the
// shared host does not decide the comparison. Three rounds left the medians
// within the host's noise of each other (their rows moved by up to 30%
// from one round to the next in the runs of 2026-11-24); with five, three
// of one strategy's rounds must fall in slow (or fast) minutes together to
// move its median.
const interleavedRounds = 5

// interleavedBare is the fewest workers of a bare loop that runs
// interleavedRounds times: the loops of 32 and 64 workers of either request
// kind, the fastest of the loops of 4 to 64 in every run so far (those of 4
// to 16 did 0.63–0.89× the 64-worker patch loop's objects/s in the runs of
// 2026-11-23 and 2026-11-24), run as often as restow, the slower ones once.
const interleavedBare = 32

// scaleObjects is the largest size of the comparison; above it only the
// scale strategies run (make bench-scale).
const scaleObjects = 50000

// sweepConcurrency are the worker counts of the bare loops, and of restow
// held at a fixed concurrency, in the plot of objects/s against workers, at
// every size. The best bare loop of either kind at any worker count that ran
// (these, and beyondConcurrency at sweepObjects) is restow's yardstick.
var sweepConcurrency = []int{4, 8, 16, 32, 64}

// beyondConcurrency are the worker counts past sweepConcurrency, up to
// restow's default bound, at which the bare loops and restow held at a fixed
// concurrency run once at sweepObjects: what more requests in flight than 64
// buy on this API server.
var beyondConcurrency = []int{128, 256}

func strategies() []strategy {
	fixed := func(opts migrator.Options) func(ctx context.Context, c *clients, gvr schema.GroupVersionResource) error {
		return func(ctx context.Context, c *clients, gvr schema.GroupVersionResource) error {
			target, err := c.migrator.Resolve(ctx, gvr.GroupResource())
			if err != nil {
				return err
			}
			result, err := c.migrator.FirstPass(ctx, target, opts, nil)
			if err == nil && result.Failed > 0 {
				err = fmt.Errorf("%d objects failed: %+v", result.Failed, result.Failures)
			}
			return err
		}
	}
	// The settle window is a safety wait, not work: short here, so it ends
	// during the pass, and the re-check after it is measured on its own.
	defaults := &migrator.Options{Prune: true, SettleWindow: time.Second}
	out := append(make([]strategy, 0, 3+3*len(sweepConcurrency)+3*len(beyondConcurrency)+9),
		strategy{name: "restow", migrate: defaults, profile: true, interleave: true},
		strategy{name: "restow-noop", noop: true, pass: fixed(migrator.Options{})},
		strategy{name: "operator", operator: []string{}, interleave: true},
	)
	for _, c := range sweepConcurrency {
		out = append(out,
			strategy{name: fmt.Sprintf("bare-patch-c%d", c), series: "bare patch loop", concurrency: c, pass: barePatchLoop(c), profile: c == 16, interleave: c >= interleavedBare},
			strategy{name: fmt.Sprintf("bare-update-c%d", c), series: "bare update loop", concurrency: c, pass: bareUpdateLoop(c), interleave: c >= interleavedBare})
	}
	for _, c := range beyondConcurrency {
		out = append(out,
			strategy{name: fmt.Sprintf("bare-patch-c%d", c), sweep: true, series: "bare patch loop", concurrency: c, pass: barePatchLoop(c)},
			strategy{name: fmt.Sprintf("bare-update-c%d", c), sweep: true, series: "bare update loop", concurrency: c, pass: bareUpdateLoop(c)})
	}
	for _, c := range append(slices.Clone(sweepConcurrency), beyondConcurrency...) {
		out = append(out, strategy{name: fmt.Sprintf("restow-fixed-c%d", c), sweep: true, series: "restow, fixed concurrency", concurrency: c,
			pass: fixed(migrator.Options{Concurrency: c, FixedConcurrency: true})})
	}
	out = append(out,
		strategy{name: "sequential-patch", sweep: true, series: "sequential patch", concurrency: 1, pass: sequentialPatch},
		strategy{name: "sequential-put", sweep: true, series: "sequential PUT", concurrency: 1, pass: sequentialPut},
		strategy{name: "restow-p100", sweep: true, pass: fixed(migrator.Options{PageSize: 100})},
		strategy{name: "restow-p2000", sweep: true, pass: fixed(migrator.Options{PageSize: 2000})},
		// Others write to 1% of the objects within the settle window: the
		// re-check rewrites those again, and only those.
		strategy{name: "restow-busy", sweep: true, migrate: &migrator.Options{Prune: true, SettleWindow: 10 * time.Second}, busy: 0.01},
		strategy{name: "yield-restow", sweep: true, yield: true, migrate: defaults},
		strategy{name: "yield-bare-patch-c16", sweep: true, yield: true, pass: barePatchLoop(16)},
		strategy{name: "yield-bare-patch-c64", sweep: true, yield: true, pass: barePatchLoop(64)},
		// The manager as deployed, with the default settle window, for
		// its memory and status writes at scale.
		strategy{name: "operator-scale", scale: true, operator: []string{"--settle-window=2m"}},
	)
	return out
}

// clients reach the control plane through a transport that counts requests.
// The in-process strategies share them.
type clients struct {
	requests atomic.Int64
	// first is when the first request since requests was reset was sent
	// (Unix nanoseconds).
	first    atomic.Int64
	migrator *migrator.Migrator
	metadata metadata.Interface
	dynamic  dynamic.Interface
}

type countingTransport struct {
	rt    http.RoundTripper
	n     *atomic.Int64
	first *atomic.Int64
}

func (t countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if t.n.Add(1) == 1 {
		t.first.CompareAndSwap(0, time.Now().UnixNano())
	}
	return t.rt.RoundTrip(r)
}

// newClients makes the clients of config; the migrator reads CRDs through
// e's administrator client.
func newClients(b *testing.B, e *testenv.Env, config *rest.Config) *clients {
	c := &clients{}
	cfg := rest.CopyConfig(config)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return countingTransport{rt: rt, n: &c.requests, first: &c.first}
	}
	var err error
	if c.metadata, err = metadata.NewForConfig(cfg); err != nil {
		b.Fatal(err)
	}
	if c.dynamic, err = dynamic.NewForConfig(cfg); err != nil {
		b.Fatal(err)
	}
	if c.migrator, err = migrator.NewForConfig(cfg, e.Client); err != nil {
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

// sequentialPatch is the request model of cluster-api's CRD migrator and
// the in-tree storage version migration controller: a metadata list, then
// one resourceVersion-guarded no-op write after another (they send a
// server-side apply carrying the UID and resourceVersion; this sends a
// merge patch carrying the resourceVersion).
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
	return eachWholeObject(ctx, c, gvr, func(obj *unstructured.Unstructured) error {
		return updateOne(ctx, c, gvr, obj)
	})
}

// eachWholeObject lists the resource whole in pages of 500 and calls fn on
// each object.
func eachWholeObject(ctx context.Context, c *clients, gvr schema.GroupVersionResource, fn func(*unstructured.Unstructured) error) error {
	token := ""
	for {
		list, err := c.dynamic.Resource(gvr).List(ctx, metav1.ListOptions{Limit: migrator.DefaultPageSize, Continue: token})
		if err != nil {
			return err
		}
		for i := range list.Items {
			if err := fn(&list.Items[i]); err != nil {
				return err
			}
		}
		if token = list.GetContinue(); token == "" {
			return nil
		}
	}
}

// updateOne writes obj back as listed; a conflict or a deletion means
// someone else wrote it.
func updateOne(ctx context.Context, c *clients, gvr schema.GroupVersionResource, obj *unstructured.Unstructured) error {
	_, err := c.dynamic.Resource(gvr).Namespace(obj.GetNamespace()).Update(ctx, obj, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// barePatchLoop is the practical limit of the API server: the same no-op
// patches from a bounded pool of workers, with no bookkeeping at all.
func barePatchLoop(workers int) func(ctx context.Context, c *clients, gvr schema.GroupVersionResource) error {
	return func(ctx context.Context, c *clients, gvr schema.GroupVersionResource) error {
		list := func(ctx context.Context, send func(metav1.PartialObjectMetadata) error) error {
			return eachMetadataPage(ctx, c, gvr, func(items []metav1.PartialObjectMetadata) error {
				for _, obj := range items {
					if err := send(obj); err != nil {
						return err
					}
				}
				return nil
			})
		}
		return workerPool(ctx, workers, list, func(ctx context.Context, obj metav1.PartialObjectMetadata) error {
			return patchOne(ctx, c, gvr, obj)
		})
	}
}

// bareUpdateLoop is the API server's limit for the other request kind: each
// object listed whole (pages of 500) and written back as listed by an update
// from a bounded pool of workers, with no bookkeeping. A conflict or a
// deletion means someone else wrote the object.
func bareUpdateLoop(workers int) func(ctx context.Context, c *clients, gvr schema.GroupVersionResource) error {
	return func(ctx context.Context, c *clients, gvr schema.GroupVersionResource) error {
		list := func(ctx context.Context, send func(*unstructured.Unstructured) error) error {
			return eachWholeObject(ctx, c, gvr, send)
		}
		return workerPool(ctx, workers, list, func(ctx context.Context, obj *unstructured.Unstructured) error {
			return updateOne(ctx, c, gvr, obj)
		})
	}
}

// workerPool hands every item list sends to one of workers goroutines, which
// write it, and stops at the first error of either.
func workerPool[T any](ctx context.Context, workers int, list func(ctx context.Context, send func(T) error) error, write func(ctx context.Context, item T) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	work := make(chan T, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for item := range work {
				if err := write(ctx, item); err != nil {
					cancel(err)
				}
			}
		})
	}
	err := list(ctx, func(item T) error {
		select {
		case work <- item:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	})
	close(work)
	wg.Wait()
	if err != nil {
		return err
	}
	return context.Cause(ctx)
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
			f := newCompareFixture(b, env, fmt.Sprintf("n%d.compare.bench.restow.dev", n), n)
			rounds := 1
			if n == sweepObjects || n == scaleObjects {
				rounds = interleavedRounds
			}
			for round := range rounds {
				for _, s := range roundStrategies(round) {
					f.round = round
					f.runStrategy(b, n, s)
				}
			}
		})
	}
}

// roundStrategies are the strategies of one round: all of them in the
// first, then the interleaved ones, their order turned by one each round,
// so that no strategy always runs first (after the rows of the first round)
// and a host that speeds up or slows down over a round does not favour one.
func roundStrategies(round int) []strategy {
	all := strategies()
	if round == 0 {
		return all
	}
	var interleaved []strategy
	for _, s := range all {
		if s.interleave {
			interleaved = append(interleaved, s)
		}
	}
	k := round % len(interleaved)
	return slices.Concat(interleaved[k:], interleaved[:k])
}

func (f *compareFixture) runStrategy(b *testing.B, n int, s strategy) {
	b.Run(s.name, func(b *testing.B) {
		switch {
		case s.scale != (n > scaleObjects):
			b.Skipf("above %d objects only the scale strategies run, and only there", scaleObjects)
		case s.sweep && n != sweepObjects:
			b.Skipf("sweeps run at %d objects only", sweepObjects)
		}
		if s.operator != nil {
			f.runOperator(b, s)
		} else {
			f.run(b, s)
		}
	})
}

type compareFixture struct {
	// env is the control plane the fixture lives on.
	env *testenv.Env
	fx  testenv.Fixture
	n   int
	// round counts the interleaved rounds.
	round   int
	group   string
	crdName string
	clients *clients
	// storage is the current storage version.
	storage string
}

// benchLabel marks a fixture's CRD, so a manager run by the benchmark
// migrates that CRD and no other.
const benchLabel = "bench.restow.dev/objects"

func newCompareFixture(b *testing.B, e *testenv.Env, group string, n int) *compareFixture {
	fx := blobs(group)
	fx.Env = e
	fx.Labels = map[string]string{benchLabel: strconv.Itoa(n)}
	fx.Install(b, "v1beta1", "v1")
	createObjects(b, fx, n)
	return &compareFixture{env: e, fx: fx, n: n, group: fx.Group, crdName: fx.CRDName(), clients: newClients(b, e, e.Config), storage: "v1beta1"}
}

func (f *compareFixture) gvr() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: f.group, Version: f.storage, Resource: "blobs"}
}

// switchStorage makes the other version the storage version, so the next
// pass must re-encode every object.
func (f *compareFixture) switchStorage(ctx context.Context) error {
	next := map[string]string{"v1beta1": "v1", "v1": "v1beta1"}[f.storage]
	if err := f.env.SetStorageVersion(ctx, f.crdName, next); err != nil {
		return err
	}
	f.storage = next
	return nil
}

// figures are one strategy's results at one size, per object where it says so.
type figures struct {
	Objects  int    `json:"objects"`
	Strategy string `json:"strategy"`
	Round    int    `json:"round"`
	// Rounds, MinObjectsPerSec and MaxObjectsPerSec describe the rounds
	// of an interleaved strategy whose median these figures are.
	Rounds           int     `json:"rounds,omitempty"`
	MinObjectsPerSec float64 `json:"minObjectsPerSecond,omitempty"`
	MaxObjectsPerSec float64 `json:"maxObjectsPerSecond,omitempty"`
	Series           string  `json:"series,omitempty"`
	Concurrency      int     `json:"concurrency,omitempty"`
	ObjectsPerSec    float64 `json:"objectsPerSecond"`
	Requests         float64 `json:"requestsPerObject"`
	APIServerCPUMs   float64 `json:"apiserverCPUMillisecondsPerObject"`
	// PeakHeapGrowthMiB is this process's, for strategies run in it.
	PeakHeapGrowthMiB float64 `json:"peakHeapGrowthMiB,omitempty"`
	// PeakRSSMiB and StatusWrites are the manager process's, for the
	// operator rows.
	PeakRSSMiB   float64 `json:"peakRSSMiB,omitempty"`
	StatusWrites float64 `json:"statusWritesPerPass,omitempty"`
	// SpaceWaits and SpaceReadings are the manager's byte budget's, per
	// pass: its waits for a compaction (0 where it never binds) and its
	// reads of etcd's size.
	SpaceWaits     float64 `json:"spaceWaitsPerPass"`
	SpaceReadings  float64 `json:"spaceReadingsPerPass,omitempty"`
	SpaceBudgetMiB float64 `json:"spaceBudgetMiB,omitempty"`
	// PassSeconds is the time of the pass, from its first request to its
	// last object, or for the operator from the storage switch to the prune.
	PassSeconds float64 `json:"passSeconds"`
	// MeanConcurrency is a paced pass's mean pace.
	MeanConcurrency float64 `json:"meanConcurrency,omitempty"`
	// The finish of a whole migration: the requests of the re-check after
	// the settle window, the objects it rewrote again, and the time from
	// the end of the pass to the prune.
	RecheckRequests float64 `json:"recheckRequests,omitempty"`
	PassRequests    float64 `json:"passRequests,omitempty"`
	Rechecked       float64 `json:"rechecked,omitempty"`
	OthersWrote     float64 `json:"othersWrote,omitempty"`
	FinishSeconds   float64 `json:"finishSeconds,omitempty"`
	// The steady writer's latency alone and during the pass, for the
	// yield rows.
	Writer *writerFigures `json:"writer,omitempty"`
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
		b.ReportMetric(fig.SpaceWaits, "space-waits/pass")
		b.ReportMetric(fig.SpaceReadings, "space-readings/pass")
		b.ReportMetric(fig.SpaceBudgetMiB, "space-budget-MiB")
	} else {
		b.ReportMetric(fig.PeakHeapGrowthMiB, "peak-heap-growth-MiB")
	}
	if fig.MeanConcurrency > 0 {
		b.ReportMetric(fig.MeanConcurrency, "mean-pace")
	}
	if fig.PassRequests > 0 {
		b.ReportMetric(fig.RecheckRequests/fig.PassRequests, "recheck-requests/pass-requests")
	}
	if w := fig.Writer; w != nil {
		b.ReportMetric(w.AloneP99Ms, "writer-alone-p99-ms")
		b.ReportMetric(w.DuringP99Ms, "writer-p99-ms")
	}
	record(fig)
}

// measured is one pass's figures.
type measured struct {
	pass                   time.Duration
	requests               int64
	apiserverCPU           time.Duration
	pace                   float64
	recheckRequests        int64
	rechecked, othersWrote int64
	finish                 time.Duration
}

func (f *compareFixture) run(b *testing.B, s strategy) {
	ctx := b.Context()
	c := f.clients
	if s.yield {
		c = yieldClients(b)
	}
	var total measured
	var peakGrowth uint64
	var writer writerFigures
	for b.Loop() {
		b.StopTimer()
		if s.noop {
			// Objects are at the storage version already: make sure of it.
			f.assertStored(b)
		} else if err := f.switchStorage(ctx); err != nil {
			b.Fatal(err)
		}
		var w *steadyWriter
		if s.yield {
			alone := startWriter(b)
			time.Sleep(writerAlone)
			writer.alone = append(writer.alone, alone.stop(b)...)
			w = startWriter(b)
		}
		waitQuiet(b, f.env)
		stopProfiles := f.startProfiles(b, s)
		runtime.GC()
		sampler := startHeapSampler()
		b.StartTimer()
		m, err := f.runPass(ctx, c, s)
		b.StopTimer()
		stopProfiles()
		if w != nil {
			writer.during = append(writer.during, w.stop(b)...)
		}
		peakGrowth = max(peakGrowth, sampler.stop())
		if err != nil {
			b.Fatalf("%s: %v", s.name, err)
		}
		total.pass += m.pass
		total.requests += m.requests
		total.apiserverCPU += m.apiserverCPU
		total.pace += m.pace
		total.recheckRequests += m.recheckRequests
		total.rechecked += m.rechecked
		total.othersWrote += m.othersWrote
		total.finish += m.finish
		f.assertStored(b)
		b.StartTimer()
	}
	b.StopTimer()
	runs := float64(b.N)
	objects := float64(f.n) * runs
	fig := figures{
		Objects: f.n, Strategy: s.name, Round: f.round, Series: s.series, Concurrency: s.concurrency,
		ObjectsPerSec:     objects / total.pass.Seconds(),
		Requests:          float64(total.requests) / objects,
		APIServerCPUMs:    float64(total.apiserverCPU.Microseconds()) / 1000 / objects,
		PeakHeapGrowthMiB: float64(peakGrowth) / (1 << 20),
		PassSeconds:       total.pass.Seconds() / runs,
		MeanConcurrency:   total.pace / runs,
	}
	if s.migrate != nil {
		fig.PassRequests = float64(total.requests) / runs
		fig.RecheckRequests = float64(total.recheckRequests) / runs
		fig.Rechecked = float64(total.rechecked) / runs
		fig.OthersWrote = float64(total.othersWrote) / runs
		fig.FinishSeconds = total.finish.Seconds() / runs
	}
	if s.yield {
		fig.Writer = writer.figures()
	}
	report(b, fig)
}

// runPass runs one pass of s and measures it: for a whole migration, the
// first pass apart from the settle window and the re-check.
func (f *compareFixture) runPass(ctx context.Context, c *clients, s strategy) (measured, error) {
	var target migrator.Target
	if s.migrate != nil {
		var err error
		// Resolving waits for the API server's switch: not part of the pass.
		if target, err = c.migrator.Resolve(ctx, f.gvr().GroupResource()); err != nil {
			return measured{}, err
		}
	}
	c.requests.Store(0)
	c.first.Store(0)
	cpuBefore, err := f.env.APIServerCPU()
	if err != nil {
		return measured{}, err
	}
	start := time.Now()
	if s.migrate == nil {
		err := s.pass(ctx, c, f.gvr())
		m := measured{pass: time.Since(start), requests: c.requests.Load()}
		cpuAfter, cpuErr := f.env.APIServerCPU()
		m.apiserverCPU = cpuAfter - cpuBefore
		return m, errors.Join(err, cpuErr)
	}

	var mu sync.Mutex
	var m measured
	var passEnd time.Time
	var paces []int
	var recheckStart int64
	var observeErr error
	busy := f.startBusyWriter(ctx, s)
	result, err := c.migrator.Migrate(ctx, target, *s.migrate, func(p migrator.Progress) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case p.Phase == migrator.PhaseRewriting && p.Concurrency > 0:
			paces = append(paces, p.Concurrency)
		case p.Phase == migrator.PhaseSettling && passEnd.IsZero():
			passEnd = time.Now()
			m.requests = c.requests.Load()
			cpuAfter, err := f.env.APIServerCPU()
			m.apiserverCPU, observeErr = cpuAfter-cpuBefore, err
		case p.Phase == migrator.PhaseRechecking && recheckStart == 0:
			recheckStart = c.requests.Load()
		}
	})
	end := time.Now()
	m.othersWrote = busy()
	mu.Lock()
	defer mu.Unlock()
	switch {
	case err != nil || observeErr != nil:
		return m, errors.Join(err, observeErr)
	case result.Failed > 0:
		return m, fmt.Errorf("%d objects failed: %+v", result.Failed, result.Failures)
	case passEnd.IsZero() || recheckStart == 0 || len(result.Pruned) == 0:
		return m, fmt.Errorf("the migration did not settle, re-check and prune: %+v", result)
	}
	m.pass = passEnd.Sub(time.Unix(0, c.first.Load()))
	m.recheckRequests = c.requests.Load() - recheckStart
	m.rechecked = result.Rechecked
	m.finish = end.Sub(passEnd)
	for _, p := range paces {
		m.pace += float64(p) / float64(len(paces))
	}
	return m, nil
}

// startBusyWriter, for a busy strategy, changes a share of the objects as
// another client would, while the first pass runs and within the settle
// window. The returned function waits for it and says how many it changed.
func (f *compareFixture) startBusyWriter(ctx context.Context, s strategy) func() int64 {
	if s.busy == 0 {
		return func() int64 { return 0 }
	}
	k := int(float64(f.n) * s.busy)
	var wrote atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		// Begin after the pass's first list, spread over two seconds.
		time.Sleep(1500 * time.Millisecond)
		// Not through the counting clients: these requests are not the pass's.
		others, err := metadata.NewForConfig(f.env.Config)
		if err != nil {
			return
		}
		resource := others.Resource(f.gvr())
		for i := range k {
			n := i * (f.n / k)
			patch := fmt.Appendf(nil, `{"metadata":{"labels":{"bench.restow.dev/touched":"%d"}}}`, time.Now().UnixNano())
			_, err := resource.Namespace(fmt.Sprintf("bench-%d", n%10)).Patch(ctx, fmt.Sprintf("obj-%05d", n), types.MergePatchType, patch, metav1.PatchOptions{})
			if err == nil {
				wrote.Add(1)
			}
			time.Sleep(2 * time.Second / time.Duration(k))
		}
	})
	return func() int64 {
		wg.Wait()
		return wrote.Load()
	}
}

// runOperator times the operator as users run it: cmd/manager as a process
// of its own, with its defaults unless the strategy adds flags, started
// while there is nothing to migrate. The timed part is the storage switch
// and the automatic migration it triggers, up to the manager's pruning of
// status.storedVersions, which it does only after a complete pass.
func (f *compareFixture) runOperator(b *testing.B, s strategy) {
	ctx := b.Context()
	kubeconfig := filepath.Join(b.TempDir(), "kubeconfig")
	if err := f.env.WriteKubeconfig(kubeconfig); err != nil {
		b.Fatal(err)
	}
	var requests, statusWrites, spaceWaits, spaceReadings, spaceBudget float64
	var apiserverCPU time.Duration
	var peakRSS uint64
	for b.Loop() {
		b.StopTimer()
		if s.fromStart {
			f.deleteBuiltInMigrations(b)
		}
		f.pruneStoredVersions(b)
		start := func() *operator.Process {
			return operator.StartProcess(b, operator.ProcessOptions{
				Kubeconfig: kubeconfig,
				// The settle window is a safety wait, not work: kept short
				// here so the figure is the pass itself.
				Args: append([]string{"--auto-migrate-selector=" + benchLabel + "=" + strconv.Itoa(f.n), "--settle-window=1s"}, s.operator...),
			})
		}
		var manager *operator.Process
		var requestsBefore float64
		if !s.fromStart {
			manager = start()
			if err := manager.WaitLeader(ctx, time.Minute); err != nil {
				b.Fatal(err)
			}
			var err error
			if requestsBefore, err = manager.Metric(ctx, "rest_client_requests_total", nil); err != nil {
				b.Fatal(err)
			}
		}
		waitQuiet(b, f.env)
		writes, stopCounting := f.countMigrationWrites(b)
		cpuBefore, err := f.env.APIServerCPU()
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := f.switchStorage(ctx); err != nil {
			b.Fatal(err)
		}
		if s.fromStart {
			manager = start()
		}
		err = f.waitPruned(ctx)
		b.StopTimer()
		cpuAfter, cpuErr := f.env.APIServerCPU()
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
		waits, readings, budget := managerSpace(b, manager)
		spaceWaits, spaceReadings, spaceBudget = spaceWaits+waits, spaceReadings+readings, budget
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
		Objects: f.n, Strategy: s.name, Round: f.round,
		ObjectsPerSec:  objects / b.Elapsed().Seconds(),
		Requests:       requests / objects,
		APIServerCPUMs: float64(apiserverCPU.Microseconds()) / 1000 / objects,
		PeakRSSMiB:     float64(peakRSS) / (1 << 20),
		StatusWrites:   statusWrites / float64(b.N),
		PassSeconds:    b.Elapsed().Seconds() / float64(b.N),
		SpaceWaits:     spaceWaits / float64(b.N),
		SpaceReadings:  spaceReadings / float64(b.N),
		SpaceBudgetMiB: spaceBudget / (1 << 20),
	})
}

// managerSpace reads what the manager's byte budget did (package quota):
// its waits for a compaction, its reads of etcd's size, and the budget it
// last computed.
func managerSpace(b *testing.B, manager *operator.Process) (waits, readings, budget float64) {
	b.Helper()
	var err error
	for name, v := range map[string]*float64{"restow_etcd_space_waits_total": &waits, "restow_etcd_space_readings_total": &readings, "restow_etcd_budget_bytes": &budget} {
		if *v, err = manager.Metric(b.Context(), name, nil); err != nil {
			b.Fatal(err)
		}
	}
	return waits, readings, budget
}

// pruneStoredVersions leaves only the storage version in the CRD's
// status.storedVersions, after checking in etcd that nothing is stored at
// another, so a manager started now has nothing to do until the switch.
func (f *compareFixture) pruneStoredVersions(b *testing.B) {
	f.assertStored(b)
	ctx := b.Context()
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := f.env.Client.Get(ctx, client.ObjectKey{Name: f.crdName}, crd); err != nil {
		b.Fatal(err)
	}
	patch := client.MergeFrom(crd.DeepCopy())
	crd.Status.StoredVersions = []string{f.storage}
	if err := f.env.Client.Status().Patch(ctx, crd, patch); err != nil {
		b.Fatal(err)
	}
}

// waitPruned waits until status.storedVersions is the storage version alone.
func (f *compareFixture) waitPruned(ctx context.Context) error {
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Hour, true, func(ctx context.Context) (bool, error) {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := f.env.Client.Get(ctx, client.ObjectKey{Name: f.crdName}, crd); err != nil {
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
	if err := f.env.Client.Delete(b.Context(), sm); err != nil {
		b.Fatal(err)
	}
}

// assertStored checks in etcd that every object is stored at the storage version.
func (f *compareFixture) assertStored(b *testing.B) {
	b.Helper()
	f.fx.AssertAllStoredAt(b, f.storage, f.n)
}

// waitQuiet waits, up to half a minute, until the API server is nearly idle
// (under a quarter of a core over a second), so that one row does not pay
// for the work of the one before: creating the objects, a storage switch,
// etcd's compaction.
func waitQuiet(b *testing.B, e *testenv.Env) {
	b.Helper()
	for range 30 {
		before, err := e.APIServerCPU()
		if err != nil {
			b.Fatal(err)
		}
		time.Sleep(time.Second)
		after, err := e.APIServerCPU()
		if err != nil {
			b.Fatal(err)
		}
		if after-before < 250*time.Millisecond {
			return
		}
	}
}
