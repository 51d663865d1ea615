package migrator

import (
	"context"
	"sync"
)

// gate counts the migrations under way (Migrate, from its first read to
// its prune, the settle window included) and the passes that list and
// rewrite now (those holding a pass slot), and lets background work (a built-in resource's baseline, the
// periodic reads of discovery and of the API servers' encryption state)
// wait until none does: the pass a user waits for has the API server to
// itself.
type gate struct {
	mu   sync.Mutex
	busy int
	// idle is closed when busy falls to zero; nil while it is zero.
	idle chan struct{}
}

func (g *gate) enter() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.busy == 0 {
		g.idle = make(chan struct{})
	}
	g.busy++
}

func (g *gate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.busy--
	if g.busy == 0 {
		close(g.idle)
		g.idle = nil
	}
}

// wait returns nil once no pass rewrites, or ctx's error.
func (g *gate) wait(ctx context.Context) error {
	g.mu.Lock()
	idle := g.idle
	g.mu.Unlock()
	if idle == nil {
		return nil
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Rewriting reports whether any migration of this Migrator is under way,
// or any pass lists and rewrites. Background work asks before it reads the API servers, and waits
// (WaitIdle) or looks again later while one does.
func (m *Migrator) Rewriting() bool {
	m.rewriting.mu.Lock()
	defer m.rewriting.mu.Unlock()
	return m.rewriting.busy > 0
}

// WaitIdle returns once no migration of this Migrator is under way and no
// pass lists and rewrites, or with ctx's error.
func (m *Migrator) WaitIdle(ctx context.Context) error { return m.rewriting.wait(ctx) }

// Hold counts as a migration under way until release is called (more calls
// of release do nothing): a run about to start holds it from its launch, so
// background work that asks between the launch and Migrate's own entry
// waits as it would for the run.
func (m *Migrator) Hold() (release func()) {
	m.rewriting.enter()
	return sync.OnceFunc(m.rewriting.leave)
}
