package migrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/metadata"
	"k8s.io/klog/v2"

	"github.com/restow/restow/internal/storedversions"
)

// Defaults for a migration.
const (
	// DefaultConcurrency is the upper bound of a pass's pace: it finds the
	// pace the API server can take below it (pace.go).
	DefaultConcurrency = 256
	DefaultPageSize    = 500
	// DefaultSettleWindow is twice kube-apiserver's default --request-timeout
	// of 60 s: the API server tears a CRD's old storage down at the latest
	// that long after a switch, once requests that began on it have ended.
	DefaultSettleWindow = 2 * time.Minute
	// maxFailedObjects bounds the failures a pass keeps, as the API does.
	maxFailedObjects = 10
	// maxChangedRetries bounds how often one object is re-read and patched
	// again because others keep changing it while its managedFields need
	// re-pointing.
	maxChangedRetries = 5
)

// DefaultRetryBackoff spaces the attempts at one request after transient
// errors: 8 attempts, 250 ms apart at first and doubling, about 32 seconds in
// all (up to 20% more with jitter), before the object counts as failing. No
// cap: wait.Backoff ends the steps early once a delay reaches its cap.
var DefaultRetryBackoff = wait.Backoff{Duration: 250 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 8}

// Counts counts objects by outcome.
type Counts struct {
	// Listed objects, in the first pass.
	Listed int64
	// Migrated objects were re-encoded at the target version: the API
	// server accepted the rewrite and stored the object anew.
	Migrated int64
	// AlreadyStored objects were stored at the target version already: the
	// API server accepted the rewrite and wrote nothing (the resourceVersion
	// it answered with is the one listed).
	AlreadyStored int64
	// Skipped objects: deleted, or changed by someone else, since listed.
	Skipped int64
	// Failed objects could not be rewritten.
	Failed int64
	// Rechecked objects were written by someone else within the settle
	// window and rewritten again after it.
	Rechecked int64
}

// Done is how many objects the first pass is done with.
func (c Counts) Done() int64 { return c.Migrated + c.AlreadyStored + c.Skipped + c.Failed }

// Failure is an object the pass could not rewrite.
type Failure struct {
	Namespace, Name string
	// Reason is the API server's CamelCase reason, such as Forbidden.
	Reason  string
	Message string
}

// Phase is where a migration stands.
type Phase string

// The phases of a migration.
const (
	// PhaseRewriting means the first pass lists and rewrites every object.
	PhaseRewriting Phase = "Rewriting"
	// PhaseSettling means every object was rewritten; the migration waits for
	// the settle window to end.
	PhaseSettling Phase = "Settling"
	// PhaseRechecking means the window is over; what others wrote within it is
	// rewritten again.
	PhaseRechecking Phase = "Rechecking"
)

// Options tune a migration.
type Options struct {
	// Concurrency is the most rewrites a pass has in flight at once. The
	// pass paces itself below it, to what the API server can take.
	Concurrency int
	// FixedConcurrency keeps Concurrency rewrites in flight, without
	// pacing: for measurements.
	FixedConcurrency bool
	PageSize         int64
	// ViaStatus rewrites through the /status subresource.
	ViaStatus bool
	// RetryBackoff spaces retries of transient errors; zero means DefaultRetryBackoff.
	RetryBackoff wait.Backoff
	// SettleWindow is how long after every API server switched (StartTime
	// plus the target's LagWait) a write that began on the old storage may
	// still commit: the prune waits for it. Zero means DefaultSettleWindow;
	// see docs/architecture.md.
	SettleWindow time.Duration
	// Prune trims the CRD's status.storedVersions at the end.
	Prune bool
	// Resume continues a migration from the Checkpoint of its last Progress.
	// It is ignored, and the migration starts over, unless it was taken on
	// the same CRD (UID) at the same generation and target version.
	Resume *Checkpoint
	// Continue starts Rewrite after the page that ended with this token.
	Continue string
}

