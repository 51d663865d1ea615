package verify

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"testing"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// fakeEtcd answers range reads from a sorted key space, as etcd does, and
// records each request. compactAfter > 0 makes the request of that number
// (counting from 1) fail as compacted when it asks for a past revision.
type fakeEtcd struct {
	keys         []string
	values       map[string][]byte
	revision     int64
	compactAfter int
	requests     []clientv3.Op
	// largest is the most value bytes one answer held.
	largest int
}

// valueRequests are the requests that read values.
func (f *fakeEtcd) valueRequests() []clientv3.Op {
	var out []clientv3.Op
	for _, op := range f.requests {
		if !op.IsCountOnly() && !op.IsKeysOnly() {
			out = append(out, op)
		}
	}
	return out
}

func (f *fakeEtcd) Get(_ context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	op := clientv3.OpGet(key, opts...)
	f.requests = append(f.requests, op)
	if f.compactAfter > 0 && len(f.requests) == f.compactAfter && op.Rev() != 0 {
		return nil, rpctypes.ErrCompacted
	}
	resp := &clientv3.GetResponse{Header: &etcdserverpb.ResponseHeader{Revision: f.revision}}
	var in []string
	for _, k := range f.keys {
		if k >= key && k < string(op.RangeBytes()) {
			in = append(in, k)
		}
	}
	resp.Count = int64(len(in))
	if op.IsCountOnly() {
		return resp, nil
	}
	if limit := int(op.Limit()); limit > 0 && len(in) > limit {
		in, resp.More = in[:limit], true
	}
	bytes := 0
	for _, k := range in {
		kv := &mvccpb.KeyValue{Key: []byte(k)}
		if !op.IsKeysOnly() {
			kv.Value = f.values[k]
			bytes += len(kv.Value)
		}
		resp.Kvs = append(resp.Kvs, kv)
	}
	f.largest = max(f.largest, bytes)
	return resp, nil
}

func newFakeEtcd(prefix string, n int, value func(i int) []byte) *fakeEtcd {
	f := &fakeEtcd{values: map[string][]byte{}, revision: 42}
	for i := range n {
		k := fmt.Sprintf("%sns/obj-%04d", prefix, i)
		f.keys = append(f.keys, k)
		f.values[k] = value(i)
	}
	// Beside the resource: keys a scan must not count.
	for _, k := range []string{"/registry/configmaps/ns/cm", prefix[:len(prefix)-1] + "x/ns/other"} {
		f.keys = append(f.keys, k)
		f.values[k] = []byte(`{"apiVersion":"v1","kind":"Other"}`)
	}
	sort.Strings(f.keys)
	return f
}

