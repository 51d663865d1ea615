package quota

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/restow/restow/internal/migrator/pace"
)

// What a budget does when a write does not fit: read again, wait for a
// compaction past restow's oldest writes, or stop. One waiter at a time
// reads and polls; the others find the room it made.

// makeRoom reads again, or waits for a compaction, until a write of cost
// might fit; it returns an *ErrStalled when it cannot without a person.
func (b *Budget) makeRoom(ctx context.Context, cost int64, probe Probe, waiting func(string)) error {
	release, err := b.takeSlow(ctx)
	if err != nil {
		return err
	}
	defer release()
	if b.mayReadAgain() {
		return b.readOrWait(ctx)
	}
	b.mu.Lock()
	fresh, failing := b.freshLocked(), b.readErr
	stalled, fits, alive, pending := b.stalled, b.fits(cost), len(b.alive) > 0, b.pending > 0
	b.mu.Unlock()
	switch {
	case !fresh && failing != nil && b.now().Sub(b.failingSince) >= readFailureBound:
		return failing
	case !fresh:
		// A reading is due, and the last try was a moment ago.
		return b.untilNextTry(ctx)
	case stalled != nil:
		// Until a reading says otherwise.
		return stalled
	case fits:
		return nil
	case pending:
		// Writes in flight will be alive, or released, soon: only then
		// does a compaction past them free anything.
		return pace.SleepUntil(ctx, b.now().Add(50*time.Millisecond))
	case alive:
		return b.waitForCompaction(ctx, probe, waiting)
	}
	// This object does not fit; a smaller one of another pass may: the
	// stop is this pass's, not the budget's.
	return b.stallOnce(ReasonQuota, fmt.Sprintf(
		"an object of %s does not fit under etcd's quota with restow's margin of %s, and no rewrite of restow's is waiting for a compaction: %s. Before etcd raises its NOSPACE alarm, which refuses every write in the cluster: defragment each etcd member in turn (etcdctl defrag --endpoints=<one member>), or raise --quota-backend-bytes; if the alarm was raised, disarm it after (etcdctl alarm disarm)",
		MiB(cost), MiB(b.marginNow()), b.Describe()))
}

