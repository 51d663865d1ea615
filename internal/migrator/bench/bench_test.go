// Package bench measures migration passes on the source-built control plane
// against the baselines (BenchmarkCompare): throughput, API requests and
// API-server CPU per object, and the memory of the process doing the work,
// which must stay flat in the number of objects. Run with `make bench`; with
// RESTOW_BENCH_OUT set it writes its figures, tables and plots there.
package bench

import (
	"fmt"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/restow/restow/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	testenv.Main(m, testenv.Options{CRDDirectoryPaths: []string{"../../../config/crd/bases"}, AfterRun: writeResults}, &env)
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

// blobs is the benchmarks' CRD in group: namespaced Blobs.
func blobs(group string) testenv.Fixture {
	return testenv.Fixture{Env: env, Group: group, Kind: "Blob", Plural: "blobs", Namespaced: true}
}

// createObjects creates n Blobs of 1 KiB at v1beta1 in 10 namespaces.
func createObjects(b *testing.B, fx testenv.Fixture, n int) {
	b.Helper()
	namespaces := make([]string, 10)
	for i := range namespaces {
		namespaces[i] = fmt.Sprintf("bench-%d", i)
	}
	payload := strings.Repeat("x", 1024)
	fx.CreateObjects(b, "v1beta1", n, func(int) map[string]any { return map[string]any{"payload": payload} }, namespaces...)
}
