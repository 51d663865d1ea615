package controllers

import (
	"context"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/migrator"
)

// run is one pass under way in the background. Reconcile reads its snapshot;
// only the pass goroutine writes it.
type run struct {
	cancel     context.CancelFunc
	generation int64
	target     migrator.Target

	mu       sync.Mutex
	progress migrator.Progress
	// counted is what has been added to the object metrics so far.
	counted migrator.Counts
	done    bool
	result  migrator.Result
	err     error
}

type runSnapshot struct {
	progress migrator.Progress
	done     bool
	result   migrator.Result
	err      error
}

func (r *run) snapshot() runSnapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	return runSnapshot{progress: r.progress, done: r.done, result: r.result, err: r.err}
}

// runner keeps the passes under way, one per StorageMigration, and wakes the
// reconciler when one ends.
type runner struct {
	mu   sync.Mutex
	runs map[string]*run
	// passes tracks the pass goroutines, so stopping the manager waits for them.
	passes sync.WaitGroup
	// stalledPasses counts consecutive passes that ended Stalled, for backoff.
	stalledPasses map[string]int
	// waits counts consecutive reconciles that found the API server not yet
	// storing at the storage version, for backoff.
	waits map[string]int
	wake  chan event.GenericEvent
	// stopped is set once the manager stops: no pass starts after it.
	stopped bool
}

func newRunner() *runner {
	return &runner{runs: map[string]*run{}, stalledPasses: map[string]int{}, waits: map[string]int{}, wake: make(chan event.GenericEvent, 64)}
}

func (r *runner) get(name string) *run {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runs[name]
}

// Start implements manager.Runnable: when the manager stops, it cancels every
// pass and waits for them, so nothing writes after the manager is gone.
func (r *runner) Start(ctx context.Context) error {
	<-ctx.Done()
	r.mu.Lock()
	r.stopped = true
	for name, current := range r.runs {
		current.cancel()
		delete(r.runs, name)
	}
	r.mu.Unlock()
	r.passes.Wait()
	return nil
}

// NeedLeaderElection is false so that the runner outlives the reconcilers on shutdown.
func (r *runner) NeedLeaderElection() bool { return false }

// start runs fn in the background as the pass of sm, unless the manager is
// stopping: a reconcile that comes late during shutdown starts nothing. The
// pass outlives the reconcile that started it, not the manager.
func (r *runner) start(ctx context.Context, sm *migrationv1alpha1.StorageMigration, current *run,
	fn func(ctx context.Context, observe migrator.Observer) (migrator.Result, error)) bool {
	ctx, current.cancel = context.WithCancel(context.WithoutCancel(ctx))
	current.generation = sm.Generation
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		current.cancel()
		return false
	}
	r.runs[sm.Name] = current
	r.passes.Add(1)
	r.mu.Unlock()
	wakeObj := &migrationv1alpha1.StorageMigration{ObjectMeta: metav1.ObjectMeta{Name: sm.Name}}
	go func() {
		defer r.passes.Done()
		resource := current.target.Resource.GroupResource().String()
		result, err := fn(ctx, func(p migrator.Progress) {
			current.mu.Lock()
			defer current.mu.Unlock()
			current.progress = p
			countObjects(resource, current.counted, p.Counts)
			current.counted = p.Counts
			setRemaining(resource, p.RemainingEstimate)
		})
		current.mu.Lock()
		current.done, current.result, current.err = true, result, err
		countObjects(resource, current.counted, result.Counts)
		current.counted = result.Counts
		current.mu.Unlock()
		setRemaining(resource, nil)
		select {
		case r.wake <- event.GenericEvent{Object: wakeObj}:
		case <-ctx.Done():
		case <-time.After(time.Minute):
			// The reconciler's periodic requeue picks the result up.
		}
	}()
	return true
}

// finish forgets a pass that ended.
func (r *runner) finish(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.runs, name)
}

// stop cancels the pass of a StorageMigration, if any.
func (r *runner) stop(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if current := r.runs[name]; current != nil {
		current.cancel()
		delete(r.runs, name)
	}
	delete(r.stalledPasses, name)
	delete(r.waits, name)
}

// waiting records a reconcile that found the API server not yet storing at
// the storage version and returns how long to wait before looking again:
// soon at first, since the switch usually takes well under a second, then
// doubling up to maxDelay.
func (r *runner) waiting(name string, base, maxDelay time.Duration) time.Duration {
	return r.backoff(r.waits, name, base, maxDelay)
}

// doneWaiting resets the backoff of waiting.
func (r *runner) doneWaiting(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.waits, name)
}

// stalled records a pass that ended Stalled and returns how long to wait
// before the next: doubling from base up to maxDelay.
func (r *runner) stalled(name string, base, maxDelay time.Duration) time.Duration {
	return r.backoff(r.stalledPasses, name, base, maxDelay)
}

// backoff counts one more attempt of name in attempts and returns base
// doubled once per earlier attempt, up to maxDelay.
func (r *runner) backoff(attempts map[string]int, name string, base, maxDelay time.Duration) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := attempts[name]
	attempts[name] = n + 1
	return min(base<<min(n, 16), maxDelay)
}

func (r *runner) succeeded(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.stalledPasses, name)
}
