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
	for _, k := range in {
		resp.Kvs = append(resp.Kvs, &mvccpb.KeyValue{Key: []byte(k), Value: f.values[k]})
	}
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
			pages := etcd.requests[1:]
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

func TestNextPage(t *testing.T) {
	for _, tc := range []struct {
		bytes, values int
		maxPage       int64
		want          int64
	}{
		{bytes: 500 << 10, values: 500, maxPage: 10000, want: 8192},            // 1 KiB objects
		{bytes: 500 << 20, values: 500, maxPage: 10000, want: 8},               // 1 MiB objects
		{bytes: 3 << 20, values: 1, maxPage: 10000, want: 2},                   // one object larger than a page
		{bytes: 20 << 20, values: 1, maxPage: 10000, want: 1},                  // never below 1
		{bytes: 100, values: 100, maxPage: 700, want: 700},                     // the flag's limit
		{bytes: 0, values: 3, maxPage: DefaultPageSize, want: DefaultPageSize}, // empty values
	} {
		if got := nextPage(tc.bytes, tc.values, tc.maxPage); got != tc.want {
			t.Errorf("nextPage(%d bytes, %d values, max %d) = %d, want %d", tc.bytes, tc.values, tc.maxPage, got, tc.want)
		}
	}
}
