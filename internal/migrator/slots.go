package migrator

import (
	"context"
)

// DefaultMaxPasses is Migrator.MaxPasses by default: each pass holds a few
// pages of metadata and paces itself to what the API server can take, so a
// backlog of many resources (a manager starting on a cluster where many
// CRDs switched) is worked off a few at a time, not all at once.
const DefaultMaxPasses = 4

// DefaultMaxBuiltInPasses is Migrator.MaxBuiltInPasses by default: one
// built-in resource at a time.
const DefaultMaxBuiltInPasses = 1

// passSlot waits until fewer than MaxPasses passes list and rewrite (and,
// for a built-in resource, fewer than MaxBuiltInPasses of those), and
// returns the function that frees the slots it took.
func (m *Migrator) passSlot(ctx context.Context, builtIn bool) (func(), error) {
	if !builtIn {
		return m.slot(ctx)
	}
	select {
	case m.builtInPassSlots() <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	release, err := m.slot(ctx)
	if err != nil {
		<-m.builtInSlots
		return nil, err
	}
	return func() {
		release()
		<-m.builtInSlots
	}, nil
}

// slot takes one of MaxPasses slots.
func (m *Migrator) slot(ctx context.Context) (func(), error) {
	slots := m.passSlots()
	select {
	case slots <- struct{}{}:
		m.rewriting.enter()
		m.slotsChanged(slots)
		return func() {
			<-slots
			m.rewriting.leave()
			m.slotsChanged(slots)
		}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (m *Migrator) slotsChanged(slots chan struct{}) {
	if m.SlotsChanged != nil {
		m.SlotsChanged(len(slots))
	}
}

func (m *Migrator) passSlots() chan struct{} {
	m.slotsOnce.Do(func() {
		n := m.MaxPasses
		if n <= 0 {
			n = DefaultMaxPasses
		}
		m.slots = make(chan struct{}, n)
		b := m.MaxBuiltInPasses
		if b <= 0 {
			b = DefaultMaxBuiltInPasses
		}
		m.builtInSlots = make(chan struct{}, min(b, n))
	})
	return m.slots
}

func (m *Migrator) builtInPassSlots() chan struct{} {
	m.passSlots()
	return m.builtInSlots
}

// charge adds n to what the passes hold of listed objects, unless that
// would pass budget.
func (m *Migrator) charge(n, budget int64) bool {
	for {
		held := m.bodyBytes.Load()
		if held+n > budget {
			return false
		}
		if m.bodyBytes.CompareAndSwap(held, held+n) {
			return true
		}
	}
}

// slotsBusy reports whether every pass slot a pass needs is taken now.
func (m *Migrator) slotsBusy(builtIn bool) bool {
	slots, builtIns := m.passSlots(), m.builtInPassSlots()
	return len(slots) == cap(slots) || builtIn && len(builtIns) == cap(builtIns)
}
