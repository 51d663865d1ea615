// Package quota keeps every rewrite restow makes within etcd's space: the
// bytes its writes keep alive until a compaction, against what the database
// has room for under its quota (Budget), read from etcd or from the API
// server (Source).
package quota

import (
	"context"
	"fmt"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// The model of etcd's room, as restow paces by it.
//
// Every rewrite is a new revision of its key. The value it replaced stays
// in the database until a compaction passes the rewrite's revision
// (kube-apiserver compacts every 5 minutes, to the revision it saw at the
// tick before, so 5 to 10 minutes); a rewrite of an object of v bytes keeps
// about v more bytes alive until then. etcd refuses a write, and raises its
// NOSPACE alarm, which refuses every write in the cluster, when its
// database file plus the write would reach --quota-backend-bytes. The file
// is bbolt's high-water mark: a compaction frees pages inside it for reuse,
// only a defragmentation shrinks it.
//
// A Reading gives, for the worst member: the file (F), the bytes in use
// inside it (U; the file where the source cannot see inside), and the quota
// (Q). Restow's own bytes alive (A) are its rewrites no compaction is known
// to have passed; those that ended before the reading are in U already
// (included). The margin (M) is the largest value etcd takes
// (--max-request-bytes, 1.5 MiB by default; more if restow wrote a larger
// one) and one step of bbolt's file growth (16 MiB): a large value needs
// contiguous free pages, and bbolt grows the file by a step when none are
// left. A write of c bytes goes ahead when both hold:
//
//   - its share: A + c stays within Share of the room besides restow's own
//     bytes alive, Q - M - (U - included); other clients keep the rest;
//   - the file: F + the bytes written since the reading + c + M stays within
//     Q, as if every one of them grew the file.
//
// When either fails restow reads again; if still not, it waits for a
// compaction past its oldest revisions alive, and stops (ErrStalled) when
// none comes within CompactionBound, or when nothing of its own is alive
// and one object still does not fit. It never writes while a member
// reports an alarm. Separate processes (the manager, kubectl restow run,
// prepare) each keep their own budget: each one's readings include what the
// others wrote, so a second one takes its share of what the first left, and
// each one's file check reads again before it could reach the quota.

// Defaults of a Budget.
const (
	// DefaultQuotaBytes is etcd's default --quota-backend-bytes: the quota
	// assumed where the source does not report one.
	DefaultQuotaBytes = 2 << 30
	// DefaultShare is the share of the room restow's bytes alive may take.
	DefaultShare = 0.5
	// DefaultCompactionBound is how long restow waits for a compaction past
	// its writes before it stops: three of kube-apiserver's default
	// compaction intervals.
	DefaultCompactionBound = 15 * time.Minute
	// MinMargin is the room kept free under the quota whatever the sizes:
	// etcd's default --max-request-bytes (1.5 MiB, no value etcd takes is
	// larger) and one step of bbolt's file growth (its AllocSize, 16 MiB:
	// past 16 MiB the file grows by that much when no free page is left),
	// rounded up.
	MinMargin = 18 << 20
	// MaxValueBytes is etcd's default --max-request-bytes: the size assumed
	// for an object whose size restow cannot know.
	MaxValueBytes = 3 << 19
	// refreshEvery is how often a budget that has room reads again anyway:
	// for what others wrote, an alarm, and the sizes it estimated.
	refreshEvery = 10 * time.Second
	// unsettled is how long after a write whose answer never came restow
	// takes it to be in flight still: twice kube-apiserver's default
	// --request-timeout. Then it counts as stored at etcd's revision.
	unsettled = 2 * time.Minute
	// unknownRevision marks writes whose revision is not known yet.
	unknownRevision = math.MaxInt64
	// refreshAtMost is how often a budget that lacks room reads again.
	refreshAtMost = time.Second
	// readFailureBound is how long writes wait for a reading that keeps
	// failing before they fail with it.
	readFailureBound = time.Minute
	// compactionPoll is how often a budget waiting for a compaction looks.
	compactionPoll = time.Second
)

// Reasons of an ErrStalled: what a StorageMigration's Stalled condition
// says.
const (
	// ReasonAlarm: an etcd member reports an alarm.
	ReasonAlarm = "EtcdAlarm"
	// ReasonQuota: not one more object fits under the quota.
	ReasonQuota = "EtcdQuota"
	// ReasonNotCompacting: no compaction came within the bound.
	ReasonNotCompacting = "EtcdNotCompacting"
	// ReasonUnknown: restow may not read etcd's size where it looks.
	ReasonUnknown = "EtcdSpaceUnknown"
)

// Reading is what a Source saw of etcd's database at one moment.
type Reading struct {
	At time.Time
	// FileBytes and InUseBytes are the worst member's database file and
	// the bytes in use in it (FileBytes where the source cannot see).
	FileBytes, InUseBytes int64
	// QuotaBytes is the smallest member quota, or the assumed one.
	QuotaBytes int64
	// Alarms names the alarms members report ("NOSPACE on member 8e9e…").
	Alarms []string
	// Source is SourceEtcd or SourceAPIServer; Assumes says what the
	// reading could not see and took as given.
	Source, Assumes string
}

// Where a Reading came from.
const (
	// SourceEtcd: every member's own Status and the alarm list.
	SourceEtcd = "etcd"
	// SourceAPIServer: the API server's apiserver_storage_size_bytes (the
	// file of the member it asked) and a quota flag.
	SourceAPIServer = "API server metrics"
)

// Source reads etcd's database sizes.
type Source interface {
	Read(ctx context.Context) (Reading, error)
}

// Probe tells a budget what it cannot read from its source: whether etcd
// compacted past a revision (a read at it answers that it was compacted),
// and etcd's revision now. A Source that can tell itself (etcd's own
// client) is a Probe; otherwise each Acquire brings one (lists of the
// pass's resource).
type Probe interface {
	Compacted(ctx context.Context, revision int64) (bool, error)
	Revision(ctx context.Context) (int64, error)
}

// ReadError is a failed reading of the source: with nothing seen, nothing
// is written.
type ReadError struct{ Err error }

func (e *ReadError) Error() string {
	return "reading etcd's database size, which restow writes only within: " + e.Err.Error()
}
func (e *ReadError) Unwrap() error { return e.Err }

// ErrStalled stops a pass: its writes cannot go on without a person.
type ErrStalled struct {
	Reason, Message string
}

func (e *ErrStalled) Error() string { return e.Message }

// Stats is what a budget shows (metrics, status).
type Stats struct {
	AliveBytes, BudgetBytes int64
	// Waits counts the times a write waited for a compaction.
	Waits int64
	// Compactions counts the compactions seen past restow's writes.
	Compactions int64
	// Readings counts the reads of the source.
	Readings int64
	// Blocked is the reason writes are stopped, or "".
	Blocked string
	Last    Reading
}

// Budget paces writes by the bytes they keep alive in etcd. It is shared by
// every pass of one process; its zero value is not usable: use New.
type Budget struct {
	source Source
	// QuotaBytes, Share, LimitBytes and CompactionBound tune it; set them
	// before the first Acquire.
	Share float64
	// LimitBytes, when positive, is the budget itself (a user's flag),
	// still within the file check.
	LimitBytes      int64
	CompactionBound time.Duration
	// Changed, if set, is told the stats whenever they change (metrics).
	Changed func(Stats)

	now func() time.Time
	// slow lets one waiter at a time read and poll; a chan, so that a
	// waiter whose pass ends stops waiting for it.
	slow chan struct{}
	// notifying delivers stats in the order they were taken.
	notifying sync.Mutex

	mu      sync.Mutex
	reading Reading
	read    bool
	readAt  time.Time
	pending int64
	alive   []spent // by revision
	// aliveSum and includedSum are the bytes of alive, and of those the
	// reading saw.
	aliveSum, includedSum int64
	largest               int64
	blocked               string
	stalled               error
	// lastTry is the last try to read; readErr its error while readings
	// fail, since failingSince.
	lastTry, failingSince time.Time
	readErr               error
	newest                int64
	waits                 atomic.Int64
	compacts              atomic.Int64
	readings              atomic.Int64
}

// spent is the bytes of a bucket of writes, alive until a compaction
// passes revision, the newest of them (unknownRevision while one may still
// be in flight); ended is when the last of them ended.
type spent struct {
	revision int64
	bytes    int64
	ended    time.Time
	writes   int
}

// A bucket holds at most bucketWrites writes and bucketBytes bytes: few
// buckets for many small objects, and for large ones a bucket a compaction
// frees without waiting for the newest writes of the pass.
const (
	bucketWrites = 1024
	bucketBytes  = 4 << 20
)

// New is a budget over source with the defaults.
func New(source Source) *Budget {
	return &Budget{source: source, Share: DefaultShare, CompactionBound: DefaultCompactionBound, now: time.Now, slow: make(chan struct{}, 1)}
}

// Acquire waits until a write of size bytes fits, and reserves it: the
// caller ends it with Spend or Release. It returns an *ErrStalled when the
// write cannot fit without a person, and ctx's error when ctx ends.
// compacted looks for a compaction where the source cannot; waiting, if
// set, is told what a wait for one waits for, and "" when it ends.
func (b *Budget) Acquire(ctx context.Context, size int64, probe Probe, waiting func(string)) (int64, error) {
	cost := Cost(size)
	if p, ok := b.source.(Probe); ok {
		probe = p
	}
	for {
		if b.reserve(cost) {
			return cost, nil
		}
		if err := b.makeRoom(ctx, cost, probe, waiting); err != nil {
			return 0, err
		}
	}
}

// reserve reserves cost if it fits the last reading, fresh enough.
func (b *Budget) reserve(cost int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.freshLocked() || b.stalled != nil {
		return false
	}
	if !b.fits(cost) {
		return false
	}
	b.pending += cost
	return true
}

// fits applies the two checks of the model to a write of cost bytes.
func (b *Budget) fits(cost int64) bool {
	r := b.reading
	alive, included := b.aliveBytes()
	margin := b.margin()
	unincluded := alive - included + b.pending
	if r.FileBytes+unincluded+cost+margin > r.QuotaBytes {
		return false
	}
	return alive+b.pending+cost <= b.budgetBytes(included)
}

// budgetBytes is the bytes restow may keep alive at once, given how many of
// them the reading includes.
func (b *Budget) budgetBytes(included int64) int64 {
	if b.LimitBytes > 0 {
		return b.LimitBytes
	}
	r := b.reading
	room := r.QuotaBytes - b.margin() - (r.InUseBytes - included)
	return max(0, int64(b.Share*float64(room)))
}

func (b *Budget) margin() int64 { return MinMargin + max(0, b.largest-MaxValueBytes) }

// aliveBytes is restow's bytes alive, and those of them the reading saw.
func (b *Budget) aliveBytes() (alive, included int64) { return b.aliveSum, b.includedSum }

// sumAlive recomputes both sums from the buckets, after a reading or a
// compaction changed which are alive or seen.
func (b *Budget) sumAlive() {
	b.aliveSum, b.includedSum = 0, 0
	for _, s := range b.alive {
		b.aliveSum += s.bytes
		if s.ended.Before(b.reading.At) {
			b.includedSum += s.bytes
		}
	}
}

// freshLocked: the last reading may be written by; a compaction seen
// zeroes readAt, so the next write reads first.
func (b *Budget) freshLocked() bool {
	return b.read && !b.readAt.IsZero() && b.now().Sub(b.readAt) <= refreshEvery
}

// Spend records a reserved write that the API server stored at revision.
// A write after the newest joins its bucket, so that the buckets, not the
// writes, grow with a pass: a bucket is freed once a compaction passes its
// newest revision, and seen by a reading once its last write ended before
// it.
func (b *Budget) Spend(cost, revision int64) {
	b.mu.Lock()
	b.pending -= cost
	b.largest = max(b.largest, cost)
	b.newest = max(b.newest, revision)
	now := b.now()
	b.aliveSum += cost
	if n := len(b.alive); n > 0 && revision >= b.alive[n-1].revision && b.alive[n-1].writes < bucketWrites && b.alive[n-1].bytes+cost <= bucketBytes {
		last := &b.alive[n-1]
		if last.ended.Before(b.reading.At) {
			b.includedSum -= last.bytes
		}
		last.revision, last.ended = revision, now
		last.bytes += cost
		last.writes++
	} else {
		i := sort.Search(len(b.alive), func(i int) bool { return b.alive[i].revision > revision })
		b.alive = append(b.alive, spent{})
		copy(b.alive[i+1:], b.alive[i:])
		b.alive[i] = spent{revision: revision, bytes: cost, ended: now, writes: 1}
	}
	b.mu.Unlock()
	b.notify()
}

// SpendUnknown records a reserved write whose outcome is unknown (the
// request failed without an answer): it may still be stored, while the API
// server has it, so its revision is taken once it can no longer be in
// flight (unsettled), as etcd's revision then.
func (b *Budget) SpendUnknown(cost int64) { b.Spend(cost, unknownRevision) }

// Release returns a reserved write that stored nothing.
func (b *Budget) Release(cost int64) {
	b.mu.Lock()
	b.pending -= cost
	b.mu.Unlock()
}

// Cost is what a write of an object of size bytes keeps alive: the value,
// its key and revision, in whole bbolt pages once it spans more than one.
func Cost(size int64) int64 {
	const page, overhead = 4096, 512
	if size = max(size, 0) + overhead; size <= page/2 {
		return size
	}
	return (size + page - 1) / page * page
}

// Stats is what the budget shows now.
func (b *Budget) Stats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.statsLocked()
}

