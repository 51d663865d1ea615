package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	svmv1 "k8s.io/api/storagemigration/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/svm"
)

// StatusFieldOwner is the field manager of every status restow writes on a
// standard StorageVersionMigration. A status field managed by anyone else
// means another controller acts on the object.
const StatusFieldOwner = "restow"

// The reasons of the standard conditions restow writes, the in-tree
// controller's own, so that tools that read them see no difference.
const (
	svmRunningReason   = "MigrationRunning"
	svmCompletedReason = "MigrationCompleted"
	svmSucceededReason = "StorageVersionMigrationSucceeded"
	svmFailedReason    = "StorageVersionMigrationFailed"
)

// Event reasons of the StorageVersionMigration controller.
const (
	// ControllerConflictReason: another controller writes the status of a
	// StorageVersionMigration; restow leaves it alone.
	ControllerConflictReason = "ControllerConflict"
	// WaitingForOlderReason: an older StorageVersionMigration of the same
	// resource is not finished; this one waits its turn.
	WaitingForOlderReason = "WaitingForOlderMigration"
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
	// of runs that paused on transient errors).
	Options

	runs *runs
	// mu guards the checkpoints of paused runs and the conflicts said.
	mu sync.Mutex
	// resume holds, per object, the checkpoint of a run that paused on a
	// transient error.
	resume map[string]*migrator.Checkpoint
	// conflicts and waitingFor remember the conflict, and the older
	// migration waited for, that an event said of each object, so each
	// event is sent once.
	conflicts, waitingFor map[string]string
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
	r.resume, r.conflicts, r.waitingFor = map[string]*migrator.Checkpoint{}, map[string]string{}, map[string]string{}
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

// Reconcile reads the StorageVersionMigration live, decides, and writes its
// status at most once.
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
	if !m.DeletionTimestamp.IsZero() {
		r.forget(m.Name)
		return ctrl.Result{}, nil
	}
	if svm.StateOf(m).Final() {
		r.forget(m.Name)
		return ctrl.Result{}, nil
	}
	if other := otherStatusWriter(m); other != "" {
		r.refuse(ctx, u, m, other)
		return ctrl.Result{}, nil
	}
	original := m.DeepCopy()
	requeueAfter, err := r.reconcile(ctx, u, m)
	if err != nil || equality.Semantic.DeepEqual(original.Status, m.Status) {
		return ctrl.Result{RequeueAfter: requeueAfter}, err
	}
	updated, err := svm.ToUnstructured(m, r.Version)
	if err != nil {
		return ctrl.Result{}, err
	}
	// An update, not a patch: it carries the resourceVersion read above, so
	// a status another controller wrote meanwhile is never overwritten. The
	// conflict brings the next reconcile, which sees the other writer.
	if err := r.Client.Status().Update(ctx, updated, client.FieldOwner(StatusFieldOwner)); err != nil {
		if apierrors.IsConflict(err) {
			return ctrl.Result{RequeueAfter: restartDelay}, nil
		}
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: requeueAfter}, nil
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

// refuse stops restow's run of m, if any, and says once why restow leaves m alone.
func (r *StorageVersionMigrationReconciler) refuse(ctx context.Context, u client.Object, m *svmv1.StorageVersionMigration, other string) {
	r.runs.stop(m.Name)
	r.mu.Lock()
	said := r.conflicts[m.Name] == other
	r.conflicts[m.Name] = other
	delete(r.resume, m.Name)
	r.mu.Unlock()
	if said {
		return
	}
	msg := fmt.Sprintf("%q writes this StorageVersionMigration's status too: another controller (such as kube-controller-manager's) acts on it, "+
		"so restow leaves it alone and writes nothing more. Turn off --serve-storage-version-migrations, or the other controller", other)
	ctrl.LoggerFrom(ctx).Error(errors.New("another controller writes the status"), "Leaving a StorageVersionMigration to another controller", "fieldManager", other)
	r.Recorder.Eventf(u, nil, corev1.EventTypeWarning, ControllerConflictReason, "Migrate", "%s", msg)
}

// forget drops everything restow keeps of a StorageVersionMigration.
func (r *StorageVersionMigrationReconciler) forget(name string) {
	r.runs.stop(name)
	r.mu.Lock()
	delete(r.resume, name)
	delete(r.conflicts, name)
	delete(r.waitingFor, name)
	r.mu.Unlock()
	r.runs.stalled.Forget(name)
}

// reconcile follows the run of m, or starts one. It sets m's status and
// returns when to look again.
func (r *StorageVersionMigrationReconciler) reconcile(ctx context.Context, u client.Object, m *svmv1.StorageVersionMigration) (time.Duration, error) {
	rn := r.runs.get(m.Name)
	if rn != nil && rn.uid != m.UID {
		// Deleted and created again under the same name: another object.
		r.runs.stop(m.Name)
		rn = nil
	}
	if rn == nil {
		return r.start(ctx, u, m)
	}
	state := rn.read()
	if !state.done {
		out := runUnderWay(rn.target, state.progress, statusProgress(state.progress), time.Now())
		markRunning(m, out.message)
		return r.StatusInterval, nil
	}
	r.runs.forget(m.Name)
	v := judge(rn.target, state, time.Now())
	resource := rn.target.Resource.GroupResource().String()
	passesTotal.WithLabelValues(resource, v.result).Inc()
	switch {
	case v.condition == conditionReady:
		msg := v.message
		if len(state.result.Pruned) > 0 {
			msg += fmt.Sprintf("; %v removed from status.storedVersions", state.result.Pruned)
		}
		r.Recorder.Eventf(u, nil, corev1.EventTypeNormal, migrationv1alpha1.SucceededReason, "Migrate", "%s", msg)
		finish(m, svmv1.MigrationSucceeded, svmSucceededReason, msg)
		r.runs.stalled.Forget(m.Name)
		return 0, nil
	case v.next == nextStalled:
		msg := v.message
		if failures := failureList(state.result.Failures); failures != "" {
			msg = fmt.Sprintf("%d of %d objects could not be rewritten to %s, nothing was pruned: %s", state.result.Failed, state.result.Listed, rn.target.TargetVersion(), failures)
		}
		r.Recorder.Eventf(u, nil, corev1.EventTypeWarning, v.reason, "Migrate", "%s", msg)
		finish(m, svmv1.MigrationFailed, svmFailedReason, msg)
		return 0, nil
	case v.next == nextResume:
		r.mu.Lock()
		cp := state.progress.Checkpoint
		r.resume[m.Name] = &cp
		r.mu.Unlock()
		markRunning(m, v.message)
		return r.runs.stalled.When(m.Name), nil
	}
	// The CRD changed under the run: a new run starts.
	markRunning(m, v.message)
	return restartDelay, nil
}

// start claims m, or starts a run of a claimed m. Nothing is written to
// a StorageVersionMigration before restow claims it, and the claim (Running
// and the resource version the migration covers, in one update) is written
// only after claimGrace with no status from anyone. The run starts on the
// next reconcile, once the live object shows the claim and no other writer:
// so restow never migrates an object whose status another controller has
// written, and never writes Running alone, which the in-tree
// resource-version controller would answer.
func (r *StorageVersionMigrationReconciler) start(ctx context.Context, u client.Object, m *svmv1.StorageVersionMigration) (time.Duration, error) {
	log := ctrl.LoggerFrom(ctx)
	gr := schema.GroupResource{Group: m.Spec.Resource.Group, Resource: m.Spec.Resource.Resource}
	if older, err := r.olderActive(ctx, m, gr); err != nil || older != nil {
		if older != nil {
			r.sayWaiting(ctx, u, m, older)
		}
		return r.runs.waiting.When(m.Name), err
	}
	claimed := m.Status.ResourceVersion != "" && meta.IsStatusConditionTrue(m.Status.Conditions, string(svmv1.MigrationRunning))
	if !claimed {
		if wait := claimGrace - time.Since(m.CreationTimestamp.Time); wait > 0 {
			return wait, nil
		}
	}
	target, err := r.Migrator.Resolve(ctx, gr)
	var waitErr *migrator.WaitError
	var stalledErr *migrator.StalledError
	switch {
	case errors.As(err, &waitErr):
		if claimed {
			markRunning(m, waitErr.Message)
		}
		return r.runs.waiting.When(m.Name), nil
	case errors.As(err, &stalledErr):
		grace := r.UnknownResourceGrace
		if grace <= 0 {
			grace = unknownResourceGrace
		}
		if time.Since(m.CreationTimestamp.Time) < grace {
			return r.runs.waiting.When(m.Name), nil
		}
		// Failed is final and needs no claim: restow is the only writer of
		// this status, or it would have stopped above.
		r.Recorder.Eventf(u, nil, corev1.EventTypeWarning, migrationv1alpha1.UnsupportedReason, "Migrate", "%s", stalledErr.Message)
		failUnclaimed(m, stalledErr.Message)
		return 0, nil
	case err != nil:
		if claimed {
			markRunning(m, "Retrying after a transient error: "+migrator.Message(err))
		}
		return transientRetryDelay, nil
	}
	r.runs.waiting.Forget(m.Name)
	if !claimed {
		rv, err := r.currentResourceVersion(ctx, target)
		if err != nil {
			log.Info("Could not read the resource version to claim a StorageVersionMigration with; retrying", "error", migrator.Message(err))
			return transientRetryDelay, nil
		}
		m.Status.ResourceVersion = rv
		markRunning(m, fmt.Sprintf("Claimed by restow: rewriting %s to %s starts shortly", gr, target.TargetVersion()))
		return restartDelay, nil
	}

	prune, why := r.mayPrune(ctx, gr)
	r.mu.Lock()
	cp := r.resume[m.Name]
	delete(r.resume, m.Name)
	r.mu.Unlock()
	cp, _, _ = migrator.ResumeFrom(cp, target)
	opts := migrator.Options{
		Concurrency:  r.Concurrency,
		PageSize:     r.PageSize,
		RetryBackoff: r.RetryBackoff,
		SettleWindow: r.SettleWindow,
		Prune:        prune,
		Resume:       cp,
	}
	if !r.runs.launch(ctx, u, newRun(target, cp), func(ctx context.Context, observe migrator.Observer) (migrator.Result, error) {
		return r.Migrator.Migrate(ctrl.LoggerInto(ctx, log), target, opts, observe)
	}) {
		return 0, nil
	}
	log.Info("Starting pass", "resource", gr, "targetVersion", target.TargetVersion(), "prune", prune)
	msg := fmt.Sprintf("restow is rewriting %s to %s", gr, target.TargetVersion())
	if why != "" {
		msg += "; " + why
	}
	r.Recorder.Eventf(u, nil, corev1.EventTypeNormal, "PassStarted", "Migrate", "%s", msg)
	markRunning(m, msg)
	return r.StatusInterval, nil
}

// mayPrune says whether a run of gr may prune status.storedVersions: not
// when a StorageMigration of the resource asks restow not to
// (spec.pruneStoredVersions: false), and why not.
func (r *StorageVersionMigrationReconciler) mayPrune(ctx context.Context, gr schema.GroupResource) (bool, string) {
	var list migrationv1alpha1.StorageMigrationList
	if err := r.Client.List(ctx, &list, client.MatchingFields{resourceIndex: gr.String()}); err != nil {
		return false, "status.storedVersions is left as it is: the StorageMigrations of the resource could not be read (" + migrator.Message(err) + ")"
	}
	for _, sm := range list.Items {
		if !pruneEnabled(&sm) {
			return false, fmt.Sprintf("status.storedVersions is left as it is: StorageMigration %s sets pruneStoredVersions: false", sm.Name)
		}
	}
	return true, ""
}

// sayWaiting records once that m waits for an older StorageVersionMigration
// of the same resource, and who writes that one's status.
func (r *StorageVersionMigrationReconciler) sayWaiting(ctx context.Context, u client.Object, m, older *svmv1.StorageVersionMigration) {
	r.mu.Lock()
	said := r.waitingFor[m.Name] == older.Name
	r.waitingFor[m.Name] = older.Name
	r.mu.Unlock()
	if said {
		return
	}
	by := "no controller has started it"
	if other := otherStatusWriter(older); other != "" {
		by = fmt.Sprintf("its status is written by %q", other)
	} else if svm.StateOf(older) == svm.Running {
		by = "restow is carrying it out"
	}
	msg := fmt.Sprintf("Waiting for StorageVersionMigration %s (%s) of the same resource to end: they run one at a time, oldest first; %s. Delete it if nothing will finish it",
		older.Name, svm.StateOf(older), by)
	ctrl.LoggerFrom(ctx).Info("Waiting for an older StorageVersionMigration of the same resource", "older", older.Name)
	r.Recorder.Eventf(u, nil, corev1.EventTypeNormal, WaitingForOlderReason, "Migrate", "%s", msg)
}

// olderActive returns an older StorageVersionMigration of gr that has not
// ended: the migrations of one resource run one at a time, oldest first, as
// in the in-tree controller.
func (r *StorageVersionMigrationReconciler) olderActive(ctx context.Context, m *svmv1.StorageVersionMigration, gr schema.GroupResource) (*svmv1.StorageVersionMigration, error) {
	all, err := svm.ForResource(ctx, r.Cache, r.Version, gr)
	if err != nil {
		return nil, err
	}
	for _, o := range all {
		if o.UID == m.UID {
			return nil, nil
		}
		if !svm.StateOf(o).Final() {
			return o, nil
		}
	}
	return nil, nil
}

// currentResourceVersion is the resource version of a list of the target
// now: every object stored before it is covered by the run that follows,
// which is what status.resourceVersion says.
func (r *StorageVersionMigrationReconciler) currentResourceVersion(ctx context.Context, target migrator.Target) (string, error) {
	list, err := r.Migrator.Metadata.Resource(target.Resource).List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return "", err
	}
	return list.GetResourceVersion(), nil
}