// Checkpoint is what a migration needs to resume: the caller saves it from
// each Progress (the operator in status.progress) and passes it back in
// Options.Resume.
type Checkpoint struct {
	Phase Phase
	// StartTime is when the migration began, just after it saw the API
	// server store at the target version.
	StartTime time.Time
	// LagWait is how long after StartTime the first pass waited for every
	// API server to store at the target version (lag.go); zero with one API
	// server. The settle window counts from StartTime + LagWait.
	LagWait time.Duration
	// TargetVersion, CRDUID and CRDGeneration bind the checkpoint to the
	// CRD the migration began on.
	TargetVersion string
	CRDUID        types.UID
	CRDGeneration int64
	// ListResourceVersion is the resourceVersion of the first pass's list
	// snapshot; objects not written since were rewritten as no-ops.
	ListResourceVersion string
	// WindowEnd is a resourceVersion read after the settle window ended:
	// every write that began on the old storage is at or below it.
	WindowEnd string
	// Continue resumes the first pass after the last page whose every
	// object is done. Counts and Failures match it exactly.
	Continue string
	Counts
	Failures []Failure
}

// Resumes reports whether cp was taken on the CRD and version of target, at
// the same generation, and waited at least as long for every API server to
// switch as target asks: only then may a migration go on from it. Otherwise
// pages it passed may hold objects written at another version since, or
// proven by an API server that had not switched.
func (cp *Checkpoint) Resumes(target Target) bool {
	// A migration limited to one namespace never resumes: its token would
	// skip the namespaces before it in a migration of the whole resource.
	if cp == nil || target.Partial() || cp.StartTime.IsZero() || cp.TargetVersion != target.TargetVersion() || cp.LagWait < target.LagWait {
		return false
	}
	if target.CRD == nil {
		return cp.CRDUID == ""
	}
	return cp.CRDUID == target.CRD.UID && cp.CRDGeneration == target.CRD.Generation
}

// Progress is a snapshot of a migration under way.
type Progress struct {
	Checkpoint
	// RemainingEstimate is the list's remainingItemCount after the last page, if given.
	RemainingEstimate *int64
	// Retrying describes the transient error being retried, or is "".
	Retrying string
	// SwitchedBy is when every API server stores at the target version, by
	// the lag bound: the first pass starts then (lag.go).
	SwitchedBy time.Time
	// SettleUntil is when the settle window ends.
	SettleUntil time.Time
	// Concurrency is the pace: how many rewrites the pass has in flight
	// at most now.
	Concurrency int
	// WaitingForSlot is set while the pass waits for one of the passes
	// that run at once to end (Migrator.MaxPasses).
	WaitingForSlot bool
}

// Result is the outcome of a migration that reached its end.
type Result struct {
	Counts
	// Failures holds the first few objects that could not be rewritten.
	Failures []Failure
	// Pruned are the versions removed from status.storedVersions.
	Pruned []string
	// StartTime is when the migration began (for a resumed one, the first start).
	StartTime time.Time
}

// Observer receives progress. It may be called from several goroutines and
// must be cheap: it runs after every page and on every transient error.
type Observer func(Progress)

// migration is the state of one Migrate or Rewrite.
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
	pace *pacer
	// updateRefused is set once the API server answered 403 to writing an
	// object back as listed: the rest of the migration patches (update.go).
	updateRefused atomic.Bool
	// isolated counts the pages taken apart to pass over an object that no
	// served version lists (isolate.go).
	isolated atomic.Int64

	mu sync.Mutex
	// cp is committed at page boundaries.
	cp          Checkpoint
	remaining   *int64
	retryingMsg string
	// waitingForSlot is set while the pass waits for a slot among the
	// passes that run at once.
	waitingForSlot bool
	settleUntil    time.Time
	stopErr        error
	// switchedBy is when every API server stores at the target version.
	switchedBy time.Time
	// proven records the resourceVersions the pass's own rewrites produced
	// or confirmed after the list snapshot, until cp.WindowEnd is known, when
	// recordWrites says the re-check will need them; see finish.go.
	proven       map[string]struct{}
	recordWrites bool
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
	mg := &migration{m: m, target: target, opts: opts, observe: observe, resource: m.Metadata.Resource(target.Resource), proven: map[string]struct{}{}}
	cp := opts.Resume
	resumed := cp.Resumes(target)
	if !resumed {
		cp = NewCheckpoint(target)
		cp.Continue = opts.Continue
	}
	mg.cp = *cp
	mg.cp.Failures = append([]Failure(nil), cp.Failures...)
	mg.switchedBy = mg.cp.StartTime.Add(mg.cp.LagWait)
	if resumed && mg.cp.Phase == PhaseRewriting && mg.cp.Continue == "" && mg.cp.Done() == 0 {
		// Nothing was proven yet, and the start time was taken by another
		// process, maybe on another node whose clock is ahead: wait the
		// whole lag from now.
		mg.switchedBy = time.Now().Add(mg.cp.LagWait)
	}
	mg.settleUntil = mg.switchedBy.Add(opts.SettleWindow)
	if resumed && mg.cp.WindowEnd == "" {
		// The start time was taken by another process, maybe on another
		// node whose clock is behind: count a whole window from now.
		mg.settleUntil = later(mg.settleUntil, time.Now().Add(opts.SettleWindow))
	}
	return mg
}

