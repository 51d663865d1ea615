package verify

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Reader is the one etcd call a scan makes: a range read. clientv3.KV
// satisfies it; a scan sends nothing else (no write, no lease, no watch,
// no compaction).
type Reader interface {
	Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error)
}

// Defaults of a scan.
const (
	// DefaultPageSize is the most values one request reads.
	DefaultPageSize = 10000
	// DefaultNames is how many names each count keeps.
	DefaultNames = 5
	// firstPage is how many values the first request reads, before the
	// values' size is known.
	firstPage = 500
	// pageBytes is about how many bytes of values a page holds: each page's
	// size follows the last one's average value, so that pages of small
	// objects are large (etcd counts every key left in the range on every
	// request, which makes many small pages slow over a large resource)
	// and pages of large objects small (memory holds one page).
	pageBytes = 8 << 20
)

// ScanOptions bound a scan.
type ScanOptions struct {
	// Prefix is kube-apiserver's --etcd-prefix; DefaultPrefix if empty.
	Prefix string
	// PageSize is the most values read per request; DefaultPageSize if 0.
	// Below it, each request reads about pageBytes of values.
	PageSize int64
	// Rate is the most objects read per second; 0 for no limit.
	Rate float64
	// Names is how many object names each count keeps, for the verdict to
	// show; 0 keeps none.
	Names int
	// ExpectKey, if set, counts the objects not stored under that key (see
	// MatchesKey) in Report.NotUnderKey.
	ExpectKey string
}

// Count is a number of objects and the first of their names
// ([<namespace>/]<name>), in key order.
type Count struct {
	Objects int      `json:"objects"`
	Names   []string `json:"names,omitempty"`
}

func (c *Count) add(name string, keep int) {
	c.Objects++
	if len(c.Names) < keep {
		c.Names = append(c.Names, name)
	}
}

// Report is what etcd holds for one resource: counts by the API version and
// by the key the objects are stored at. It holds names and counts only.
type Report struct {
	Resource  schema.GroupResource `json:"-"`
	KeyPrefix string               `json:"keyPrefix"`
	// Revision is the etcd revision read at. Snapshot is false if etcd
	// compacted it during the scan, which then went on at later revisions.
	Revision int64 `json:"revision"`
	Snapshot bool  `json:"snapshot"`
	Objects  int   `json:"objects"`
	// Versions counts objects by the apiVersion they are encoded at;
	// encrypted values count under EncryptedVersion, values that cannot be
	// classified under UnknownVersion.
	Versions map[string]*Count `json:"versions"`
	// Keys counts objects by KeyLabel.
	Keys map[string]*Count `json:"keys"`
	// Encodings counts objects by Encoding.
	Encodings map[Encoding]int `json:"encodings"`
	// Problems counts, by reason, the values that could not be classified.
	Problems map[string]int `json:"problems,omitempty"`
	// NotUnderKey counts the objects not stored under ScanOptions.ExpectKey.
	NotUnderKey *Count `json:"notUnderKey,omitempty"`
}

// Labels of Report.Versions for values whose version cannot be read.
const (
	EncryptedVersion = "(encrypted)"
	UnknownVersion   = "(unknown)"
)

// VersionsSorted are Report.Versions' labels in order.
func (r *Report) VersionsSorted() []string { return sortedKeys(r.Versions) }

// KeysSorted are Report.Keys' labels in order.
func (r *Report) KeysSorted() []string { return sortedKeys(r.Keys) }

func sortedKeys(m map[string]*Count) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Scan reads every object of a resource from etcd in pages, at one revision
// where etcd keeps it, and counts them. It first asks etcd for the number of
// keys alone (no values), then reads values a page at a time, each page
// dropped before the next: memory holds one page, not the resource.
func Scan(ctx context.Context, etcd Reader, gr schema.GroupResource, crd bool, opts ScanOptions) (*Report, error) {
	maxPage := opts.PageSize
	if maxPage <= 0 {
		maxPage = DefaultPageSize
	}
	var limiter *rate.Limiter
	if opts.Rate > 0 {
		maxPage = min(maxPage, max(1, int64(opts.Rate)))
		limiter = rate.NewLimiter(rate.Limit(opts.Rate), int(maxPage))
	}
	pageSize := min(maxPage, firstPage)
	prefix := KeyPrefix(opts.Prefix, gr, crd)
	end := clientv3.GetPrefixRangeEnd(prefix)
	r := &Report{
		Resource: gr, KeyPrefix: prefix, Snapshot: true,
		Versions: map[string]*Count{}, Keys: map[string]*Count{}, Encodings: map[Encoding]int{},
	}
	if opts.ExpectKey != "" {
		r.NotUnderKey = &Count{}
	}
	first, err := etcd.Get(ctx, prefix, clientv3.WithRange(end), clientv3.WithCountOnly())
	if err != nil {
		return nil, fmt.Errorf("counting keys under %s: %w", prefix, err)
	}
	r.Revision = first.Header.Revision
	if first.Count == 0 {
		return r, nil
	}
	from := prefix
	for {
		if limiter != nil {
			if err := limiter.WaitN(ctx, int(pageSize)); err != nil {
				return nil, err
			}
		}
		get := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(pageSize)}
		if r.Snapshot {
			get = append(get, clientv3.WithRev(r.Revision))
		}
		resp, err := etcd.Get(ctx, from, get...)
		if errors.Is(err, rpctypes.ErrCompacted) && r.Snapshot {
			// etcd no longer keeps the revision: go on at the newest one.
			r.Snapshot = false
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s from etcd: %w", prefix, err)
		}
		bytes := 0
		for _, kv := range resp.Kvs {
			r.count(ObjectName(prefix, string(kv.Key)), kv.Value, opts)
			bytes += len(kv.Value)
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return r, nil
		}
		pageSize = nextPage(bytes, len(resp.Kvs), maxPage)
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// nextPage sizes the next request to about pageBytes of values of the
// size the last page had, within 1..maxPage.
func nextPage(bytes, values int, maxPage int64) int64 {
	average := max(1, bytes/values)
	return min(maxPage, max(1, int64(pageBytes/average)))
}

// count adds one value to the report: its header's classification and its
// name, never the value.
func (r *Report) count(name string, value []byte, opts ScanOptions) {
	s := Classify(value)
	r.Objects++
	r.Encodings[s.Encoding]++
	version := s.APIVersion
	switch s.Encoding {
	case Encrypted:
		version = EncryptedVersion
	case Unknown:
		version = UnknownVersion
		if r.Problems == nil {
			r.Problems = map[string]int{}
		}
		r.Problems[s.Problem]++
	}
	entry(r.Versions, version).add(name, opts.Names)
	if s.Encoding != Unknown || s.Provider != "" {
		entry(r.Keys, s.KeyLabel()).add(name, opts.Names)
	} else {
		entry(r.Keys, UnknownVersion).add(name, opts.Names)
	}
	if r.NotUnderKey != nil && !MatchesKey(s, value, opts.ExpectKey) {
		r.NotUnderKey.add(name, opts.Names)
	}
}

func entry(m map[string]*Count, label string) *Count {
	c, ok := m[label]
	if !ok {
		c = &Count{}
		m[label] = c
	}
	return c
}
