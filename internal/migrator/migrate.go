package migrator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/metadata"

	"github.com/restow/restow/internal/migrator/pace"
	"github.com/restow/restow/internal/storedversions"
)

// The entry of the engine: Migrate (a whole migration) and FirstPass (its
// first pass alone), and the state of one migration. Calls go one way from
// here, in the order of a migration: the CRD's watch (history.go), the wait
// for every API server (switch.go, reporting through progress.go), the
// settle window (finish.go), the pass (pass.go, which lists through list.go
// and writes through write.go), the prune, and the encryption read again
// (encryptionmoved.go). What a migration goes back to, and why: the live
// CRD (history.go), read during the wait and after the pass; the settle
// window's end, read while the first pass runs and after it; the pass, run
// again as the re-check; the one timer helper, pace.SleepUntil. Leaves that
// every step uses: types.go (the public vocabulary), proof.go (what proves
// an object stored at the target), errors.go.

// Migrate runs a whole migration of target: the first pass over every
// object, then, for a CRD whose status.storedVersions lists other versions,
// the settle window, the re-check and the prune (with opts.Prune). It
// returns the result when it reached its end, with failures if objects
// could not be rewritten (nothing is pruned then); a *TransientError or
// *StalledError when it stopped, with the last Progress to resume from; and
// an error wrapping storedversions.ErrCRDChanged when the CRD changed
// meanwhile, so a new migration must start.
func (m *Migrator) Migrate(ctx context.Context, target Target, opts Options, observe Observer) (Result, error) {
	// A migration covers every object: only FirstPass starts after a token.
	opts.Continue = ""
	// Background work waits from the first read to the prune: the settle
	// window and the re-check are part of what the user waits for (gate.go).
	m.rewriting.enter()
	defer m.rewriting.leave()
	mg := newMigration(m, target, opts, observe)
	if err := mg.checkViaStatus(); err != nil {
		return mg.result(), err
	}
	ctx, abort := context.WithCancelCause(ctx)
	var window sync.WaitGroup
	defer window.Wait()
	defer abort(nil)
	result, err := mg.migrate(ctx, abort, &window)
	if cause := context.Cause(ctx); err != nil && errors.Is(cause, storedversions.ErrCRDChanged) {
		err = cause
	}
	if err == nil && target.Encryption != nil {
		mg.mu.Lock()
		began := mg.cp.Encryption
		mg.mu.Unlock()
		result.EncryptionMoved = mg.m.encryptionMoved(ctx, target, began)
	}
	return result, err
}

// migrate is Migrate's way through: the CRD watched (history.go), every
// API server switched (switch.go), the settle window counted (finish.go),
// the first pass (pass.go), then the settle window's end, the re-check and
// the prune.
func (mg *migration) migrate(ctx context.Context, abort context.CancelCauseFunc, window *sync.WaitGroup) (Result, error) {
	target := mg.target
	if target.CRD != nil {
		// A change of the CRD's storage version ends the migration when it
		// is seen, through abort.
		mg.watchHistory(ctx, abort)
	}
	// Only a migration that settles re-checks, and needs the record.
	mg.recordWrites = target.CRD != nil && !target.Partial()
	if mg.phase() == PhaseRewriting {
		// No answer counts before every API server has switched (lag.go,
		// switch.go); the report shows until when, and the settle window
		// counts from then.
		mg.report()
		if err := mg.awaitSwitch(ctx); err != nil {
			return mg.result(), err
		}
	}
	if target.CRD != nil {
		window.Go(func() { mg.closeWindowAt(ctx) })
	}
	if mg.phase() == PhaseRewriting {
		if err := mg.pass(ctx, false); err != nil {
			return mg.result(), err
		}
		if mg.result().Failed > 0 || target.CRD == nil {
			return mg.result(), nil
		}
		// The first pass is over: a checkpoint taken from now on resumes
		// here, also when reading the CRD below fails.
		mg.setPhase(PhaseSettling)
	}
	if target.CRD == nil {
		return mg.result(), nil
	}
	crd, err := mg.liveCRD(ctx)
	if err != nil || target.Partial() || slices.Equal(crd.Status.StoredVersions, []string{target.CRD.StorageVersion}) {
		// Nothing anyone could prune on this pass's word: a pass over one
		// namespace proves nothing about the others, and [target] holds
		// no other version. The pass rewrote; it did not settle.
		return mg.result(), err
	}
	// With pruning off too: whoever prunes by hand, or reads a
	// StorageVersionMigration's Succeeded, acts on what this pass proves.
	if err := mg.settle(ctx); err != nil {
		return mg.result(), err
	}
	return mg.recheck(ctx)
}

// FirstPass lists every object of the target and rewrites each unchanged, so
// the API server stores it at the storage version: the first pass of a
// migration, without its finish. A rewrite that fails permanently is
// recorded in the result and the pass goes on. It returns a *TransientError
// when transient errors persist past the retry backoff and a *StalledError
// when the resource cannot be listed or patched; either way the last
// Progress has the token to resume from.
func (m *Migrator) FirstPass(ctx context.Context, target Target, opts Options, observe Observer) (Result, error) {
	mg := newMigration(m, target, opts, observe)
	if err := mg.checkViaStatus(); err != nil {
		return mg.result(), err
	}
	// Its checkpoint says it waited for every API server: it does (lag.go,
	// switch.go).
	if err := mg.awaitSwitch(ctx); err != nil {
		return mg.result(), err
	}
	err := mg.pass(ctx, false)
	return mg.result(), err
}