// Rewrite lists every object of the target and rewrites each unchanged, so
// the API server stores it at the storage version: the first pass of a
// migration, without its finish. A rewrite that fails permanently is
// recorded in the result and the pass goes on. It returns a *TransientError
// when transient errors persist past the retry backoff and a *StalledError
// when the resource cannot be listed or patched; either way the last
// Progress has the token to resume from.
func (m *Migrator) Rewrite(ctx context.Context, target Target, opts Options, observe Observer) (Result, error) {
	mg := newMigration(m, target, opts, observe)
	if err := mg.checkViaStatus(); err != nil {
		return mg.result(), err
	}
	// Its checkpoint says it waited for every API server: it does (lag.go).
	if err := sleepUntil(ctx, mg.switchedBy); err != nil {
		return mg.result(), err
	}
	err := mg.pass(ctx, false)
	return mg.result(), err
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

func (mg *migration) result() Result {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	return Result{Counts: mg.cp.Counts, Failures: mg.cp.Failures, StartTime: mg.cp.StartTime}
}

// report hands the observer the current progress.
func (mg *migration) report() {
	mg.observing.Lock()
	defer mg.observing.Unlock()
	mg.observe(mg.progress())
}

func (mg *migration) progress() Progress {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	p := Progress{Checkpoint: mg.cp, RemainingEstimate: mg.remaining, Retrying: mg.retryingMsg, SwitchedBy: mg.switchedBy, SettleUntil: mg.settleUntil, WaitingForSlot: mg.waitingForSlot}
	if mg.pace != nil {
		p.Concurrency = mg.pace.current()
	}
	p.Failures = append([]Failure(nil), mg.cp.Failures...)
	return p
}

// page is one list response.
type page struct {
	items []metav1.PartialObjectMetadata
	// bodies, when set, holds each item whole, as the API server listed it
	// through the storage version at listed, to be written back as listed
	// (update.go). Each is dropped once its object is done.
	bodies []json.RawMessage
	listed time.Time
	// charge is what the bodies hold of the Migrator's budget until the
	// page is done (update.go).
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

// tally counts the outcomes of one page, committed once every object of the
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

// maxPagesAhead bounds the pages a pass holds: listed, or rewritten but not
// yet committed because an earlier page still has an object retrying.
const maxPagesAhead = 4

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
	if mg.m.slotsBusy() {
		mg.setWaitingForSlot(true)
	}
	release, err := mg.m.passSlot(parent)
	mg.setWaitingForSlot(false)
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
	mg.pace = newPacer(ctx, mg.opts.Concurrency, mg.opts.FixedConcurrency, mg.m.Throttle)
	mg.mu.Unlock()

	// List one page ahead, so workers do not wait for the list between pages.
	pages := make(chan page, 1)
	listErr := make(chan error, 1)
	go func() {
		defer close(pages)
		listErr <- mg.list(ctx, token, !recheck, pages)
	}()

	// Pages are committed in the order they were listed.
	var order struct {
		sync.Mutex
		queue []*pageWork
		// broken stops commits for good: an object on a page was not done.
		broken bool
	}
	ahead := make(chan struct{}, maxPagesAhead)
	finish := func(pw *pageWork) {
		order.Lock()
		pw.done = true
		committed := false
		for len(order.queue) > 0 && order.queue[0].done {
			head := order.queue[0]
			order.queue = order.queue[1:]
			mg.release(head.pg.charge)
			if !order.broken && ctx.Err() == nil {
				mg.commit(head.pg, &head.tally, recheck)
				committed = true
			} else {
				order.broken = true
			}
			<-ahead
		}
		order.Unlock()
		if committed {
			mg.report()
		}
	}

	type job struct {
		obj   metav1.PartialObjectMetadata
		index int
		page  *pageWork
	}
	work := make(chan job)
	var workers sync.WaitGroup
	for range mg.opts.Concurrency {
		workers.Go(func() {
			for j := range work {
				var body json.RawMessage
				if bodies := j.page.pg.bodies; bodies != nil {
					body = bodies[j.index]
				}
				if unlisted := j.page.pg.unlisted; unlisted != nil && unlisted[j.index] != nil {
					j.page.tally.fail(*unlisted[j.index])
				} else if err := mg.rewrite(ctx, j.obj, body, j.page.pg.listed, &j.page.tally); err != nil {
					mg.stop(err)
					cancel()
				}
				if bodies := j.page.pg.bodies; bodies != nil {
					// Each worker owns the element of its object.
					bodies[j.index] = nil
				}
				if j.page.pending.Add(-1) == 0 {
					finish(j.page)
				}
			}
		})
	}
	// Every page received gives its bodies' charge back when the pass ends,
	// at the latest (keeping the charge, not the page, which the collector
	// may free as soon as its objects are done).
	var charges []*atomic.Int64
	defer func() {
		for _, charge := range charges {
			mg.release(charge)
		}
	}()
dispatch:
	for pg := range pages {
		if pg.charge != nil {
			charges = append(charges, pg.charge)
		}
		if !recheck {
			mg.noteListSnapshot(pg.resourceVersion)
		}
		select {
		case ahead <- struct{}{}:
		case <-ctx.Done():
			break dispatch
		}
		pw := &pageWork{pg: pg}
		// The page counts as pending until every object is handed out.
		pw.pending.Store(1)
		order.Lock()
		order.queue = append(order.queue, pw)
		order.Unlock()
		for i, obj := range pg.items {
			if recheck && !mg.mustRecheck(obj.ResourceVersion) {
				continue
			}
			pw.pending.Add(1)
			select {
			case work <- job{obj: obj, index: i, page: pw}:
			case <-ctx.Done():
				// Never handed out: the page stays unfinished.
				break dispatch
			}
		}
		if pw.pending.Add(-1) == 0 {
			finish(pw)
		}
	}
	close(work)
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
		c.Failed += pg.uncounted
		c.Migrated += t.migrated.Load()
		c.AlreadyStored += t.alreadyStored.Load()
		c.Skipped += t.skipped.Load()
		mg.cp.Continue, mg.remaining = pg.next, pg.remaining
	}
	c.Failed += t.failed.Load()
	for _, f := range t.failures {
		seen := slices.ContainsFunc(mg.cp.Failures, func(g Failure) bool { return g.Namespace == f.Namespace && g.Name == f.Name })
		if !seen && len(mg.cp.Failures) < maxFailedObjects {
			mg.cp.Failures = append(mg.cp.Failures, f)
		}
	}
}

