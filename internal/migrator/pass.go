package migrator

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/restow/restow/internal/migrator/pace"
)

// The page loop of a pass: one sweep over the objects, the first pass from
// the checkpoint's token or the re-check from the start. Pages come from the
// list (list.go), one ahead; workers rewrite their objects (write.go), paced
// (package pace); pages are committed to the checkpoint in list order.

// maxPagesAhead bounds the pages a pass holds: listed, or rewritten but not
// yet committed because an earlier page still has an object retrying.
const maxPagesAhead = 4

// page is one list response.
type page struct {
	items []metav1.PartialObjectMetadata
	// bodies, when set, holds each item whole, as the API server listed it
	// through the storage version at listed, to be written back as listed
	// (write.go). Each is dropped once its object is done.
	bodies []json.RawMessage
	listed time.Time
	// charge is what the bodies hold of the Migrator's budget until the
	// page is done (list.go).
	charge    *atomic.Int64
	next      string
	remaining *int64
	// resourceVersion is the list's snapshot.
	resourceVersion string
	// unlisted, when set, holds for each item that no served version lists
	// its failure: the object is not rewritten (isolate.go).
	unlisted []*Failure
	// uncounted objects were passed over with an unlisted one, unnamed:
	// counted as listed and failed.
	uncounted int64
}

// tally counts the fates of one page's objects, committed once every object of the
// page is done, so counts always match the continue token.
type tally struct {
	migrated, alreadyStored, skipped, failed atomic.Int64
	mu                                       sync.Mutex
	failures                                 []Failure
}

// fail counts an object that could not be rewritten.
func (t *tally) fail(f Failure) {
	t.failed.Add(1)
	t.mu.Lock()
	t.failures = append(t.failures, f)
	t.mu.Unlock()
}

// pageWork is a page being rewritten. Workers move on to the next page while
// the last objects of one are still in flight; pages are committed in list
// order, each once every object on it is done, so the checkpoint's token
// never passes an object that was not.
type pageWork struct {
	pg      page
	tally   tally
	pending atomic.Int64
	done    bool
}

// pass lists every object and rewrites it: every object in the first pass,
// from the checkpoint's token; in the re-check only the objects
// mustRecheck picks, from the first page.
func (mg *migration) pass(parent context.Context, recheck bool) error {
	release, err := mg.takeSlot(parent)
	if err != nil {
		return err
	}
	defer release()
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	token := ""
	if !recheck {
		token = mg.cp.Continue
	}
	mg.mu.Lock()
	mg.pace = pace.New(ctx, mg.opts.Concurrency, mg.opts.FixedConcurrency, mg.m.Throttle)
	mg.mu.Unlock()

	ps := &passState{mg: mg, ctx: ctx, cancel: cancel, recheck: recheck,
		ahead: make(chan struct{}, maxPagesAhead), work: make(chan job)}
	// List one page ahead, so workers do not wait for the list between pages.
	pages := make(chan page, 1)
	listErr := make(chan error, 1)
	go func() {
		defer close(pages)
		listErr <- mg.list(ctx, token, !recheck, pages)
	}()
	var workers sync.WaitGroup
	for range mg.opts.Concurrency {
		workers.Go(ps.rewriteJobs)
	}
	// Every page received gives its bodies' charge back when the pass ends,
	// at the latest (keeping the charge, not the page, which the collector
	// may free as soon as its objects are done).
	defer func() {
		for _, charge := range ps.charges {
			mg.release(charge)
		}
	}()
	ps.dispatch(pages)
	close(ps.work)
	workers.Wait()
	cancel()
	for pg := range pages {
		mg.release(pg.charge)
	}
	lastListErr := <-listErr

	mg.mu.Lock()
	defer mg.mu.Unlock()
	switch {
	case mg.stopErr != nil:
		return mg.stopErr
	case parent.Err() != nil:
		// Never report an interrupted pass as complete.
		return parent.Err()
	default:
		return lastListErr
	}
}

// takeSlot waits for one of the passes that list and rewrite at once
// (Migrator.MaxPasses, and Migrator.MaxBuiltInPasses for a resource not
// served from a CRD), saying so while it waits, and returns the function
// that frees it.
func (mg *migration) takeSlot(ctx context.Context) (func(), error) {
	builtIn := mg.target.CRD == nil
	if mg.m.slotsBusy(builtIn) {
		mg.setWaitingForSlot(true)
	}
	release, err := mg.m.passSlot(ctx, builtIn)
	mg.setWaitingForSlot(false)
	return release, err
}

