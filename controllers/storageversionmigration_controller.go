package controllers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	svmv1 "k8s.io/api/storagemigration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/svm"
)

// The controller of the standard StorageVersionMigrations restow serves, in
// the StorageMigration controller's shape: Reconcile reads the object live,
// the deciding steps (decide here; start and follow in svm_steps.go) fill
// in an svmOutcome and write nothing, and recordStandardOutcome
// (svm_record.go) is the one writer of its status, events and metrics.

// StatusFieldOwner is the field manager of every status restow writes on a
// standard StorageVersionMigration. A status field managed by anyone else
// means another controller acts on the object.
const StatusFieldOwner = "restow"

// Event reasons of the StorageVersionMigration controller.
const (
	// ControllerConflictReason: another controller writes the status of a
	// StorageVersionMigration; restow leaves it alone.
	ControllerConflictReason = "ControllerConflict"
	// WaitingForOlderReason: an older StorageVersionMigration of the same
	// resource is not finished; this one waits its turn.
	WaitingForOlderReason = "WaitingForOlderMigration"
	// StatusRefusedEventReason: the API server refused restow's write of a
	// StorageVersionMigration's status; restow retries with backoff, and a
	// run that ended is not run again meanwhile.
	StatusRefusedEventReason = "StatusRefused"
)

// StorageVersionMigrationReconciler serves standard StorageVersionMigrations
// (storagemigration.k8s.io) where no in-tree controller does: it migrates
// the named resource with restow's engine (pace, settle window, re-check,
// named failures, the wait for every API server) and writes the standard
// status, Running then Succeeded or Failed, each a final answer as the API
// defines it.
//
// It never shares an object with another controller: any status field of
// the object managed by someone else than StatusFieldOwner means another
// controller (kube-controller-manager's) acts on it, and restow stops,
// writes nothing more and records a Warning event.
type StorageVersionMigrationReconciler struct {
	Client client.Client
	// APIReader reads each StorageVersionMigration live, for the same reason
	// as StorageMigrationReconciler's.
	APIReader client.Reader
	// Cache lists the StorageVersionMigrations of a resource, to take them
	// one at a time, oldest first.
	Cache    client.Reader
	Migrator *migrator.Migrator
	Recorder events.EventRecorder
	// Version is the served version of storagemigration.k8s.io, v1 or v1beta1.
	Version string
	// Options are the manager's; the reconciler reads the knobs of runs
	// (Concurrency, PageSize, StatusInterval, RetryBackoff, SettleWindow,
	// and StalledRetryBase and StalledRetryMax, which here bound the waits
	// of runs that paused on transient errors and of refused status writes).
	Options

	runs *runs
	// mu guards the maps below.
	mu sync.Mutex
	// resume holds, per object, the checkpoint of a run that paused on a
	// transient error.
	resume map[string]*migrator.Checkpoint
	// said remembers, per object and kind of event (a conflict, the older
	// migration waited for, a refused status), what the last event said,
	// so each is sent once per cause.
	said map[string]string
}

// +kubebuilder:rbac:groups=storagemigration.k8s.io,resources=storageversionmigrations,verbs=get;list;watch
// +kubebuilder:rbac:groups=storagemigration.k8s.io,resources=storageversionmigrations/status,verbs=update