func TestScanPages(t *testing.T) {
	gr := schema.GroupResource{Group: "example.com", Resource: "widgets"}
	prefix := KeyPrefix("", gr, true)
	value := func(i int) []byte {
		if i%3 == 0 {
			return []byte(`{"apiVersion":"example.com/v1beta1","kind":"Widget","spec":{"secret":"` + planted + `"}}`)
		}
		return []byte(`{"apiVersion":"example.com/v1","kind":"Widget","spec":{"secret":"` + planted + `"}}`)
	}
	for _, tc := range []struct {
		name         string
		opts         ScanOptions
		compactAfter int
		// wantPages is the number of value requests; wantSnapshot whether
		// every one was at the count's revision.
		wantPages    int
		wantSnapshot bool
	}{
		{name: "pages of 4", opts: ScanOptions{PageSize: 4, Names: 2}, wantPages: 3, wantSnapshot: true},
		{name: "one page", opts: ScanOptions{Names: 2}, wantPages: 1, wantSnapshot: true},
		{name: "rate caps the page", opts: ScanOptions{PageSize: 500, Rate: 5, Names: 2}, wantPages: 2, wantSnapshot: true},
		// The count, the keys, then the first value request fails.
		{name: "revision compacted mid-scan", opts: ScanOptions{PageSize: 4, Names: 2}, compactAfter: 3, wantPages: 4, wantSnapshot: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			etcd := newFakeEtcd(prefix, 10, value)
			etcd.compactAfter = tc.compactAfter
			r, err := Scan(context.Background(), etcd, gr, true, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if !etcd.requests[0].IsCountOnly() {
				t.Errorf("the first request reads values: %+v", etcd.requests[0])
			}
			pages := etcd.valueRequests()
			if len(pages) != tc.wantPages {
				t.Errorf("%d value requests, want %d", len(pages), tc.wantPages)
			}
			for _, p := range pages {
				if p.IsCountOnly() || !p.IsGet() {
					t.Errorf("a page request that is not a range read: %+v", p)
				}
			}
			if r.Snapshot != tc.wantSnapshot || r.Revision != 42 {
				t.Errorf("snapshot %v at revision %d, want %v at 42", r.Snapshot, r.Revision, tc.wantSnapshot)
			}
			got := map[string]int{}
			for v, c := range r.Versions {
				got[v] = c.Objects
				if len(c.Names) > tc.opts.Names {
					t.Errorf("%s keeps %d names, want at most %d", v, len(c.Names), tc.opts.Names)
				}
			}
			if r.Objects != 10 || got["example.com/v1beta1"] != 4 || got["example.com/v1"] != 6 {
				t.Errorf("counted %d objects: %v, want 10: 4 at v1beta1, 6 at v1", r.Objects, got)
			}
			if names := r.Versions["example.com/v1beta1"].Names; fmt.Sprint(names) != "[ns/obj-0000 ns/obj-0003]" {
				t.Errorf("v1beta1 names %v", names)
			}
			if dump := fmt.Sprintf("%+v %+v %+v", *r, *r.Versions["example.com/v1"], *r.Keys["identity"]); bytes.Contains([]byte(dump), []byte(planted)) {
				t.Errorf("the report holds the planted value: %s", dump)
			}
		})
	}
}

// TestScanPageBytes reads small values first and values of 1 MiB after
// them: no answer holds more than MaxPageBytes of values, whatever sizes
// came before, and no request asks for more values than PageValues.
func TestScanPageBytes(t *testing.T) {
	gr := schema.GroupResource{Group: "example.com", Resource: "widgets"}
	prefix := KeyPrefix("", gr, true)
	const small, large = 5000, 100
	etcd := newFakeEtcd(prefix, small+large, func(i int) []byte {
		size := 300
		if i >= small {
			size = 1 << 20
		}
		return append([]byte(`{"apiVersion":"example.com/v1","kind":"Widget","spec":"`), bytes.Repeat([]byte("x"), size)...)
	})
	for _, opts := range []ScanOptions{{}, {PageSize: 10000}, {MaxValueBytes: 8 << 20}} {
		etcd.requests, etcd.largest = nil, 0
		r, err := Scan(context.Background(), etcd, gr, true, opts)
		if err != nil {
			t.Fatal(err)
		}
		if r.Objects != small+large {
			t.Errorf("%+v: counted %d objects, want %d", opts, r.Objects, small+large)
		}
		if etcd.largest > MaxPageBytes {
			t.Errorf("%+v: one answer held %d MiB of values, more than the bound of %d MiB", opts, etcd.largest>>20, MaxPageBytes>>20)
		}
		for _, op := range etcd.valueRequests() {
			if op.Limit() <= 0 || op.Limit() > opts.PageValues() {
				t.Fatalf("%+v: a value request with limit %d, want 1..%d", opts, op.Limit(), opts.PageValues())
			}
		}
		t.Logf("%+v: %d values a page, %d requests, the largest answer %.1f MiB", opts, opts.PageValues(), len(etcd.requests), float64(etcd.largest)/(1<<20))
	}
	if got := (ScanOptions{}).PageValues(); got != 32 {
		t.Errorf("default page: %d values, want 32 (48 MiB of 1.5 MiB values)", got)
	}
}