// sleepUntil waits until t or until ctx ends.
func sleepUntil(ctx context.Context, t time.Time) error {
	wait := time.Until(t)
	if wait <= 0 {
		return nil
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
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

// list sends the pages of the resource to pages until the list ends: whole
// objects when whole is set and the pass may write them back as listed,
// else metadata.
func (mg *migration) list(ctx context.Context, token string, whole bool, pages chan<- page) error {
	// Pages of whole objects hold about wholePageBytes (update.go).
	wholeLimit := min(mg.opts.PageSize, firstWholePage)
	// remaining is how many objects the list has left at token, if known.
	var remaining *int64
	for {
		limit := mg.opts.PageSize
		if whole && mg.writesWhole() {
			limit = wholeLimit
		}
		var list *metav1.PartialObjectMetadataList
		var bodies []json.RawMessage
		// A body's age counts from when its list was sent: the API server
		// decoded it with the CRD as it was then.
		var listed time.Time
		err := mg.retryTransient(ctx, func() error {
			var err error
			listed = time.Now()
			list, bodies, err = mg.listPage(ctx, token, limit, whole)
			return err
		})
		if err != nil && whole && classify(err) == transient && mg.mayIsolate() {
			isolated, ierr := mg.isolate(ctx, token, limit, err, remaining)
			if ierr == nil {
				for _, pg := range isolated {
					if !mg.send(ctx, pages, pg) {
						return nil
					}
					token, remaining = pg.next, pg.remaining
				}
				if token == "" {
					return nil
				}
				continue
			}
			klog.FromContext(ctx).V(1).Info("Could not isolate the object that fails a list page", "error", ierr.Error())
		}
		if err != nil {
			return mg.passError("listing", err)
		}
		pg := page{items: list.Items, bodies: bodies, listed: listed, next: list.Continue, remaining: list.RemainingItemCount, resourceVersion: list.ResourceVersion}
		if bodies != nil {
			wholeLimit = nextWholeLimit(mg.opts.PageSize, wholeLimit, bodies)
			mg.holdBodies(ctx, &pg)
		}
		if !mg.send(ctx, pages, pg) {
			return nil
		}
		if list.Continue == "" {
			return nil
		}
		token, remaining = list.Continue, list.RemainingItemCount
	}
}

// send hands a listed page to the workers, or returns false when the pass
// ends first.
func (mg *migration) send(ctx context.Context, pages chan<- page, pg page) bool {
	select {
	case pages <- pg:
		return true
	case <-ctx.Done():
		mg.release(pg.charge)
		return false
	}
}

// mayIsolate reports whether a page that no served version lists may be
// taken apart (isolate.go): in a whole resource's first pass, a CRD's, up to
// maxFailedObjects times.
func (mg *migration) mayIsolate() bool {
	return mg.target.CRD != nil && !mg.target.Partial() && mg.isolated.Add(1) <= maxFailedObjects
}

// listPage lists one page through the storage version (whole objects, when
// whole is set and the pass may write them back as listed) and, if that
// fails transiently, metadata through each fallback version: one object
// whose conversion fails (a conversion webhook refusing it) fails every page
// that holds it when listed through a version it must be converted to, but
// not when listed through the version it is still stored at. A continue
// token is the same whichever version lists through it. A page listed
// through a fallback version has no bodies: its objects are patched.
func (mg *migration) listPage(ctx context.Context, token string, limit int64, whole bool) (*metav1.PartialObjectMetadataList, []json.RawMessage, error) {
	listFirst := listMetadata(ctx, mg.target.scope(mg.resource), limit)
	if whole && mg.writesWhole() {
		listFirst = func(token string) (*metav1.PartialObjectMetadataList, []json.RawMessage, error) {
			return mg.listWhole(ctx, token, limit)
		}
	}
	list, bodies, err := mg.listThrough(ctx, token, listFirst)
	if err == nil || classify(err) != transient {
		return list, bodies, err
	}
	for _, v := range mg.target.fallbackVersions() {
		gvr := schema.GroupVersionResource{Group: mg.target.Resource.Group, Version: v, Resource: mg.target.Resource.Resource}
		if fallback, _, ferr := mg.listThrough(ctx, token, listMetadata(ctx, mg.target.scope(mg.m.Metadata.Resource(gvr)), limit)); ferr == nil {
			klog.FromContext(ctx).V(1).Info("Listed a page through an older version, since the list through the storage version failed", "version", v, "error", Message(err))
			return fallback, nil, nil
		}
	}
	return nil, nil, err
}

// listFunc lists one page from a continue token.
type listFunc func(token string) (*metav1.PartialObjectMetadataList, []json.RawMessage, error)

// listMetadata lists pages of limit objects' metadata through resource.
func listMetadata(ctx context.Context, resource metadata.ResourceInterface, limit int64) listFunc {
	return func(token string) (*metav1.PartialObjectMetadataList, []json.RawMessage, error) {
		list, err := resource.List(ctx, metav1.ListOptions{Limit: limit, Continue: token})
		if err == nil {
			metadataOnly(list.Items)
		}
		return list, nil, err
	}
}

// metadataOnly keeps of listed objects only what a rewrite uses: name,
// namespace, UID, resourceVersion and managedFields. Annotations and labels
// are dropped as soon as they are decoded: the annotation
// kubectl.kubernetes.io/last-applied-configuration holds an object's whole
// contents (a Secret's data, when it was applied with kubectl), and a
// metadata-only list still carries it.
func metadataOnly(items []metav1.PartialObjectMetadata) {
	for i := range items {
		m := &items[i].ObjectMeta
		items[i] = metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{
			Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion, ManagedFields: m.ManagedFields,
		}}
	}
}

// listThrough lists one page with list. The list's snapshot must still be in
// etcd: when the token outlived etcd's compaction, the error carries a token
// that continues inconsistently. Objects changed since are already stored at
// the new version (and re-checked before any prune), and rewrites are
// idempotent, so nothing is missed. Without one, it starts over.
func (mg *migration) listThrough(ctx context.Context, token string, list listFunc) (*metav1.PartialObjectMetadataList, []json.RawMessage, error) {
	items, bodies, err := list(token)
	for expired := 0; apierrors.IsResourceExpired(err) && token != "" && expired < 3; expired++ {
		token = inconsistentContinue(err)
		klog.FromContext(ctx).V(2).Info("Continue token expired, continuing the list", "restarted", token == "")
		items, bodies, err = list(token)
	}
	return items, bodies, err
}

func inconsistentContinue(err error) string {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return status.Status().Continue
	}
	return ""
}