// SetupWithManager registers the reconciler and the runs it keeps in the background.
func (r *StorageVersionMigrationReconciler) SetupWithManager(mgr ctrl.Manager) error {
	switch {
	case r.Client == nil, r.APIReader == nil, r.Cache == nil, r.Migrator == nil, r.Recorder == nil:
		return errors.New("StorageVersionMigrationReconciler needs Client, APIReader, Cache, Migrator and Recorder")
	case r.Version == "":
		return errors.New("StorageVersionMigrationReconciler needs the served version of " + svm.Group)
	case r.StatusInterval <= 0, r.StalledRetryBase <= 0, r.StalledRetryMax < r.StalledRetryBase:
		return errors.New("StorageVersionMigrationReconciler needs StatusInterval > 0 and 0 < StalledRetryBase <= StalledRetryMax")
	}
	r.runs = newRuns(r.StalledRetryBase, r.StalledRetryMax)
	r.resume, r.said = map[string]*migrator.Checkpoint{}, map[string]string{}
	if err := mgr.Add(r.runs); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("storageversionmigration").
		// Creates and deletes only: restow's own status writes must not
		// wake it (it looks again every StatusInterval while it acts), and
		// the spec is immutable.
		For(svm.New(r.Version), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WatchesRawSource(source.Channel(r.runs.wake, &handler.EnqueueRequestForObject{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: 2}).
		Complete(r)
}

// Reconcile reads the StorageVersionMigration live, decides, and records
// the outcome: at most one status write.
func (r *StorageVersionMigrationReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	u := svm.New(r.Version)
	if err := r.APIReader.Get(ctx, req.NamespacedName, u); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.Name)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	m, err := svm.FromUnstructured(u)
	if err != nil {
		return ctrl.Result{}, err
	}
	out := r.decide(ctx, m)
	return r.recordStandardOutcome(ctx, u, m, out)
}

// decide says what to do with m: nothing more once it is over or another
// controller writes its status, else follow its run or start one.
func (r *StorageVersionMigrationReconciler) decide(ctx context.Context, m *svmv1.StorageVersionMigration) svmOutcome {
	if !m.DeletionTimestamp.IsZero() || svm.StateOf(m).Final() {
		return svmOutcome{forget: true}
	}
	if other := otherStatusWriter(m); other != "" {
		return conflictOutcome(other, fmt.Sprintf("%q writes this StorageVersionMigration's status too", other))
	}
	rn := r.runs.get(m.Name)
	if rn != nil && rn.uid != m.UID {
		// Deleted and created again under the same name: another object.
		r.runs.stop(m.Name)
		rn = nil
	}
	if rn == nil {
		return r.start(ctx, m)
	}
	return r.follow(ctx, rn, m)
}

// otherStatusWriter returns the field manager, other than restow, that
// manages a field of m's status, or "".
func otherStatusWriter(m *svmv1.StorageVersionMigration) string {
	for _, f := range m.ManagedFields {
		if f.Subresource == "status" && f.Manager != StatusFieldOwner {
			return f.Manager
		}
	}
	return ""
}

// forget drops everything restow keeps of a StorageVersionMigration.
func (r *StorageVersionMigrationReconciler) forget(name string) {
	r.runs.stop(name)
	r.mu.Lock()
	delete(r.resume, name)
	for _, kind := range []string{saidConflict, saidWaiting, saidRefused} {
		delete(r.said, kind+"/"+name)
	}
	r.mu.Unlock()
}

// sayOnce reports whether what, of this kind for the object name, differs
// from what the last event of that kind said, and remembers it.
func (r *StorageVersionMigrationReconciler) sayOnce(kind, name, what string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	key := kind + "/" + name
	if r.said[key] == what {
		return false
	}
	r.said[key] = what
	return true
}

// The kinds of event sayOnce keeps apart.
const (
	saidConflict = "conflict"
	saidWaiting  = "waiting"
	saidRefused  = "refused"
)

// claimGrace is how long a new StorageVersionMigration is left to another
// controller before restow claims it: kube-controller-manager's in-tree
// controller writes Running within moments of seeing it, so one with no
// status after this has no other controller, unless kube-controller-manager
// happened to be down; then the check of every reconcile catches its first write.
const claimGrace = 3 * time.Second

// unknownResourceGrace is by default how long a StorageVersionMigration of a resource
// the API server does not serve waits for it to appear before it fails: a
// CRD applied in the same manifest may not be served yet. The in-tree
// controller waits as long.
const unknownResourceGrace = time.Minute
