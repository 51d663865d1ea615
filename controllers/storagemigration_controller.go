// Package controllers holds restow's reconcilers. They are plumbing: get the
// object, decide with small named functions, write status once. A run (a
// whole migration, internal/migrator's Migrate: its passes over the objects,
// the settle window and the prune) goes on in the background (runs.go); the
// reconciler starts it, copies its progress into status every
// StatusInterval, and judges how it ended (verdict.go). Every reconcile's
// outcome, whatever decided it, is written in one place: record (record.go).
// convert.go translates between the engine's types and the API's.
package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
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
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/svm"
)

// StorageMigrationReconciler keeps each StorageMigration's resource fully
// stored at its storage version.
type StorageMigrationReconciler struct {
	Client client.Client
	// APIReader reads each StorageMigration live: whether to start or resume
	// a run must not be decided on a cached copy that predates the status
	// this reconciler wrote last.
	APIReader client.Reader
	Migrator  *migrator.Migrator
	Recorder  events.EventRecorder
	// Standard, when set, holds the standard StorageVersionMigrations, shown
	// in status and events beside each StorageMigration of their resource.
	Standard *StandardMigrations
	// Wake, when set, brings StorageMigrations to look at again: those of
	// built-in resources whose storage version moved
	// (BuiltInMigrationReconciler), which no watched object shows.
	Wake <-chan event.GenericEvent
	// Options are the manager's; the reconciler reads the knobs of runs
	// (Concurrency, PageSize, StatusInterval, StalledRetryBase and
	// StalledRetryMax, RetryBackoff, SettleWindow).
	Options

	runs *runs
	// seen is the trigger of built-in resources' last sweep of every API
	// server, when that trigger runs (background.go).
	seen *sweptHashes
	// started is when the reconciler was set up.
	started time.Time
	// deferrals holds, per StorageMigration put off while a migration is
	// under way, since when (background.go).
	deferrals sync.Map
}

// +kubebuilder:rbac:groups=migration.restow.dev,resources=storagemigrations,verbs=get;list;watch
// +kubebuilder:rbac:groups=migration.restow.dev,resources=storagemigrations/status,verbs=patch
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions,verbs=get;list;watch
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions/status,verbs=patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// Counting the API servers by their identity Leases in kube-system and the
// addresses in default/kubernetes's EndpointSlices tells a control plane of
// one, whose passes need not wait out the lag bound.
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=list
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=list
// Rewriting any resource needs list and patch on it, and update to write a
// CRD's objects back as listed (without it, migrations patch: slower, as
// safe); narrow this in config/rbac to the groups you migrate if you prefer.
// +kubebuilder:rbac:groups=*,resources=*,verbs=list;patch;update

// SetupWithManager registers the reconciler and the runs it keeps in the background.
func (r *StorageMigrationReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	switch {
	case r.Client == nil, r.APIReader == nil, r.Migrator == nil, r.Recorder == nil:
		return errors.New("StorageMigrationReconciler needs Client, APIReader, Migrator and Recorder")
	case r.StatusInterval <= 0, r.StalledRetryBase <= 0, r.StalledRetryMax < r.StalledRetryBase:
		return errors.New("StorageMigrationReconciler needs StatusInterval > 0 and 0 < StalledRetryBase <= StalledRetryMax")
	}
	r.runs = newRuns(r.StalledRetryBase, r.StalledRetryMax)
	r.started = time.Now()
	if err := mgr.Add(r.runs); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &migrationv1alpha1.StorageMigration{}, resourceIndex, func(o client.Object) []string {
		return []string{crdName(o.(*migrationv1alpha1.StorageMigration))}
	}); err != nil {
		return err
	}
	b := ctrl.NewControllerManagedBy(mgr).
		For(&migrationv1alpha1.StorageMigration{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		WatchesMetadata(&apiextensionsv1.CustomResourceDefinition{}, handler.EnqueueRequestsFromMapFunc(r.migrationsForCRD)).
		WatchesRawSource(source.Channel(r.runs.wake, &handler.EnqueueRequestForObject{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: 4})
	if r.Standard != nil {
		b = b.Watches(svm.New(r.Standard.Version), handler.EnqueueRequestsFromMapFunc(r.migrationsForStandard), builder.WithPredicates(standardStateChanged))
	}
	if r.Wake != nil {
		b = b.WatchesRawSource(source.Channel(r.Wake, &handler.EnqueueRequestForObject{}))
	}
	return b.Complete(r)
}

// migrationsForStandard maps a StorageVersionMigration event to the
// StorageMigrations of its resource.
func (r *StorageMigrationReconciler) migrationsForStandard(ctx context.Context, o client.Object) []reconcile.Request {
	gr := standardResource(o)
	return r.migrationsForCRD(ctx, &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: gr.String()}})
}