// rewrite brings one object to the storage version and counts how. It
// returns an error only when the pass must stop.
func (mg *migration) rewrite(ctx context.Context, obj metav1.PartialObjectMetadata, body json.RawMessage, listed time.Time, t *tally) error {
	log := klog.FromContext(ctx)
	before := mg.successes.Load()
	out, err := mg.rewriteObject(ctx, &obj, body, listed)
	if out == transient && ctx.Err() == nil && mg.failsAlone(ctx, before) {
		// The API server answers others, so this object alone keeps
		// failing (a conversion webhook refusing it): record it and go on
		// rather than hold up every other object.
		out = permanent
	}
	switch out {
	case migrated:
		t.migrated.Add(1)
		log.V(4).Info("Rewrote object", "object", klog.KObj(&obj))
	case alreadyStored:
		t.alreadyStored.Add(1)
		log.V(4).Info("Object was already stored at the target version", "object", klog.KObj(&obj))
	case skipped:
		t.skipped.Add(1)
		log.V(4).Info("Skipped object changed or deleted since listed", "object", klog.KObj(&obj), "reason", apierrors.ReasonForError(err))
	case permanent:
		log.V(4).Info("Could not rewrite object", "object", klog.KObj(&obj), "reason", reasonFor(err))
		t.fail(Failure{Namespace: obj.Namespace, Name: obj.Name, Reason: reasonFor(err), Message: Message(err)})
	default:
		return mg.passError("rewriting "+klog.KObj(&obj).String(), err)
	}
	return nil
}

