package verify_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/restow/restow/internal/testenv"
	"github.com/restow/restow/internal/verify"
)

// benchSizes are the object counts of BenchmarkScan: RESTOW_VERIFY_BENCH_SIZES,
// by default 10,000 and 200,000.
func benchSizes(b *testing.B) []int {
	sizes := []int{10000, 200000}
	if s := os.Getenv("RESTOW_VERIFY_BENCH_SIZES"); s != "" {
		fields := strings.Split(s, ",")
		sizes = make([]int, 0, len(fields))
		for _, f := range fields {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n <= 0 {
				b.Fatalf("RESTOW_VERIFY_BENCH_SIZES=%q: want object counts", s)
			}
			sizes = append(sizes, n)
		}
	}
	return sizes
}

// BenchmarkScan reads a custom resource of each size from etcd as verify
// does, half of it at v1beta1 and half at v1, about 1 KiB an object, and
// reports the objects read per second and the heap's peak during the scan.
// The objects are written into etcd directly, as the API server lays them
// out: the scan reads etcd alone.
func BenchmarkScan(b *testing.B) {
	cp := testenv.Start(b, testenv.Options{})
	etcd, err := clientv3.New(clientv3.Config{Endpoints: []string{cp.EtcdURL()}})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = etcd.Close() }()
	written := 0
	gr := schema.GroupResource{Group: "bench.restow.dev", Resource: "widgets"}
	for _, n := range benchSizes(b) {
		written = fill(b, etcd, gr, written, n)
		b.Run(fmt.Sprintf("objects=%d", n), func(b *testing.B) {
			var report *verify.Report
			runtime.GC()
			baseline := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
			metrics.Read(baseline)
			peak := watchHeap()
			start := time.Now()
			for b.Loop() {
				report, err = verify.Scan(context.Background(), etcd.KV, gr, true, verify.ScanOptions{Names: verify.DefaultNames})
				if err != nil {
					b.Fatal(err)
				}
			}
			elapsed := time.Since(start) / time.Duration(b.N)
			live, objects := peak()
			if report.Objects != n {
				b.Fatalf("scanned %d objects, want %d", report.Objects, n)
			}
			b.ReportMetric(float64(n)/elapsed.Seconds(), "objects/s")
			before := baseline[0].Value.Uint64()
			b.ReportMetric(float64(live-min(live, before))/(1<<20), "scan-live-MiB")
			b.ReportMetric(float64(objects)/(1<<20), "peak-heap-MiB")
			b.Logf("%d objects in %s: %v; live heap %.1f MiB before, peak %.1f MiB during the scan; peak heap objects %.1f MiB",
				n, elapsed.Round(time.Millisecond), counts(report), float64(before)/(1<<20), float64(live)/(1<<20), float64(objects)/(1<<20))
		})
	}
}

func counts(r *verify.Report) map[string]int {
	out := map[string]int{}
	for v, c := range r.Versions {
		out[v] = c.Objects
	}
	return out
}

// fill writes objects from..n-1 into etcd, in transactions of 128 puts.
func fill(b *testing.B, etcd *clientv3.Client, gr schema.GroupResource, from, n int) int {
	b.Helper()
	prefix := verify.KeyPrefix("", gr, true)
	payload := strings.Repeat("x", 900)
	for i := from; i < n; {
		var ops []clientv3.Op
		for ; i < n && len(ops) < 128; i++ {
			version := "v1beta1"
			if i%2 == 1 {
				version = "v1"
			}
			ns, name := fmt.Sprintf("ns-%d", i%10), fmt.Sprintf("widget-%07d", i)
			value := fmt.Sprintf(`{"apiVersion":"%s/%s","kind":"Widget","metadata":{"name":%q,"namespace":%q},"spec":{"payload":%q}}`,
				gr.Group, version, name, ns, payload)
			ops = append(ops, clientv3.OpPut(prefix+ns+"/"+name, value))
		}
		if _, err := etcd.Txn(context.Background()).Then(ops...).Commit(); err != nil {
			b.Fatal(err)
		}
	}
	return max(from, n)
}

// watchHeap samples the heap every 5 ms, without stopping the world, until
// the returned function is called, which returns the largest samples of the
// live heap (as the last GC found it: what the scan holds) and of all heap
// objects (live, and dead ones not yet swept: what the process's memory
// follows, with GOGC).
func watchHeap() func() (live, objects uint64) {
	var peakLive, peakObjects atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/memory/classes/heap/objects:bytes"}}
		for {
			metrics.Read(sample)
			if v := sample[0].Value.Uint64(); v > peakLive.Load() {
				peakLive.Store(v)
			}
			if v := sample[1].Value.Uint64(); v > peakObjects.Load() {
				peakObjects.Store(v)
			}
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	})
	return func() (live, objects uint64) {
		close(stop)
		wg.Wait()
		return peakLive.Load(), peakObjects.Load()
	}
}
