package controllers

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/migrator"
)

// A run is one migration of a resource (migrator.Migrate) under way in the
// background for a StorageMigration, or a StorageVersionMigration that
// restow serves: its first pass over the objects, the settle window, the
// re-check pass and the prune. The API calls a run a pass (status.lastPass,
// the PassStarted event, restow_passes_total); in the engine a pass is one
// sweep over the objects, and a run may hold two.

// run is the handle of a run. Reconcile reads its state; only the run's
// goroutine writes it.
type run struct {
	cancel     context.CancelFunc
	generation int64
	// uid is the UID of the object the run is for: one re-created under
	// the same name is another object.
	uid    types.UID
	target migrator.Target

	// endRecorded is set once the events and metrics of the run's end were
	// recorded: a later write of the same end (its status refused before)
	// records them no more.
	endRecorded atomic.Bool
	// settlingTold is set once a reconcile saw the run settling and said
	// so (the Settling reason, with its event): a run whose settle window
	// passed between two looks says it at its end instead.
	settlingTold atomic.Bool

	mu    sync.Mutex
	state runState
	// counted is what has been added to the object metrics so far.
	counted migrator.Counts
}

// runState is what a reconcile sees of a run.
type runState struct {
	progress migrator.Progress
	done     bool
	result   migrator.Result
	err      error
}

func (rn *run) read() runState {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	return rn.state
}

// newRun is the handle of a run of target from cp, before it is launched:
// its state is cp's progress, and the object metrics have counted cp's
// objects already.
func newRun(target migrator.Target, cp *migrator.Checkpoint) *run {
	return &run{target: target, state: runState{progress: migrator.Progress{Checkpoint: *cp}}, counted: cp.Counts}
}

// runs keeps the runs under way, one per object (a StorageMigration, or a
// StorageVersionMigration that restow serves), wakes the reconciler when
// one ends, and keeps the backoff of each object.
type runs struct {
	mu      sync.Mutex
	running map[string]*run
	// stopped is set once the manager stops: no run starts after it.
	stopped bool
	// goroutines tracks the runs' goroutines, so stopping the manager waits for them.
	goroutines sync.WaitGroup
	wake       chan event.GenericEvent

	// waiting backs off while the API server does not store at the new
	// version yet; stalled backs off between runs that ended Stalled;
	// refused backs off while the API server refuses to store a run's end
	// in status.
	waiting, stalled, refused workqueue.TypedRateLimiter[string]
	// servers backs off while the API servers disagree on their
	// encryption state, or restow cannot read every one of them: a state
	// that lasts a reload's minute, or for good behind one address.
	servers workqueue.TypedRateLimiter[string]
}

func newRuns(stalledBase, stalledMax time.Duration) *runs {
	return &runs{
		running: map[string]*run{},
		wake:    make(chan event.GenericEvent, 64),
		waiting: workqueue.NewTypedItemExponentialFailureRateLimiter[string](waitForStorageVersionBase, waitForStorageVersionMax),
		stalled: workqueue.NewTypedItemExponentialFailureRateLimiter[string](stalledBase, stalledMax),
		refused: workqueue.NewTypedItemExponentialFailureRateLimiter[string](stalledBase, stalledMax),
		servers: workqueue.NewTypedItemExponentialFailureRateLimiter[string](waitForServersBase, waitForServersMax),
	}
}

func (rs *runs) get(name string) *run {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.running[name]
}

// Start implements manager.Runnable: when the manager stops, it cancels every
// run and waits for them, so nothing writes after the manager is gone.
func (rs *runs) Start(ctx context.Context) error {
	<-ctx.Done()
	rs.mu.Lock()
	rs.stopped = true
	for name, rn := range rs.running {
		rn.cancel()
		delete(rs.running, name)
	}
	rs.mu.Unlock()
	rs.goroutines.Wait()
	return nil
}

// NeedLeaderElection is false so that runs outlive the reconcilers on shutdown.
func (rs *runs) NeedLeaderElection() bool { return false }

// launch runs migrate in the background as the run rn of the object owner
// (a StorageMigration or a StorageVersionMigration, known by its name),
// unless the manager is stopping: a reconcile that comes late during
// shutdown starts nothing. The run outlives the reconcile that launched it,
// not the manager. When it ends, owner is sent to the reconciler.
func (rs *runs) launch(ctx context.Context, owner client.Object, rn *run,
	migrate func(ctx context.Context, observe migrator.Observer) (migrator.Result, error)) bool {
	ctx, rn.cancel = context.WithCancel(context.WithoutCancel(ctx))
	rn.generation, rn.uid = owner.GetGeneration(), owner.GetUID()
	name := owner.GetName()
	rs.mu.Lock()
	if rs.stopped {
		rs.mu.Unlock()
		rn.cancel()
		return false
	}
	rs.running[name] = rn
	rs.goroutines.Add(1)
	rs.mu.Unlock()
	wakeObj, ok := owner.DeepCopyObject().(client.Object)
	if !ok {
		wakeObj = &migrationv1alpha1.StorageMigration{ObjectMeta: metav1.ObjectMeta{Name: name}}
	}
	go func() {
		defer rs.goroutines.Done()
		resource := rn.target.Resource.GroupResource().String()
		result, err := migrate(ctx, func(progress migrator.Progress) {
			rn.mu.Lock()
			defer rn.mu.Unlock()
			rn.state.progress = progress
			countObjects(resource, rn.counted, progress.Counts)
			rn.counted = progress.Counts
			setRunning(resource, &progress)
		})
		rn.mu.Lock()
		rn.state.done, rn.state.result, rn.state.err = true, result, err
		countObjects(resource, rn.counted, result.Counts)
		rn.counted = result.Counts
		rn.mu.Unlock()
		setRunning(resource, nil)
		select {
		case rs.wake <- event.GenericEvent{Object: wakeObj}:
		case <-ctx.Done():
		case <-time.After(time.Minute):
			// The reconciler's periodic requeue picks the result up.
		}
	}()
	return true
}

// forget drops a run that ended.
func (rs *runs) forget(name string) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	delete(rs.running, name)
}

// forgetRun drops the run rn of the object name once its end is recorded,
// unless another run took its place meanwhile.
func (rs *runs) forgetRun(name string, rn *run) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.running[name] == rn {
		delete(rs.running, name)
	}
}

// stop cancels the run of an object, if any, and forgets its backoff.
func (rs *runs) stop(name string) {
	rs.mu.Lock()
	if rn := rs.running[name]; rn != nil {
		rn.cancel()
		delete(rs.running, name)
	}
	rs.mu.Unlock()
	rs.stalled.Forget(name)
	rs.waiting.Forget(name)
	rs.servers.Forget(name)
	rs.refused.Forget(name)
}
