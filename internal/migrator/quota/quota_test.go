package quota

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// fakeSource is etcd as a table: a file that grows with what is written
// and not freed, a compaction revision the test moves.
type fakeSource struct {
	mu        sync.Mutex
	file      int64
	inUse     int64
	quota     int64
	alarms    []string
	compacted int64
	revision  int64
	reads     int
}

func (f *fakeSource) Read(context.Context) (Reading, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	return Reading{FileBytes: f.file, InUseBytes: f.inUse, QuotaBytes: f.quota, Alarms: f.alarms, Source: SourceEtcd}, nil
}

func (f *fakeSource) Compacted(_ context.Context, revision int64) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return revision < f.compacted, nil
}

func (f *fakeSource) Revision(context.Context) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.revision, nil
}

// write is one rewrite of size bytes: acquired, then stored at revision
// with its bytes alive in the fake etcd.
func write(t *testing.T, b *Budget, f *fakeSource, size, revision int64) error {
	t.Helper()
	cost, err := b.Acquire(t.Context(), size, nil, nil)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.inUse += cost
	f.file = max(f.file, f.inUse)
	f.mu.Unlock()
	b.Spend(cost, revision)
	return nil
}

const mib = 1 << 20

func TestBudgetKeepsToHalfTheRoom(t *testing.T) {
	f := &fakeSource{file: 150 * mib, inUse: 150 * mib, quota: 256 * mib}
	b := New(f)
	// Room besides restow's own: 256 - 18 (margin) - 150 = 88 MiB; half.
	written := int64(0)
	for rev := int64(1); ; rev++ {
		if b.reserve(Cost(500 << 10)) {
			b.Release(Cost(500 << 10))
		} else if b.read {
			break
		}
		if err := write(t, b, f, 500<<10, rev); err != nil {
			t.Fatal(err)
		}
		written += Cost(500 << 10)
		if written > 200*mib {
			t.Fatal("the budget never bound")
		}
	}
	if budget := int64(44 * mib); written > budget || written < budget-mib {
		t.Errorf("wrote %s before waiting, want about half the room, %s", MiB(written), MiB(budget))
	}
}

func TestBudgetWaitsForCompaction(t *testing.T) {
	f := &fakeSource{file: 100 * mib, inUse: 100 * mib, quota: 192 * mib}
	b := New(f)
	b.LimitBytes = 12 * Cost(mib)
	for rev := int64(1); rev <= 12; rev++ {
		if err := write(t, b, f, mib, rev); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- write(t, b, f, mib, 13) }()
	select {
	case err := <-done:
		t.Fatalf("a write past the budget went ahead without a compaction: %v (%s)", err, b.Describe())
	case <-time.After(3 * compactionPoll):
	}
	// A compaction past revision 12: the bucket of the twelve is freed.
	f.mu.Lock()
	f.compacted, f.inUse = 13, f.inUse-12*Cost(mib)
	f.mu.Unlock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s := b.Stats(); s.Waits != 1 || s.Compactions != 1 {
		t.Errorf("stats %+v, want one wait and one compaction seen", s)
	}
}

func TestBudgetStalls(t *testing.T) {
	for _, tc := range []struct {
		name   string
		source *fakeSource
		reason string
	}{
		{"an alarm", &fakeSource{file: mib, inUse: mib, quota: 128 * mib, alarms: []string{"NOSPACE on member 1"}}, ReasonAlarm},
		{"no room for one object", &fakeSource{file: 127 * mib, inUse: 20 * mib, quota: 128 * mib}, ReasonQuota},
		{"no compaction", &fakeSource{file: 100 * mib, inUse: 100 * mib, quota: 160 * mib}, ReasonNotCompacting},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := New(tc.source)
			b.CompactionBound = 2 * compactionPoll
			var err error
			for rev := int64(1); err == nil && rev < 100; rev++ {
				err = write(t, b, tc.source, mib, rev)
			}
			var stalled *ErrStalled
			if !errors.As(err, &stalled) || stalled.Reason != tc.reason {
				t.Fatalf("got %v, want a stall for %s", err, tc.reason)
			}
			if b.Stats().Blocked != tc.reason {
				t.Errorf("Blocked = %q", b.Stats().Blocked)
			}
		})
	}
}

func TestBudgetLimitFlag(t *testing.T) {
	f := &fakeSource{file: mib, inUse: mib, quota: 2 << 30}
	b := New(f)
	b.LimitBytes = 4 * mib
	b.CompactionBound = compactionPoll
	var err error
	n := 0
	for rev := int64(1); err == nil; rev++ {
		if err = write(t, b, f, mib-1024, rev); err == nil {
			n++
		}
	}
	if n != 4 {
		t.Errorf("%d writes of about a MiB within a budget of 4 MiB, want 4", n)
	}
}