// failsAlone decides, once one object's retries are spent, whether it fails
// alone: fewer than half of the workers are retrying too, and the API server
// rewrote another object since this one's first attempt, or, when no other
// object is retrying, answers a one-object list now. Lists alone are no
// evidence while others fail too: with the pace cut to a request or two by
// timeouts, few objects are retrying at any moment, and the pass's lists
// still succeed. When everything fails (the API server or a conversion
// webhook down), the pass stops instead and resumes later.
func (mg *migration) failsAlone(ctx context.Context, successesBefore int64) bool {
	retrying := mg.retrying.Load()
	switch {
	case 2*retrying >= int64(mg.opts.Concurrency):
		return false
	case mg.successes.Load() > successesBefore:
		return true
	case retrying > 0:
		return false
	}
	_, _, err := mg.listPage(ctx, "", 1, false)
	return err == nil
}

// rewriteObject rewrites obj, as listed when body holds it, and confirms
// what a 409 or 404 means. Neither
// proves anything by itself: an admission webhook may answer either, and a
// missing subresource answers 404. A look at the object (lookup) tells: it
// is gone (skipped), it changed since listed (skipped: the re-check after
// the settle window covers the change, and a re-read re-points stale
// managedFields), or it is unchanged, so the answer came from elsewhere and
// the object counts as failed.
func (mg *migration) rewriteObject(ctx context.Context, obj *metav1.PartialObjectMetadata, body json.RawMessage, listed time.Time) (outcome, error) {
	current := obj
	for changed := 0; ; changed++ {
		wrote := false
		err := mg.retryTransient(ctx, func() error {
			var err error
			wrote, err = mg.write(ctx, current, body, listed)
			return err
		})
		switch {
		case err == nil && !wrote:
			return alreadyStored, nil
		case classify(err) != skipped:
			return classify(err), err
		}
		var fresh *metav1.PartialObjectMetadata
		lookErr := mg.retryTransient(ctx, func() error {
			var err error
			fresh, err = mg.lookup(ctx, current)
			return err
		})
		switch {
		case lookErr != nil && classify(lookErr) == transient:
			return transient, lookErr
		case lookErr != nil:
			// Any other answer is no proof that the object changed.
			return permanent, lookErr
		case fresh == nil:
			return skipped, err
		case fresh.UID == current.UID && fresh.ResourceVersion == current.ResourceVersion:
			return permanent, unconfirmed(err)
		case changed >= maxChangedRetries || !mg.staleManagedFields(fresh):
			return skipped, err
		}
		// Re-read as metadata: patched from now on.
		current, body = fresh, nil
	}
}