func (b *Budget) statsLocked() Stats {
	alive, included := b.aliveBytes()
	s := Stats{AliveBytes: alive, Waits: b.waits.Load(), Compactions: b.compacts.Load(), Readings: b.readings.Load(), Blocked: b.blocked, Last: b.reading}
	if b.read {
		s.BudgetBytes = b.budgetBytes(included)
	}
	return s
}

// notify tells Changed the stats, taken and delivered in order.
func (b *Budget) notify() {
	if b.Changed == nil {
		return
	}
	b.notifying.Lock()
	defer b.notifying.Unlock()
	b.Changed(b.Stats())
}

// Describe says what the budget is now and what it assumes, for a person.
func (b *Budget) Describe() string {
	s := b.Stats()
	r := s.Last
	text := fmt.Sprintf("etcd's database file %s, %s in use, quota %s (from %s); restow's rewrites alive until a compaction %s of a budget of %s",
		MiB(r.FileBytes), MiB(r.InUseBytes), MiB(r.QuotaBytes), r.Source, MiB(s.AliveBytes), MiB(s.BudgetBytes))
	if r.Assumes != "" {
		text += "; assumed: " + r.Assumes
	}
	return text
}

// MiB writes bytes in MiB.
func MiB(bytes int64) string { return fmt.Sprintf("%.1f MiB", float64(bytes)/(1<<20)) }