func TestCost(t *testing.T) {
	for size, want := range map[int64]int64{0: 512, 1000: 1512, 4000: 8192, 500 << 10: 516096} {
		if got := Cost(size); got != want {
			t.Errorf("Cost(%d) = %d, want %d", size, got, want)
		}
	}
}

// TestBudgetBuckets: writes after the newest share a bucket of at most
// bucketWrites, so that a pass of many objects keeps a few buckets, not a
// record per write; a write older than the newest gets its own, in
// revision order; a compaction frees a bucket only past its newest write.
func TestBudgetBuckets(t *testing.T) {
	f := &fakeSource{file: mib, inUse: mib, quota: 2 << 30}
	b := New(f)
	for rev := int64(1); rev <= 2*bucketWrites+1; rev++ {
		if err := write(t, b, f, 100, rev*2); err != nil {
			t.Fatal(err)
		}
	}
	if err := write(t, b, f, 100, 3); err != nil {
		t.Fatal(err)
	}
	if n := len(b.alive); n != 4 {
		t.Fatalf("%d buckets for %d writes, want 4", n, 2*bucketWrites+2)
	}
	if b.alive[0].revision != 3 || b.alive[1].revision != 2*bucketWrites {
		t.Errorf("buckets end at revisions %d, %d, want 3, %d", b.alive[0].revision, b.alive[1].revision, 2*bucketWrites)
	}
	f.compacted = 2*bucketWrites + 1 // past the first two buckets only
	if freed, err := b.collect(t.Context(), f); err != nil || !freed {
		t.Fatalf("collect: %v, %v", freed, err)
	}
	if n, want := b.Stats().AliveBytes, int64(bucketWrites+1)*Cost(100); len(b.alive) != 2 || n != want {
		t.Errorf("after the compaction: %d buckets of %d bytes, want 2 of %d", len(b.alive), n, want)
	}
}

// TestBudgetUnknownOutcome: a write whose answer never came stays alive,
// whatever compactions pass, while it may still be in flight; then it
// takes etcd's revision of that moment, and only a compaction past that
// frees it.
func TestBudgetUnknownOutcome(t *testing.T) {
	f := &fakeSource{file: mib, inUse: mib, quota: 2 << 30, revision: 100, compacted: 100}
	b := New(f)
	clock := time.Now()
	b.now = func() time.Time { return clock }
	cost, err := b.Acquire(t.Context(), mib, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.SpendUnknown(cost)
	if freed, err := b.collect(t.Context(), f); err != nil || freed {
		t.Fatalf("a write that may be in flight was freed (%v, %v)", freed, err)
	}
	clock = clock.Add(unsettled)
	f.revision = 150 // etcd moved on meanwhile
	if freed, err := b.collect(t.Context(), f); err != nil || freed {
		t.Fatalf("freed by a compaction at 100, before the revision it took, 150 (%v, %v)", freed, err)
	}
	if b.alive[0].revision != 150 {
		t.Fatalf("the settled write is at revision %d, want 150", b.alive[0].revision)
	}
	f.compacted = 151
	if freed, err := b.collect(t.Context(), f); err != nil || !freed || b.Stats().AliveBytes != 0 {
		t.Fatalf("a compaction past 150 did not free it (%v, %v, %d bytes alive)", freed, err, b.Stats().AliveBytes)
	}
}

// flakySource fails its readings until a time, as an API server restarting.
type flakySource struct {
	fakeSource
	until time.Time
}

func (f *flakySource) Read(ctx context.Context) (Reading, error) {
	r, err := f.fakeSource.Read(ctx)
	if time.Now().Before(f.until) {
		return Reading{}, errors.New("connection refused")
	}
	return r, err
}

// TestBudgetReadingFails: while readings fail, many writers wait for one
// reading a second between them, not one each, and all go ahead once one
// succeeds.
func TestBudgetReadingFails(t *testing.T) {
	f := &flakySource{fakeSource: fakeSource{file: mib, inUse: mib, quota: 2 << 30}, until: time.Now().Add(2 * time.Second)}
	b := New(f)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 64 {
		wg.Go(func() {
			cost, err := b.Acquire(t.Context(), 100, f, nil)
			if err == nil {
				b.Release(cost)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if f.reads > 5 {
		t.Errorf("%d readings for 64 writers over 2 s of failures, want one a second", f.reads)
	}
}