// lookup reads obj's metadata as it is now, or nil when it is gone. It lists
// with a field selector on the name rather than getting the object, so a
// migration needs no get permission, and the list is metadata only. A list
// that answers 404 comes from an API server that does not serve this
// version (yet: HA, starting up) or from a proxy, and proves nothing about
// the object: it is transient.
func (mg *migration) lookup(ctx context.Context, obj *metav1.PartialObjectMetadata) (*metav1.PartialObjectMetadata, error) {
	list, err := mg.client(obj.Namespace).List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", obj.Name).String()})
	switch {
	case apierrors.IsNotFound(err):
		return nil, apierrors.NewServiceUnavailable("listing the object by name answered 404: " + Message(err))
	case err != nil:
		return nil, err
	}
	metadataOnly(list.Items)
	for i := range list.Items {
		if list.Items[i].Name == obj.Name {
			return &list.Items[i], nil
		}
	}
	return nil, nil
}

// unconfirmed rewords a 409 or 404 that a look at the object showed not to
// be about it, keeping its code and reason.
func unconfirmed(err error) error {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return err
	}
	st := status.Status()
	st.Message = fmt.Sprintf("answered %s for an object that exists unchanged (an admission webhook, or a missing subresource): %s", st.Reason, st.Message)
	return &apierrors.StatusError{ErrStatus: st}
}

// client is the client for the target in namespace (ignored when cluster-scoped).
func (mg *migration) client(namespace string) metadata.ResourceInterface {
	if mg.target.Namespaced {
		return mg.resource.Namespace(namespace)
	}
	return mg.resource
}

// staleManagedFields reports whether obj's managedFields name a version of
// the CRD that it no longer serves.
func (mg *migration) staleManagedFields(obj *metav1.PartialObjectMetadata) bool {
	_, stale, _ := mg.repointedManagedFields(obj)
	return stale
}

func (mg *migration) repointedManagedFields(obj *metav1.PartialObjectMetadata) ([]metav1.ManagedFieldsEntry, bool, error) {
	crd := mg.target.CRD
	if crd == nil {
		return nil, false, nil
	}
	return storedversions.RepointManagedFields(obj.ManagedFields, mg.target.Resource.Group, crd.ServedVersions, crd.StorageVersion)
}

// rewritePatch is the merge patch of a rewrite: the resourceVersion read, as
// a precondition, and managedFields only when they must be re-pointed.
type rewritePatch struct {
	Metadata struct {
		ResourceVersion string                      `json:"resourceVersion"`
		ManagedFields   []metav1.ManagedFieldsEntry `json:"managedFields,omitempty"`
	} `json:"metadata"`
}

