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

// Defaults and bounds of a scan.
const (
	// MaxPageBytes bounds the values one request can return, whatever the
	// order of their sizes: a page holds at most MaxPageBytes /
	// ScanOptions.MaxValueBytes values, so even a page of the largest
	// values etcd accepts stays within it.
	MaxPageBytes = 48 << 20
	// DefaultMaxValueBytes is the largest value etcd accepts by default:
	// its --max-request-bytes, 1.5 MiB. A value is written in one request,
	// so none is larger.
	DefaultMaxValueBytes = 3 << 19
	// DefaultPageSize is the most values one request reads: MaxPageBytes
	// of values of DefaultMaxValueBytes each.
	DefaultPageSize = MaxPageBytes / DefaultMaxValueBytes
	// DefaultNames is how many names each count keeps.
	DefaultNames = 5
	// keyPage is how many keys, without their values, one request lists.
	// etcd counts every key left in the range on each request, so the
	// keys are listed in large pages and the values read in small ranges
	// between listed keys, whose count is the range alone.
	keyPage = 10000
)

// ScanOptions bound a scan.
type ScanOptions struct {
	// Prefix is kube-apiserver's --etcd-prefix; DefaultPrefix if empty.
	Prefix string
	// PageSize is the most values read per request; the largest that
	// keeps a page within MaxPageBytes if 0 or larger.
	PageSize int64
	// MaxValueBytes is the largest value etcd accepts (its
	// --max-request-bytes); DefaultMaxValueBytes if 0.
	MaxValueBytes int64
	// Rate is the most objects read per second; 0 for no limit.
	Rate float64
	// Names is how many object names each count keeps, for the verdict to
	// show; 0 keeps none.
	Names int
	// ExpectKey, if set, counts the objects not stored under that key in
	// Report.NotUnderKey (see ParseKey).
	ExpectKey KeyWant
	// APICount is the API's count of the resource's objects at an etcd
	// revision (0: now), with the first object it lists, or
	// ErrRevisionNotInAPI if the API's etcd has no such revision, or
	// ErrNoAPICount if the API did not say how many it holds. The scan asks
	// it at the revision it reads, so that etcd's count is held against the
	// API's with no tolerance. Without it the scan is held against nothing,
	// and Judge says so.
	APICount func(ctx context.Context, revision int64) (APIListing, error)
	// SharedEtcd says that the etcd read holds other clusters' keys too,
	// some under this prefix: etcd may then hold more keys under it than
	// the API lists, and what proves the prefix is the first object the API
	// lists, found under it at its own revision (Judge).
	SharedEtcd bool
}

// APIListing is the API's count of a resource at one etcd revision.
type APIListing struct {
	Count int64
	// First is the first object listed ([<namespace>/]<name>), and
	// FirstRevision its resourceVersion: the etcd revision its key was
	// last written at.
	First         string
	FirstRevision int64
}

