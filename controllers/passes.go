package controllers

import (
	"context"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/migrator"
)

// pass is one migration under way in the background (migrator.Migrate).
// Reconcile reads its state; only the pass's goroutine writes it.
type pass struct {
	cancel     context.CancelFunc
	generation int64
	// uid is the UID of the object the pass is for: one re-created under
	// the same name is another object.
	uid    types.UID
	target migrator.Target

	mu    sync.Mutex
	state passState
	// counted is what has been added to the object metrics so far.
	counted migrator.Counts
}

// passState is what a reconcile sees of a pass.
type passState struct {
	progress migrator.Progress
	done     bool
	result   migrator.Result
	err      error
}

func (p *pass) read() passState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state
}

// passes keeps the passes under way, one per object (a StorageMigration, or
// a StorageVersionMigration that restow serves), wakes the reconciler when
// one ends, and keeps the backoff of each object.
type passes struct {
	mu      sync.Mutex
	running map[string]*pass
	// stopped is set once the manager stops: no pass starts after it.
	stopped bool
	// goroutines tracks the pass goroutines, so stopping the manager waits for them.
	goroutines sync.WaitGroup
	wake       chan event.GenericEvent

	// waiting backs off while the API server does not store at the new
	// version yet; stalled backs off between passes that ended Stalled;
	// refused backs off while the API server refuses to store a pass's end
	// in status.
	waiting, stalled, refused workqueue.TypedRateLimiter[string]
}

func newPasses(stalledBase, stalledMax time.Duration) *passes {
	return &passes{
		running: map[string]*pass{},
		wake:    make(chan event.GenericEvent, 64),
		waiting: workqueue.NewTypedItemExponentialFailureRateLimiter[string](waitForStorageVersionBase, waitForStorageVersionMax),
		stalled: workqueue.NewTypedItemExponentialFailureRateLimiter[string](stalledBase, stalledMax),
		refused: workqueue.NewTypedItemExponentialFailureRateLimiter[string](stalledBase, stalledMax),
	}
}

func (ps *passes) get(name string) *pass {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.running[name]
}

// Start implements manager.Runnable: when the manager stops, it cancels every
// pass and waits for them, so nothing writes after the manager is gone.
func (ps *passes) Start(ctx context.Context) error {
	<-ctx.Done()
	ps.mu.Lock()
	ps.stopped = true
	for name, p := range ps.running {
		p.cancel()
		delete(ps.running, name)
	}
	ps.mu.Unlock()
	ps.goroutines.Wait()
	return nil
}

// NeedLeaderElection is false so that passes outlive the reconcilers on shutdown.
func (ps *passes) NeedLeaderElection() bool { return false }

// launch runs migrate in the background as the pass of the object owner
// (a StorageMigration or a StorageVersionMigration, known by its name),
// unless the manager is stopping: a reconcile that comes late during
// shutdown starts nothing. The pass outlives the reconcile that launched it,
// not the manager. When it ends, owner is sent to the reconciler.
func (ps *passes) launch(ctx context.Context, owner client.Object, p *pass,
	migrate func(ctx context.Context, observe migrator.Observer) (migrator.Result, error)) bool {
	ctx, p.cancel = context.WithCancel(context.WithoutCancel(ctx))
	p.generation, p.uid = owner.GetGeneration(), owner.GetUID()
	name := owner.GetName()
	ps.mu.Lock()
	if ps.stopped {
		ps.mu.Unlock()
		p.cancel()
		return false
	}
	ps.running[name] = p
	ps.goroutines.Add(1)
	ps.mu.Unlock()
	wakeObj, ok := owner.DeepCopyObject().(client.Object)
	if !ok {
		wakeObj = &migrationv1alpha1.StorageMigration{ObjectMeta: metav1.ObjectMeta{Name: name}}
	}
	go func() {
		defer ps.goroutines.Done()
		resource := p.target.Resource.GroupResource().String()
		result, err := migrate(ctx, func(progress migrator.Progress) {
			p.mu.Lock()
			defer p.mu.Unlock()
			p.state.progress = progress
			countObjects(resource, p.counted, progress.Counts)
			p.counted = progress.Counts
			setRunning(resource, &progress)
		})
		p.mu.Lock()
		p.state.done, p.state.result, p.state.err = true, result, err
		countObjects(resource, p.counted, result.Counts)
		p.counted = result.Counts
		p.mu.Unlock()
		setRunning(resource, nil)
		select {
		case ps.wake <- event.GenericEvent{Object: wakeObj}:
		case <-ctx.Done():
		case <-time.After(time.Minute):
			// The reconciler's periodic requeue picks the result up.
		}
	}()
	return true
}

// forget drops a pass that ended.
func (ps *passes) forget(name string) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	delete(ps.running, name)
}

// stop cancels the pass of a StorageMigration, if any, and forgets its backoff.
func (ps *passes) stop(name string) {
	ps.mu.Lock()
	if p := ps.running[name]; p != nil {
		p.cancel()
		delete(ps.running, name)
	}
	ps.mu.Unlock()
	ps.stalled.Forget(name)
	ps.waiting.Forget(name)
	ps.refused.Forget(name)
}