func crdName(sm *migrationv1alpha1.StorageMigration) string {
	return schema.GroupResource{Group: sm.Spec.Resource.Group, Resource: sm.Spec.Resource.Resource}.String()
}

// migrationsForCRD maps a CRD event to the StorageMigrations of its
// resource. One that waits for the API server to store at the storage
// version looks again from waitForStorageVersionBase: the event came
// through an API server whose informer has just seen the CRD change, and
// whose discovery follows within moments (after a watch that lagged, the
// backoff had reached waitForStorageVersionMax).
func (r *StorageMigrationReconciler) migrationsForCRD(ctx context.Context, crd client.Object) []reconcile.Request {
	var list migrationv1alpha1.StorageMigrationList
	if err := r.Client.List(ctx, &list, client.MatchingFields{resourceIndex: crd.GetName()}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Listing StorageMigrations for a CRD event", "crd", crd.GetName())
		return nil
	}
	requests := make([]reconcile.Request, 0, len(list.Items))
	for _, sm := range list.Items {
		r.runs.waiting.Forget(sm.Name)
		requests = append(requests, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&sm)})
	}
	return requests
}

// Reconcile reads the StorageMigration live, decides, records the outcome
// and patches status once.
func (r *StorageMigrationReconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, retErr error) {
	if later, skip := r.background(ctx, req); skip {
		return ctrl.Result{RequeueAfter: later}, nil
	}
	sm := &migrationv1alpha1.StorageMigration{}
	if err := r.APIReader.Get(ctx, req.NamespacedName, sm); err != nil {
		if apierrors.IsNotFound(err) {
			r.runs.stop(req.Name)
			forgetGauges(req.Name)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !sm.DeletionTimestamp.IsZero() {
		r.runs.stop(req.Name)
		forgetGauges(req.Name)
		return ctrl.Result{}, nil
	}
	original := sm.DeepCopy()
	// settles is the ended run whose end this reconcile records.
	var settles *run
	defer func() {
		if equality.Semantic.DeepEqual(original.Status, sm.Status) {
			if settles != nil {
				r.runs.forgetRun(sm.Name, settles)
			}
			return
		}
		err := r.Client.Status().Patch(ctx, sm, client.MergeFrom(original))
		if err == nil && settles != nil {
			r.runs.forgetRun(sm.Name, settles)
		}
		switch {
		case statusRefused(err):
			err = r.recordStatusRefused(ctx, original, err)
			res = ctrl.Result{RequeueAfter: r.runs.refused.When(sm.Name)}
		case err == nil && !equality.Semantic.DeepEqual(original.Status.LastPass, sm.Status.LastPass):
			// A run's end is recorded: a refusal before it is over.
			r.runs.refused.Forget(sm.Name)
		}
		if err != nil {
			retErr = errors.Join(retErr, client.IgnoreNotFound(err))
		}
	}()

	out, requeueAfter := r.reconcile(ctx, sm)
	if every := r.encryptionCheck(sm); every > 0 && requeueAfter == 0 {
		// A rotation is seen within this period of the last server's
		// reload. A backoff (Stalled, a refused status) is not shortened.
		requeueAfter = every
	}
	out.status.storageVersionMigrations = r.standardFor(ctx, sm)
	r.record(sm, original, out)
	if settles = out.settles; settles != nil {
		settles.endRecorded.Store(true)
	}
	return ctrl.Result{RequeueAfter: requeueAfter}, nil
}

// encryptionCheck is how often sm's resource, if restow re-encrypts it,
// reads every API server's encryption state; 0 for any other.
func (r *StorageMigrationReconciler) encryptionCheck(sm *migrationv1alpha1.StorageMigration) time.Duration {
	gr := schema.GroupResource{Group: sm.Spec.Resource.Group, Resource: sm.Spec.Resource.Resource}
	if !slices.Contains(r.ReEncrypt, gr) {
		return 0
	}
	if r.EncryptionCheckInterval > 0 {
		return r.EncryptionCheckInterval
	}
	return DefaultEncryptionCheckInterval
}

// reconcile follows the run of sm, or starts one if the resource needs it,
// and says what to record and when to look again.
func (r *StorageMigrationReconciler) reconcile(ctx context.Context, sm *migrationv1alpha1.StorageMigration) (outcome, time.Duration) {
	rn := r.runs.get(sm.Name)
	if rn == nil {
		return r.startIfNeeded(ctx, sm)
	}
	state := rn.read()
	if !state.done {
		if rn.generation != sm.Generation {
			// The spec changed: restart with the new knobs. The run ends
			// cancelled and wakes us.
			rn.cancel()
		}
		progress := statusProgress(state.progress)
		out := runUnderWay(rn.target, state.progress, progress, time.Now())
		if out.reason == migrationv1alpha1.SettlingReason {
			rn.settlingTold.Store(true)
		}
		out.status.progress = set(progress)
		out.status.failedObjects = set(statusFailures(state.progress.Failures))
		return out, r.StatusInterval
	}
	v := judge(rn.target, state, time.Now())
	out, requeueAfter := r.ended(ctx, sm, rn, state, v)
	out.settles = rn
	if rn.endRecorded.Load() {
		// Its end was recorded before and its status refused: this writes
		// the same end again, and says nothing twice.
		out.events, out.ended, out.announced = nil, nil, true
	}
	switch {
	case rn.generation != sm.Generation && v.condition != conditionStalled:
		// The spec changed after the run had ended: act on it now, so
		// observedGeneration catches up. The end is recorded as judged;
		// the conditions say a new run starts, and announce it.
		restart := reconciling(migrationv1alpha1.ProgressingReason, "The spec changed; a new pass starts")
		restart.status, restart.events, restart.ended, restart.settles = out.status, out.events, out.ended, out.settles
		return restart, restartDelay
	case reRunRequested(sm):
		// A re-run was requested while this run went on: it asks for a
		// run that starts after the request, so start one now.
		requeueAfter = restartDelay
	}
	return out, requeueAfter
}

// ended says what to record of the end of run rn, judged v: status keeps
// the summary and the failed objects of a run that reached its end, or the
// checkpoint of one to resume; a run that pruned adds the Pruned event. It
// returns when to look again.
func (r *StorageMigrationReconciler) ended(ctx context.Context, sm *migrationv1alpha1.StorageMigration, rn *run, state runState, v verdict) (outcome, time.Duration) {
	out := v.outcome
	end := &runEnd{resource: rn.target.Resource.GroupResource().String(), result: v.result}
	out.ended = end
	out.status.progress = set[*migrationv1alpha1.PassProgress](nil)
	if v.checkpoint {
		// The last progress matches its continue token, so a resumed run
		// counts no page twice.
		out.status.progress = set(statusProgress(state.progress))
	}
	if v.summary != nil {
		// A pass that reached its end replaces the baseline, if any.
		out.status.baseline = set[*migrationv1alpha1.StorageBaseline](nil)
		out.status.lastPass = set(v.summary)
		out.status.failedObjects = set(statusFailures(state.result.Failures))
	}
	switch v.next {
	case nextRestart:
		return out, restartDelay
	case nextResume:
		ctrl.LoggerFrom(ctx).Info("Migration paused by a transient error, resuming later", "error", migrator.Message(state.err))
		return out, transientRetryDelay
	case nextStalled:
		return out, r.runs.stalled.When(sm.Name)
	case nextSpace:
		return out, r.StalledRetryBase
	}
	// The run reached its end without failures.
	r.runs.stalled.Forget(sm.Name)
	end.succeeded = true
	end.duration = v.summary.CompletionTime.Sub(v.summary.StartTime.Time)
	out.events = slices.Concat(settledUntold(sm, rn, state), out.events)
	if pruned := state.result.Pruned; len(pruned) > 0 {
		end.pruned = true
		out.events = append(out.events, stepEvent{corev1.EventTypeNormal, "Pruned", "Prune",
			fmt.Sprintf("Removed %v from status.storedVersions of CRD %s", pruned, rn.target.CRD.Name)})
	}
	ctrl.LoggerFrom(ctx).Info("Migration succeeded", "targetVersion", v.summary.TargetVersion, "listed", v.summary.Listed, "migrated", v.summary.Migrated,
		"skipped", v.summary.Skipped, "rechecked", v.summary.Rechecked, "pruned", v.summary.PrunedVersions)
	if rn.target.Encryption != nil {
		return reEncrypted(ctx, out, rn.target, state.result)
	}
	return out, 0
}

// reEncrypted records the end of a pass without failures over a resource
// restow re-encrypts: the encryption state it re-encrypted every object
// under, when every API server reported it from the pass's start to its
// end; otherwise nothing, and a look again soon, when the state the
// servers report now starts another pass (or waits while they disagree).
func reEncrypted(ctx context.Context, out outcome, target migrator.Target, result migrator.Result) (outcome, time.Duration) {
	gr := target.Resource.GroupResource()
	if result.EncryptionMoved != "" {
		ctrl.LoggerFrom(ctx).Info("The API servers' encryption state moved during the pass; not recorded", "resource", gr, "moved", result.EncryptionMoved)
		out.events = append(out.events, stepEvent{corev1.EventTypeWarning, "EncryptionMoved", "ReEncrypt",
			fmt.Sprintf("The pass over %s rewrote every object, but %s: some may be under another key, so restow records the state as Moved and passes again once every API server reports one", gr, result.EncryptionMoved)})
		out.status.encryption = set(encryptionRecord(*target.Encryption, migrationv1alpha1.EncryptionRecordedByMoved))
		return out, transientRetryDelay
	}
	out.status.encryption = set(encryptionRecord(*target.Encryption, migrationv1alpha1.EncryptionRecordedByPass))
	out.events = append(out.events, stepEvent{corev1.EventTypeNormal, "ReEncrypted", "ReEncrypt",
		fmt.Sprintf("Rewrote every object of %s while every API server reported %s, from the pass's start to its end; kubectl restow verify %s --expect-key shows from etcd which key each object is under before you remove an old key",
			gr, target.Encryption, gr)})
	return out, 0
}

func reRunRequested(sm *migrationv1alpha1.StorageMigration) bool {
	return sm.Annotations[migrationv1alpha1.ReRunAnnotation] != sm.Status.LastHandledReRunToken
}

// startIfNeeded resolves the resource and starts a run if it needs one.
func (r *StorageMigrationReconciler) startIfNeeded(ctx context.Context, sm *migrationv1alpha1.StorageMigration) (outcome, time.Duration) {
	gr := schema.GroupResource{Group: sm.Spec.Resource.Group, Resource: sm.Spec.Resource.Resource}
	res := resolve(ctx, r.Migrator, gr)
	if out, after, done := r.unresolved(sm, res); done {
		return out, after
	}
	target := res.target
	if skipsFirstPass(sm, target) && sm.Status.Baseline == nil && !reRunRequested(sm) {
		first := firstSight(sm, target)
		if first == nil && target.StorageVersionHash != "" {
			if first = firstBaseline(sm, target); first.Unproven == "" || target.ServersUnseen != "" {
				first = nil
			}
		}
		if first == nil {
			return withEncryptionBaseline(recordBaseline(sm, target), sm, target), 0
		}
		// The API servers stored at another version at first sight, or
		// the first sight is unproven while restow reads every server now:
		// that is the baseline, and the objects are re-stored from it.
		sm = sm.DeepCopy()
		sm.Status.Baseline, sm.Status.ObservedGeneration = first, sm.Generation
		out, after := r.decide(ctx, sm, target)
		out.status.observedGeneration = set(sm.Generation)
		out.status.baseline = set(first)
		return out, after
	}
	return r.decide(ctx, sm, target)
}

// decide starts a run of sm over target if it needs one, or says why it
// waits or rests.
func (r *StorageMigrationReconciler) decide(ctx context.Context, sm *migrationv1alpha1.StorageMigration, target migrator.Target) (outcome, time.Duration) {
	gr := target.Resource.GroupResource()
	why := migrationNeeded(sm, target)
	unseen := why != "" && reStoreUnseen(sm, target)
	unknown := why == "" && target.EncryptionUnknown != ""
	if !unseen && !unknown {
		r.runs.servers.Forget(sm.Name)
	}
	if unseen {
		// Nothing shows that every server stores at the new version: no
		// pass, no hash recorded, until someone asks.
		out := reconciling(migrationv1alpha1.WaitingForAllAPIServersReason, fmt.Sprintf(
			"The storage version of %s moved to %s, but restow cannot read every API server's own discovery (%s), so it does not re-store by itself: a rewrite through a server not yet upgraded stores the old version again. Once the upgrade is done on every server (on a managed control plane, when the provider says so), run kubectl restow migrate %s",
			gr, target.TargetVersion(), target.ServersUnseen, gr))
		out.status.observedGeneration = set(sm.Generation)
		return out, r.runs.servers.When(sm.Name)
	}
	if unknown {
		// A rotation may be under way: nothing recorded, nothing claimed.
		out := reconciling(migrationv1alpha1.WaitingForEncryptionConfigReason, target.EncryptionUnknown)
		out.status.observedGeneration = set(sm.Generation)
		return out, r.runs.servers.When(sm.Name)
	}
	if why == "" && skipsFirstPass(sm, target) {
		// Still at the baseline: say so, not that every object is known
		// to be stored at it.
		return withEncryptionBaseline(recordBaseline(sm, target), sm, target), 0
	}
	if why == "" {
		msg := restingMessage(sm, target)
		out := ready(msg)
		out.status.observedGeneration = set(sm.Generation)
		return withEncryptionBaseline(out, sm, target), 0
	}
	return r.startRun(ctx, sm, target, why), r.StatusInterval
}

// unresolved is the outcome of a resource Resolve could not make a target
// of, and when to look again: waiting for the storage version, stalled
// (told by an event once per cause), or a transient error; done is false
// when res holds a target.
func (r *StorageMigrationReconciler) unresolved(sm *migrationv1alpha1.StorageMigration, res resolution) (out outcome, after time.Duration, done bool) {
	if res.waiting == "" {
		r.runs.waiting.Forget(sm.Name)
	}
	switch {
	case res.waiting != "":
		out := reconciling(migrationv1alpha1.WaitingForStorageVersionReason, res.waiting)
		out.status.observedGeneration = set(sm.Generation)
		return out, r.runs.waitFor(sm.Name, res), true
	case res.stalled != "":
		out := stalled(migrationv1alpha1.UnsupportedReason, res.stalled)
		out.status.observedGeneration = set(sm.Generation)
		// A re-run requested now has its answer: it stalled.
		out.status.lastHandledReRunToken = set(sm.Annotations[migrationv1alpha1.ReRunAnnotation])
		var unsupported []stepEvent
		if c := meta.FindStatusCondition(sm.Status.Conditions, migrationv1alpha1.StalledCondition); c == nil || c.Status != metav1.ConditionTrue || c.Message != res.stalled {
			// Once per cause, not once per retry.
			unsupported = append(unsupported, stepEvent{corev1.EventTypeWarning, migrationv1alpha1.UnsupportedReason, "Migrate", res.stalled})
		}
		return out.withEvents(unsupported...), r.runs.stalled.When(sm.Name), true
	case res.transient != nil:
		return reconciling(migrationv1alpha1.TransientErrorReason, migrator.Message(res.transient)), transientRetryDelay, true
	}
	return outcome{}, 0, false
}

// startRun launches a run in the background, resuming an interrupted one
// from its checkpoint when it was taken on the same CRD at the same
// generation (resumeFrom).
func (r *StorageMigrationReconciler) startRun(ctx context.Context, sm *migrationv1alpha1.StorageMigration, target migrator.Target, why string) outcome {
	cp, resumed, startOver := migrator.ResumeFrom(checkpoint(&sm.Status), target)
	opts := r.runOptions(pruneEnabled(sm), cp)
	opts.ViaStatus = sm.Spec.RewriteViaStatus != nil && *sm.Spec.RewriteViaStatus
	if sm.Spec.Concurrency != nil {
		opts.Concurrency = int(*sm.Spec.Concurrency)
	}
	if sm.Spec.PageSize != nil {
		opts.PageSize = int64(*sm.Spec.PageSize)
	}
	if startOver != "" {
		why = startOver
	}
	// Written whether or not the run launches.
	fields := statusFields{
		targetVersion:         set(target.TargetVersion()),
		observedGeneration:    set(sm.Generation),
		lastHandledReRunToken: set(sm.Annotations[migrationv1alpha1.ReRunAnnotation]),
		progress:              set(statusProgress(migrator.Progress{Checkpoint: *cp})),
		failedObjects:         set(statusFailures(cp.Failures)),
	}

	if !r.runs.startRun(ctx, r.Migrator, sm, target, opts) {
		out := reconciling(migrationv1alpha1.ProgressingReason, "The operator is stopping; the pass starts when it runs again")
		out.status = fields
		return out
	}
	ctrl.LoggerFrom(ctx).Info("Starting a migration", "resource", target.Resource.GroupResource(), "targetVersion", target.TargetVersion(), "reason", why, "resumed", resumed,
		"apiServers", target.APIServers, "apiServerSignals", target.APIServerSignals)
	started := stepEvent{corev1.EventTypeNormal, "PassStarted", "Migrate", fmt.Sprintf("Rewriting %s to %s: %s", target.Resource.GroupResource(), target.TargetVersion(), why)}
	out := reconciling(migrationv1alpha1.ProgressingReason, fmt.Sprintf("Rewriting objects to %s (%s)", target.TargetVersion(), why))
	if switchedBy := cp.StartTime.Add(cp.LagWait); !resumed && time.Until(switchedBy) > time.Second {
		out = reconciling(migrationv1alpha1.WaitingForStorageVersionReason, migrator.LagMessage(target, switchedBy))
	}
	out.status = fields
	return out.withEvents(started)
}