// takeSlow waits for the waiter's turn, or for ctx to end.
func (b *Budget) takeSlow(ctx context.Context) (func(), error) {
	select {
	case b.slow <- struct{}{}:
		return func() { <-b.slow }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// mayReadAgain: the last try to read is older than refreshAtMost, or none
// was made (a compaction seen clears it).
func (b *Budget) mayReadAgain() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lastTry.IsZero() || b.now().Sub(b.lastTry) >= refreshAtMost
}

// readOrWait reads the source. A failed reading is tried again once per
// refreshAtMost, by one waiter at a time while the others wait their turn,
// for up to readFailureBound (an API server restarting, or one whose etcd
// status is slow to come); after it, every write fails with it at once,
// as a transient error, until a reading succeeds.
func (b *Budget) readOrWait(ctx context.Context) error {
	err := b.refresh(ctx)
	var unread *ReadError
	if !errors.As(err, &unread) {
		return err
	}
	b.mu.Lock()
	failingFor := b.now().Sub(b.failingSince)
	b.mu.Unlock()
	if failingFor >= readFailureBound {
		return err
	}
	return b.untilNextTry(ctx)
}

// untilNextTry waits until the next reading may be tried.
func (b *Budget) untilNextTry(ctx context.Context) error {
	b.mu.Lock()
	next := b.lastTry.Add(refreshAtMost)
	b.mu.Unlock()
	return pace.SleepUntil(ctx, next)
}

// refresh reads the source, and stops writes while a member reports an
// alarm.
func (b *Budget) refresh(ctx context.Context) error {
	// Writes that ended before the read began are in it.
	start := b.now()
	r, err := b.source.Read(ctx)
	b.readings.Add(1)
	if err != nil {
		b.mu.Lock()
		b.lastTry, b.readErr = b.now(), &ReadError{Err: err}
		if b.failingSince.IsZero() {
			b.failingSince = start
		}
		b.mu.Unlock()
		return b.readErr
	}
	if r.At.IsZero() {
		r.At = start
	}
	if r.QuotaBytes <= 0 {
		r.QuotaBytes = DefaultQuotaBytes
	}
	b.mu.Lock()
	b.reading, b.read, b.readAt, b.blocked, b.stalled = r, true, b.now(), "", nil
	b.lastTry, b.readErr, b.failingSince = b.readAt, nil, time.Time{}
	b.sumAlive()
	b.mu.Unlock()
	if len(r.Alarms) > 0 {
		return b.stall(ReasonAlarm, fmt.Sprintf(
			"etcd reports %s: it refuses writes, and restow writes nothing until the alarm is disarmed. Free space first: compact, defragment each member in turn (etcdctl defrag), or raise --quota-backend-bytes; then etcdctl alarm disarm (%s)",
			strings.Join(r.Alarms, ", "), b.Describe()))
	}
	b.notify()
	return nil
}

// waitForCompaction polls until a compaction frees some of restow's writes,
// or stops once the oldest has waited CompactionBound.
func (b *Budget) waitForCompaction(ctx context.Context, probe Probe, waiting func(string)) error {
	b.waits.Add(1)
	b.notify()
	if waiting != nil {
		waiting("Waiting for etcd to compact past restow's rewrites before writing more: " + b.Describe())
		defer waiting("")
	}
	for {
		freed, err := b.collect(ctx, probe)
		if err != nil {
			return err
		}
		if freed {
			b.compacts.Add(1)
			b.mu.Lock()
			// The bytes freed show in the next reading, taken at once.
			b.readAt, b.lastTry = time.Time{}, time.Time{}
			b.mu.Unlock()
			return nil
		}
		// The oldest bucket is freed by a compaction past its newest
		// write: the bound counts from there.
		b.mu.Lock()
		oldest := b.alive[0].ended
		b.mu.Unlock()
		if waited := b.now().Sub(oldest); waited >= b.CompactionBound {
			return b.stall(ReasonNotCompacting, fmt.Sprintf(
				"restow's rewrites keep %s alive in etcd, its budget, and no compaction has passed the oldest in %s: %s. kube-apiserver compacts every --etcd-compaction-interval (5m by default; 0 turns it off, and then etcd's own --auto-compaction-retention decides). Compact etcd, or turn compaction on",
				MiB(b.Stats().AliveBytes), waited.Round(time.Second), b.Describe()))
		}
		if err := pace.SleepUntil(ctx, b.now().Add(compactionPoll)); err != nil {
			return err
		}
	}
}

// collect drops the buckets a compaction passed, finding the newest of
// them by halving (revisions compact in order), and reports whether it
// dropped any. Buckets with a write that may still be in flight wait until
// it cannot be (unsettled), then take etcd's revision of that moment.
func (b *Budget) collect(ctx context.Context, probe Probe) (bool, error) {
	if err := b.settleUnknown(ctx, probe); err != nil {
		return false, err
	}
	b.mu.Lock()
	var revisions []int64
	for _, s := range b.alive {
		if s.revision == unknownRevision {
			break // sorted last
		}
		revisions = append(revisions, s.revision)
	}
	b.mu.Unlock()
	// passed is how many of the oldest revisions a compaction passed.
	passed, low, high := 0, 0, len(revisions)
	for low < high {
		mid := (low + high) / 2
		ok, err := probe.Compacted(ctx, revisions[mid])
		if err != nil {
			return false, fmt.Errorf("looking for a compaction past restow's writes: %w", err)
		}
		if ok {
			passed, low = mid+1, mid+1
		} else {
			high = mid
		}
	}
	if passed == 0 {
		return false, nil
	}
	b.mu.Lock()
	// Buckets spent meanwhile sort in after the ones looked at, or among
	// them with a revision no later: a compaction past the newest looked
	// at passed them too.
	last := revisions[passed-1]
	kept := b.alive[:0]
	for _, s := range b.alive {
		if s.revision > last {
			kept = append(kept, s)
		}
	}
	b.alive = kept
	b.sumAlive()
	b.mu.Unlock()
	b.notify()
	return true, nil
}

// settleUnknown gives the buckets whose writes can no longer be in flight
// etcd's revision now, which any of them that was stored precedes.
func (b *Budget) settleUnknown(ctx context.Context, probe Probe) error {
	b.mu.Lock()
	due := false
	for _, s := range b.alive {
		due = due || s.revision == unknownRevision && b.now().Sub(s.ended) >= unsettled
	}
	b.mu.Unlock()
	if !due {
		return nil
	}
	revision, err := probe.Revision(ctx)
	if err != nil {
		return fmt.Errorf("reading etcd's revision: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range b.alive {
		if s := &b.alive[i]; s.revision == unknownRevision && b.now().Sub(s.ended) >= unsettled {
			s.revision = revision
		}
	}
	sort.SliceStable(b.alive, func(i, j int) bool { return b.alive[i].revision < b.alive[j].revision })
	return nil
}

// stall stops writes for reason.
func (b *Budget) stall(reason, message string) error {
	err := &ErrStalled{Reason: reason, Message: message}
	b.mu.Lock()
	b.blocked, b.stalled = reason, err
	b.mu.Unlock()
	b.notify()
	return err
}

// stallOnce stops the one write that asked, and shows the reason until the
// next reading.
func (b *Budget) stallOnce(reason, message string) error {
	b.mu.Lock()
	b.blocked = reason
	b.mu.Unlock()
	b.notify()
	return &ErrStalled{Reason: reason, Message: message}
}

func (b *Budget) marginNow() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.margin()
}

// Read reads the source now, as a first write would: for an estimate
// before any.
func (b *Budget) Read(ctx context.Context) error {
	release, err := b.takeSlow(ctx)
	if err != nil {
		return err
	}
	defer release()
	return b.refresh(ctx)
}