// patch writes obj back unchanged, re-pointing stale managedFields, and
// records the resourceVersion the API server answered with. It reports
// whether the API server wrote: it skips a write whose encoding equals what
// etcd holds, and answers with the resourceVersion read, only when the
// object is stored at the target version already. The /status subresource
// ignores metadata, so a patch that carries managedFields goes to the main
// resource even with ViaStatus.
func (mg *migration) patch(ctx context.Context, obj *metav1.PartialObjectMetadata) (bool, error) {
	var body rewritePatch
	body.Metadata.ResourceVersion = obj.ResourceVersion
	managedFields, repoint, err := mg.repointedManagedFields(obj)
	if err != nil {
		return false, apierrors.NewBadRequest(err.Error())
	}
	var subresources []string
	if repoint {
		body.Metadata.ManagedFields = managedFields
	} else if mg.opts.ViaStatus {
		subresources = []string{"status"}
	}
	data, err := json.Marshal(&body)
	if err != nil {
		return false, err
	}
	if err := mg.pace.acquire(ctx); err != nil {
		return false, err
	}
	start := mg.pace.now()
	written, err := mg.client(obj.Namespace).Patch(ctx, obj.Name, types.MergePatchType, data, metav1.PatchOptions{}, subresources...)
	mg.pace.release(start, err)
	if err != nil {
		return false, err
	}
	mg.successes.Add(1)
	mg.noteOwnWrite(written.ResourceVersion)
	return written.ResourceVersion != obj.ResourceVersion, nil
}

// retryTransient runs fn until it succeeds, fails for a cause that is not
// transient, the backoff runs out or ctx ends, reporting what it retries.
func (mg *migration) retryTransient(ctx context.Context, fn func() error) error {
	var last error
	failing := false
	defer func() {
		if failing && mg.retrying.Add(-1) == 0 {
			mg.setRetrying("")
		}
	}()
	err := wait.ExponentialBackoffWithContext(ctx, mg.opts.RetryBackoff, func(context.Context) (bool, error) {
		last = fn()
		switch {
		case last == nil:
			return true, nil
		case classify(last) != transient:
			return false, last
		}
		if !failing {
			failing = true
			mg.retrying.Add(1)
		}
		mg.setRetrying(Message(last))
		return false, nil
	})
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case wait.Interrupted(err):
		return last
	}
	return err
}

// setWaitingForSlot says whether the pass waits for one of the passes
// that run at once to end (Migrator.MaxPasses).
func (mg *migration) setWaitingForSlot(waiting bool) {
	setReported(mg, &mg.waitingForSlot, waiting)
}

func (mg *migration) setRetrying(msg string) {
	setReported(mg, &mg.retryingMsg, msg)
}

// setReported sets a field of mg's progress under its lock, and reports the
// progress when the value changed.
func setReported[T comparable](mg *migration, field *T, value T) {
	mg.mu.Lock()
	changed := *field != value
	*field = value
	mg.mu.Unlock()
	if changed {
		mg.report()
	}
}

// passError turns an error that stops the pass into a typed one.
func (mg *migration) passError(doing string, err error) error {
	gr := mg.target.Resource.GroupResource()
	switch classify(err) {
	case skipped:
		if apierrors.IsNotFound(err) {
			// The list itself found no resource: its CRD is gone.
			return &StalledError{Message: fmt.Sprintf("%s %s: the resource no longer exists: %s", doing, gr, Message(err))}
		}
		return &TransientError{Err: fmt.Errorf("%s %s: %w", doing, gr, err)}
	case unsupported, permanent:
		// A list or rewrite refused for the whole resource.
		return &StalledError{Message: fmt.Sprintf("%s %s: %s", doing, gr, Message(err))}
	default:
		return &TransientError{Err: fmt.Errorf("%s %s: %w", doing, gr, err)}
	}
}

// NewCheckpoint is the checkpoint of a migration of target that begins now,
// just after Resolve saw the API server store at the target version.
func NewCheckpoint(target Target) *Checkpoint {
	cp := &Checkpoint{Phase: PhaseRewriting, StartTime: time.Now(), LagWait: target.LagWait, TargetVersion: target.TargetVersion()}
	if target.CRD != nil {
		cp.CRDUID, cp.CRDGeneration = target.CRD.UID, target.CRD.Generation
	}
	return cp
}