// markRunning sets Running=True with message.
func markRunning(m *svmv1.StorageVersionMigration, message string) {
	meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{
		Type: string(svmv1.MigrationRunning), Status: metav1.ConditionTrue, Reason: svmRunningReason,
		Message: message, ObservedGeneration: m.Generation,
	})
}

// finish records the end of m: Succeeded or Failed true, Running false. Both
// are final: the API refuses to turn them false again.
func finish(m *svmv1.StorageVersionMigration, end svmv1.MigrationConditionType, reason, message string) {
	meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{
		Type: string(end), Status: metav1.ConditionTrue, Reason: reason, Message: message, ObservedGeneration: m.Generation,
	})
	meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{
		Type: string(svmv1.MigrationRunning), Status: metav1.ConditionFalse, Reason: svmCompletedReason,
		Message: "Migration completed", ObservedGeneration: m.Generation,
	})
}

// failUnclaimed records the end of m, never claimed, as Failed: its
// resource cannot be migrated (it does not exist, its storage version is not
// served, its CRD is being deleted). With no list of the resource to take
// status.resourceVersion from, it takes m's own resourceVersion: 1.35
// refuses a status without a well-formed one (1.36 accepts none), and the
// field says nothing of a migration that never began.
func failUnclaimed(m *svmv1.StorageVersionMigration, message string) {
	if m.Status.ResourceVersion == "" {
		m.Status.ResourceVersion = m.ResourceVersion
	}
	finish(m, svmv1.MigrationFailed, svmFailedReason, message)
}

// failureList names up to five failed objects and why, values withheld.
func failureList(failures []migrator.Failure) string {
	var parts []string
	for i, f := range failures {
		if i == 5 {
			parts = append(parts, fmt.Sprintf("and %d more", len(failures)-i))
			break
		}
		name := f.Name
		if f.Namespace != "" {
			name = f.Namespace + "/" + f.Name
		}
		parts = append(parts, fmt.Sprintf("%s (%s: %s)", name, f.Reason, f.Message))
	}
	return strings.Join(parts, "; ")
}