// migration is the state of one Migrate or FirstPass.
type migration struct {
	m        *Migrator
	target   Target
	opts     Options
	observe  Observer
	resource metadata.Getter

	// successes counts rewrites that succeeded, as evidence that the API
	// server works while one object keeps failing.
	successes atomic.Int64
	// retrying counts objects whose requests are failing transiently now.
	retrying atomic.Int64
	// observing delivers progress in order: a snapshot and its delivery
	// happen under it, so an older snapshot never overwrites a newer one.
	observing sync.Mutex
	// pace limits the rewrites in flight; each pass sets its own.
	pace *pace.Pacer
	// updateRefused is set once the API server answered 403 to writing an
	// object back as listed: the rest of the migration patches (write.go).
	updateRefused atomic.Bool
	// slowLists is set once a page took longer than listAttemptTimeout
	// through every API server: from then on, pages are not timed.
	slowLists atomic.Bool
	// listVia is the API server address a page was last listed through,
	// when the usual server did not answer it in time.
	listVia atomic.Pointer[string]
	// viaPages counts the pages listed while listVia was set.
	viaPages atomic.Int64
	// isolated counts the pages taken apart to pass over an object that no
	// served version lists (isolate.go).
	isolated atomic.Int64
	// spaceState holds what the pass knows of its objects' sizes (space.go).
	spaceState

	mu sync.Mutex
	// cp is committed at page boundaries.
	cp          Checkpoint
	remaining   *int64
	retryingMsg string
	// waitingForSlot is set while the pass waits for a slot among the
	// passes that run at once.
	waitingForSlot bool
	// waitingForSpace says what the pass waits for before it writes more
	// (a compaction past its writes, space.go), or "".
	waitingForSpace string
	settleUntil     time.Time
	stopErr         error
	// switchedBy is when every API server stores at the target version.
	switchedBy time.Time
	// switching says what the first pass waits for while it waits for API
	// servers to switch (switch.go).
	switching string
	// proven records the resourceVersions the pass's own rewrites produced
	// or confirmed after the list snapshot, until cp.WindowEnd is known, when
	// recordWrites says the re-check will need them; see proof.go.
	proven       map[string]struct{}
	recordWrites bool
	// history is the CRD as watched since the migration began: whether its
	// storage version held (history.go).
	history *crdHistory
}

func newMigration(m *Migrator, target Target, opts Options, observe Observer) *migration {
	if opts.Concurrency <= 0 {
		opts.Concurrency = DefaultConcurrency
	}
	if opts.PageSize <= 0 {
		opts.PageSize = DefaultPageSize
	}
	if opts.RetryBackoff.Steps == 0 {
		opts.RetryBackoff = DefaultRetryBackoff
	}
	if opts.SettleWindow == 0 {
		opts.SettleWindow = DefaultSettleWindow
	}
	if observe == nil {
		observe = func(Progress) {}
	}
	mg := &migration{m: m, target: target, opts: opts, observe: observe, resource: m.Metadata.Resource(target.Resource), proven: map[string]struct{}{},
		// Until Migrate watches the CRD, only its generation shows that it kept its storage version.
		history: &crdHistory{want: target.CRD}}
	cp, resumed, _ := ResumeFrom(opts.Resume, target)
	if !resumed {
		cp.Continue = opts.Continue
	}
	mg.cp = *cp
	mg.cp.Failures = append([]Failure(nil), cp.Failures...)
	if resumed && mg.cp.Phase == PhaseRewriting && mg.cp.Continue == "" && mg.cp.Done() == 0 {
		// Nothing was proven yet, and the start time was taken by another
		// process, maybe on another node whose clock is ahead: the wait
		// for every API server starts again from now, as Resolve just saw
		// the switch, and reads the servers again.
		mg.cp.StartTime, mg.cp.LagWait, mg.cp.AllSwitched = time.Now(), target.LagWait, false
	}
	mg.switchedBy = mg.cp.StartTime.Add(mg.cp.LagWait)
	mg.settleUntil = mg.switchedBy.Add(opts.SettleWindow)
	if resumed && mg.cp.WindowEnd == "" {
		// The start time was taken by another process, maybe on another
		// node whose clock is behind: count a whole window from now.
		mg.settleUntil = later(mg.settleUntil, time.Now().Add(opts.SettleWindow))
	}
	return mg
}

// phase is where the migration is: rewriting, settling or re-checking.
func (mg *migration) phase() Phase {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	return mg.cp.Phase
}

// checkViaStatus refuses a rewrite through /status on a CRD version without
// that subresource: every patch would answer 404.
func (mg *migration) checkViaStatus() error {
	if crd := mg.target.CRD; crd != nil && mg.opts.ViaStatus && !crd.StatusSubresource {
		return &StalledError{Message: fmt.Sprintf(
			"rewriteViaStatus needs a status subresource, and version %s of CRD %s has none: turn rewriteViaStatus off, or add subresources.status to %s",
			crd.StorageVersion, crd.Name, crd.StorageVersion)}
	}
	return nil
}