// passState is one pass under way: the pages it holds, in list order, and
// the objects handed to its workers.
type passState struct {
	mg      *migration
	ctx     context.Context
	cancel  context.CancelFunc
	recheck bool
	// ahead holds a token for each page listed and not yet committed.
	ahead chan struct{}
	// work hands objects to the workers.
	work chan job
	// charges are the budget charges of every page received.
	charges []*atomic.Int64

	// mu guards the pages, committed in the order they were listed.
	mu    sync.Mutex
	queue []*pageWork
	// broken stops commits for good: an object on a page was not done.
	broken bool
}

// job is one object of a page, for a worker.
type job struct {
	obj   metav1.PartialObjectMetadata
	index int
	page  *pageWork
}

// dispatch hands the objects of each listed page to the workers, until the
// list ends or the pass does.
func (ps *passState) dispatch(pages <-chan page) {
	for pg := range pages {
		if pg.charge != nil {
			ps.charges = append(ps.charges, pg.charge)
		}
		if !ps.recheck {
			ps.mg.noteListSnapshot(pg.resourceVersion)
		}
		select {
		case ps.ahead <- struct{}{}:
		case <-ps.ctx.Done():
			return
		}
		pw := &pageWork{pg: pg}
		// The page counts as pending until every object is handed out.
		pw.pending.Store(1)
		ps.mu.Lock()
		ps.queue = append(ps.queue, pw)
		ps.mu.Unlock()
		for i, obj := range pg.items {
			if ps.recheck && !ps.mg.mustRecheck(obj.ResourceVersion) {
				continue
			}
			pw.pending.Add(1)
			select {
			case ps.work <- job{obj: obj, index: i, page: pw}:
			case <-ps.ctx.Done():
				// Never handed out: the page stays unfinished.
				return
			}
		}
		if pw.pending.Add(-1) == 0 {
			ps.pageDone(pw)
		}
	}
}

// rewriteJobs is a worker: it rewrites the objects handed to it, and ends
// the pass at the first error that stops it.
func (ps *passState) rewriteJobs() {
	for j := range ps.work {
		var body json.RawMessage
		if bodies := j.page.pg.bodies; bodies != nil {
			body = bodies[j.index]
		}
		if unlisted := j.page.pg.unlisted; unlisted != nil && unlisted[j.index] != nil {
			j.page.tally.fail(*unlisted[j.index])
		} else if err := ps.mg.rewrite(ps.ctx, j.obj, body, j.page.pg.listed, &j.page.tally); err != nil {
			ps.mg.stop(err)
			ps.cancel()
		}
		if bodies := j.page.pg.bodies; bodies != nil {
			// Each worker owns the element of its object.
			bodies[j.index] = nil
		}
		if j.page.pending.Add(-1) == 0 {
			ps.pageDone(j.page)
		}
	}
}

// pageDone marks pw done and commits, in list order, every page at the head
// of the queue that is done; once a page was not, none after it is.
func (ps *passState) pageDone(pw *pageWork) {
	ps.mu.Lock()
	pw.done = true
	committed := false
	for len(ps.queue) > 0 && ps.queue[0].done {
		head := ps.queue[0]
		ps.queue = ps.queue[1:]
		ps.mg.release(head.pg.charge)
		if !ps.broken && ps.ctx.Err() == nil {
			ps.mg.commit(head.pg, &head.tally, ps.recheck)
			committed = true
		} else {
			ps.broken = true
		}
		<-ps.ahead
	}
	ps.mu.Unlock()
	if committed {
		ps.mg.report()
	}
}

// commit adds a finished page to the checkpoint. An object already named
// in the failures is not named twice (a page listed again after a 410 that
// restarted the list; the counts of such a page are added again).
func (mg *migration) commit(pg page, t *tally, recheck bool) {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	c := &mg.cp.Counts
	if recheck {
		c.Rechecked += t.migrated.Load() + t.alreadyStored.Load()
	} else {
		c.Listed += int64(len(pg.items)) + pg.uncounted
		c.Migrated += t.migrated.Load()
		c.AlreadyStored += t.alreadyStored.Load()
		c.Skipped += t.skipped.Load()
		mg.cp.Continue, mg.remaining = pg.next, pg.remaining
	}
	// Objects passed over with an unlisted one failed, in either pass.
	c.Failed += t.failed.Load() + pg.uncounted
	for _, f := range t.failures {
		seen := slices.ContainsFunc(mg.cp.Failures, func(g Failure) bool { return g.Namespace == f.Namespace && g.Name == f.Name })
		if !seen && len(mg.cp.Failures) < maxFailedObjects {
			mg.cp.Failures = append(mg.cp.Failures, f)
		}
	}
}

// stop records the first error that stops the pass.
func (mg *migration) stop(err error) {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	if mg.stopErr == nil {
		mg.stopErr = err
	}
}
