package verify_test

import (
	"context"
	"fmt"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/restow/restow/internal/testenv"
	"github.com/restow/restow/internal/verify"
)

// sizedReader records the value bytes and the count asked of each range
// read a scan sends to etcd.
type sizedReader struct {
	verify.Reader
	mu      sync.Mutex
	largest int
	limits  []int64
}

func (r *sizedReader) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	resp, err := r.Reader.Get(ctx, key, opts...)
	if err != nil {
		return resp, err
	}
	op := clientv3.OpGet(key, opts...)
	bytes := 0
	for _, kv := range resp.Kvs {
		bytes += len(kv.Value)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.largest = max(r.largest, bytes)
	if !op.IsCountOnly() && !op.IsKeysOnly() {
		r.limits = append(r.limits, op.Limit())
	}
	return resp, err
}

// TestScanMixedSizes writes 3,000 small values into the source-built etcd,
// then 64 values of 1 MiB after them in key order (as Helm's release Secrets
// can follow small ones), and scans them: no answer holds more than
// verify.MaxPageBytes of values, no request asks for more than the page's
// values, and the heap stays near one page.
func TestScanMixedSizes(t *testing.T) {
	cp := testenv.Start(t, testenv.Options{})
	etcd, err := clientv3.New(clientv3.Config{Endpoints: []string{cp.EtcdURL()}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = etcd.Close() }()
	gr := schema.GroupResource{Group: "mixed.restow.dev", Resource: "widgets"}
	prefix := verify.KeyPrefix("", gr, true)
	const small, large = 3000, 64
	put := func(i int, payload string) clientv3.Op {
		name := fmt.Sprintf("w-%05d", i)
		return clientv3.OpPut(prefix+"ns/"+name, fmt.Sprintf(`{"apiVersion":"mixed.restow.dev/v1","kind":"Widget","metadata":{"name":%q},"spec":%q}`, name, payload))
	}
	for i := 0; i < small; i += 100 {
		ops := make([]clientv3.Op, 0, 100)
		for j := i; j < i+100; j++ {
			ops = append(ops, put(j, strings.Repeat("s", 300)))
		}
		if _, err := etcd.Txn(t.Context()).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	big := strings.Repeat("L", 1<<20)
	for i := small; i < small+large; i++ {
		if _, err := etcd.Do(t.Context(), put(i, big)); err != nil {
			t.Fatal(err)
		}
	}
	reader := &sizedReader{Reader: etcd.KV}
	runtime.GC()
	baseline := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(baseline)
	peak := watchHeap()
	report, err := verify.Scan(t.Context(), reader, gr, true, verify.ScanOptions{})
	live, objects := peak()
	if err != nil {
		t.Fatal(err)
	}
	if report.Objects != small+large {
		t.Errorf("scanned %d objects, want %d", report.Objects, small+large)
	}
	if reader.largest > verify.MaxPageBytes {
		t.Errorf("one answer of etcd held %.1f MiB of values, more than the bound of %d MiB", float64(reader.largest)/(1<<20), verify.MaxPageBytes>>20)
	}
	for _, limit := range reader.limits {
		if limit <= 0 || limit > verify.DefaultPageSize {
			t.Fatalf("a value request asked for %d values, want 1..%d", limit, verify.DefaultPageSize)
		}
	}
	before := baseline[0].Value.Uint64()
	t.Logf("%d small and %d 1 MiB values: %d value requests of at most %d values; the largest answer held %.1f MiB; live heap %.1f MiB before the scan, peak %.1f MiB during it; peak heap objects %.1f MiB",
		small, large, len(reader.limits), verify.DefaultPageSize, float64(reader.largest)/(1<<20), float64(before)/(1<<20), float64(live)/(1<<20), float64(objects)/(1<<20))
}