// PageValues is the most values a page of a scan with these options holds:
// PageSize, within MaxPageBytes / MaxValueBytes, at least 1.
func (o ScanOptions) PageValues() int64 {
	maxValue := o.MaxValueBytes
	if maxValue <= 0 {
		maxValue = DefaultMaxValueBytes
	}
	limit := max(1, MaxPageBytes/maxValue)
	if o.PageSize > 0 {
		limit = min(limit, o.PageSize)
	}
	if o.Rate > 0 {
		limit = min(limit, max(1, int64(o.Rate)))
	}
	return limit
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
	// KeysAtRevision is how many keys etcd held under KeyPrefix at
	// Revision; APIObjects how many objects the API listed at the same
	// revision, or nil with APIError if it could not list them.
	KeysAtRevision int64  `json:"keysAtRevision"`
	APIObjects     *int64 `json:"apiObjects,omitempty"`
	APIError       string `json:"apiError,omitempty"`
	// APIRevisionUnknown says the API could not list at Revision (too new
	// or compacted for it): its etcd is not the one read.
	APIRevisionUnknown bool `json:"apiRevisionUnknown,omitempty"`
	// APIObjectsNow is the API's count now, asked when etcd held no key
	// at Revision and the API listed none there either.
	APIObjectsNow *int64 `json:"apiObjectsNow,omitempty"`
	// APIFirst and EtcdFirst are the first object ([<namespace>/]<name>)
	// the API lists at Revision and the first etcd holds under KeyPrefix:
	// both list in key order, so the same etcd names the same one.
	APIFirst  string `json:"apiFirst,omitempty"`
	EtcdFirst string `json:"etcdFirst,omitempty"`
	// APIFirstRevision is the resourceVersion of APIFirst, and
	// APIFirstInEtcd the revision etcd last wrote its key under KeyPrefix
	// at, as of Revision (0: etcd holds no such key). In one etcd a
	// revision is one write of one key: equal, they are the same key.
	APIFirstRevision int64 `json:"apiFirstRevision,omitempty"`
	APIFirstInEtcd   int64 `json:"apiFirstInEtcd,omitempty"`
	// APICountUnknown says the API listed the resource without saying how
	// many objects it holds (no remainingItemCount).
	APICountUnknown bool `json:"apiCountUnknown,omitempty"`
	// SharedEtcd is ScanOptions.SharedEtcd.
	SharedEtcd bool `json:"sharedEtcd,omitempty"`
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
	// expectKey is ScanOptions.ExpectKey; keyIDs count, by KMS v2 key ID,
	// the objects under the provider it names, and nameOnly, by key, the
	// objects a key ID given alone would match as a key's name.
	expectKey KeyWant
	keyIDs    map[string]int
	nameOnly  map[string]int
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

// Scan reads every object of a resource from etcd, at one revision where
// etcd keeps it, and counts them. It first asks etcd for the number of keys
// alone (no values) and the API for its count at that revision, then lists
// the keys a large page at a time and reads their values in small ranges
// between listed keys, each dropped before the next: memory holds one page
// of keys and at most MaxPageBytes of values, not the resource.
func Scan(ctx context.Context, etcd Reader, gr schema.GroupResource, crd bool, opts ScanOptions) (*Report, error) {
	pageValues := opts.PageValues()
	var limiter *rate.Limiter
	if opts.Rate > 0 {
		limiter = rate.NewLimiter(rate.Limit(opts.Rate), int(pageValues))
	}
	prefix := KeyPrefix(opts.Prefix, gr, crd)
	s := &scan{etcd: etcd, end: clientv3.GetPrefixRangeEnd(prefix), pageValues: pageValues, limiter: limiter, opts: opts}
	s.report = &Report{
		Resource: gr, KeyPrefix: prefix, Snapshot: true, SharedEtcd: opts.SharedEtcd,
		Versions: map[string]*Count{}, Keys: map[string]*Count{}, Encodings: map[Encoding]int{},
		expectKey: opts.ExpectKey,
	}
	if !opts.ExpectKey.empty() {
		s.report.NotUnderKey = &Count{}
	}
	first, err := etcd.Get(ctx, prefix, clientv3.WithRange(s.end), clientv3.WithCountOnly())
	if err != nil {
		return nil, fmt.Errorf("counting keys under %s: %w", prefix, err)
	}
	r := s.report
	r.Revision, r.KeysAtRevision = first.Header.Revision, first.Count
	if opts.APICount != nil {
		r.holdAgainstAPI(ctx, opts.APICount)
		if err := s.findAPIFirst(ctx); err != nil {
			return nil, err
		}
	}
	if first.Count == 0 {
		return r, nil
	}
	from := prefix
	for {
		keys, err := s.get(ctx, from, s.end, clientv3.WithLimit(keyPage), clientv3.WithKeysOnly())
		if err != nil {
			return nil, err
		}
		if r.EtcdFirst == "" && len(keys.Kvs) > 0 {
			r.EtcdFirst = ObjectName(prefix, string(keys.Kvs[0].Key))
		}
		for i := 0; i < len(keys.Kvs); i += int(pageValues) {
			chunk := keys.Kvs[i:min(len(keys.Kvs), i+int(pageValues))]
			last := string(chunk[len(chunk)-1].Key) + "\x00"
			if err := s.values(ctx, string(chunk[0].Key), last); err != nil {
				return nil, err
			}
		}
		if !keys.More || len(keys.Kvs) == 0 {
			return r, nil
		}
		from = string(keys.Kvs[len(keys.Kvs)-1].Key) + "\x00"
	}
}

// ErrRevisionNotInAPI is APICount's error for a revision the API's etcd
// does not have: a later one than it holds, or one it compacted.
var ErrRevisionNotInAPI = errors.New("the API's etcd has no such revision")

// ErrNoAPICount is APICount's error for a list that did not say how many
// objects the API holds (no remainingItemCount): its count is not known.
var ErrNoAPICount = errors.New("the API gave no count")

// findAPIFirst reads, at the report's revision, the key of the first object
// the API listed there: the revision etcd last wrote it at.
func (s *scan) findAPIFirst(ctx context.Context) error {
	r := s.report
	if r.APIFirst == "" || r.APIFirstRevision == 0 {
		return nil
	}
	resp, err := s.etcd.Get(ctx, r.KeyPrefix+r.APIFirst, clientv3.WithRev(r.Revision), clientv3.WithKeysOnly())
	if errors.Is(err, rpctypes.ErrCompacted) {
		// The read is of no one moment now; Judge says so.
		r.Snapshot = false
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading the key of %s under %s: %w", r.APIFirst, r.KeyPrefix, err)
	}
	if len(resp.Kvs) == 1 {
		r.APIFirstInEtcd = resp.Kvs[0].ModRevision
	}
	return nil
}

// holdAgainstAPI asks the API for its count at the report's revision. An
// empty read is held against the API's count now too: an etcd that is not
// the API's can be empty at a revision the API's etcd was empty at too.
func (r *Report) holdAgainstAPI(ctx context.Context, count func(context.Context, int64) (APIListing, error)) {
	listing, err := count(ctx, r.Revision)
	switch {
	case errors.Is(err, ErrRevisionNotInAPI):
		r.APIRevisionUnknown, r.APIError = true, err.Error()
		return
	case errors.Is(err, ErrNoAPICount):
		r.APICountUnknown, r.APIError = true, err.Error()
		return
	case err != nil:
		r.APIError = err.Error()
		return
	}
	r.APIObjects, r.APIFirst, r.APIFirstRevision = &listing.Count, listing.First, listing.FirstRevision
	if r.KeysAtRevision == 0 && listing.Count == 0 {
		if now, err := count(ctx, 0); err != nil {
			r.APICountUnknown, r.APIError = errors.Is(err, ErrNoAPICount), err.Error()
		} else {
			r.APIObjectsNow = &now.Count
		}
	}
}

// scan is one Scan's reader and state.
type scan struct {
	etcd       Reader
	end        string
	pageValues int64
	limiter    *rate.Limiter
	opts       ScanOptions
	report     *Report
}

// values reads and counts the values of the keys in [from, end), at most
// pageValues a request: the range was listed with at most that many keys,
// but at a newer revision (after a compaction) more may have come.
func (s *scan) values(ctx context.Context, from, end string) error {
	for {
		if s.limiter != nil {
			if err := s.limiter.WaitN(ctx, int(s.pageValues)); err != nil {
				return err
			}
		}
		resp, err := s.get(ctx, from, end, clientv3.WithLimit(s.pageValues))
		if err != nil {
			return err
		}
		for _, kv := range resp.Kvs {
			s.report.count(ObjectName(s.report.KeyPrefix, string(kv.Key)), kv.Value, s.opts)
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// get reads [from, end) at the scan's revision while etcd keeps it, and at
// the newest one after etcd compacted it.
func (s *scan) get(ctx context.Context, from, end string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	for {
		get := append([]clientv3.OpOption{clientv3.WithRange(end)}, opts...)
		if s.report.Snapshot {
			get = append(get, clientv3.WithRev(s.report.Revision))
		}
		resp, err := s.etcd.Get(ctx, from, get...)
		if errors.Is(err, rpctypes.ErrCompacted) && s.report.Snapshot {
			s.report.Snapshot = false
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s from etcd: %w", s.report.KeyPrefix, err)
		}
		return resp, nil
	}
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
	if r.NotUnderKey != nil {
		r.expect(s, value, name, opts.Names)
	}
}

// expect holds one value against ScanOptions.ExpectKey.
func (r *Report) expect(s Stored, value []byte, name string, keep int) {
	want := r.expectKey
	if !want.matches(s, value) {
		r.NotUnderKey.add(name, keep)
		if want.KeyID != "" && s.Encoding == Encrypted && s.Key == want.KeyID {
			if r.nameOnly == nil {
				r.nameOnly = map[string]int{}
			}
			r.nameOnly[s.KeyLabel()]++
		}
		return
	}
	if want.Provider == KMSv2 {
		if r.keyIDs == nil {
			r.keyIDs = map[string]int{}
		}
		r.keyIDs[s.KeyID]++
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
