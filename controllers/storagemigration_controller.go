// Package controllers holds restow's reconcilers. They are plumbing: get the
// object, decide with small named functions, write status once. A pass (a
// whole migration, internal/migrator's Migrate) runs in the background
// (passes.go); the reconciler starts it, copies its progress into status
// every StatusInterval, and records how it ended: judged once, recorded in
// one place (verdict.go).
package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/svm"
)

// resourceIndex indexes StorageMigrations by the CRD name of their resource
// (resource.group), so a CRD event finds the migrations of its resource.
const resourceIndex = "spec.resource"

// Requeue delays.
const (
	// The API server usually stores at a new storage version within a
	// fraction of a second of the CRD update; the wait backs off from
	// waitForStorageVersionBase to waitForStorageVersionMax.
	waitForStorageVersionBase = 100 * time.Millisecond
	waitForStorageVersionMax  = 5 * time.Second
	transientRetryDelay       = 5 * time.Second
	restartDelay              = 100 * time.Millisecond
)

// StorageMigrationReconciler keeps each StorageMigration's resource fully
// stored at its storage version.
type StorageMigrationReconciler struct {
	Client client.Client
	// APIReader reads each StorageMigration live: whether to start or resume
	// a pass must not be decided on a cached copy that predates the status
	// this reconciler wrote last.
	APIReader client.Reader
	Migrator  *migrator.Migrator
	Recorder  events.EventRecorder

	// Concurrency and PageSize apply when a StorageMigration leaves them unset.
	Concurrency int
	PageSize    int64
	// StatusInterval is how often status is written while a pass runs.
	StatusInterval time.Duration
	// StalledRetryBase and StalledRetryMax bound the backoff before a pass
	// that ended Stalled is tried again.
	StalledRetryBase, StalledRetryMax time.Duration
	// RetryBackoff spaces retries of transient errors within a pass; zero
	// means migrator.DefaultRetryBackoff.
	RetryBackoff wait.Backoff
	// SettleWindow is how long a pass waits after the storage switch before
	// it re-checks and prunes; zero means migrator.DefaultSettleWindow.
	SettleWindow time.Duration
	// Standard, when set, holds the standard StorageVersionMigrations, shown
	// in status and events beside each StorageMigration of their resource.
	Standard *StandardMigrations

	passes *passes
}

// +kubebuilder:rbac:groups=migration.restow.dev,resources=storagemigrations,verbs=get;list;watch
// +kubebuilder:rbac:groups=migration.restow.dev,resources=storagemigrations/status,verbs=patch
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions,verbs=get;list;watch
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions/status,verbs=patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// Counting the API servers by their identity Leases in kube-system tells a
// control plane of one, whose passes need not wait out the lag bound.
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=list
// Rewriting any resource needs list and patch on it, and update to write a
// CRD's objects back as listed (without it, migrations patch: slower, as
// safe); narrow this in config/rbac to the groups you migrate if you prefer.
// +kubebuilder:rbac:groups=*,resources=*,verbs=list;patch;update

// SetupWithManager registers the reconciler and the passes it keeps in the background.
func (r *StorageMigrationReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	switch {
	case r.Client == nil, r.APIReader == nil, r.Migrator == nil, r.Recorder == nil:
		return errors.New("StorageMigrationReconciler needs Client, APIReader, Migrator and Recorder")
	case r.StatusInterval <= 0, r.StalledRetryBase <= 0, r.StalledRetryMax < r.StalledRetryBase:
		return errors.New("StorageMigrationReconciler needs StatusInterval > 0 and 0 < StalledRetryBase <= StalledRetryMax")
	}
	r.passes = newPasses(r.StalledRetryBase, r.StalledRetryMax)
	if err := mgr.Add(r.passes); err != nil {
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
		WatchesRawSource(source.Channel(r.passes.wake, &handler.EnqueueRequestForObject{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: 4})
	if r.Standard != nil {
		b = b.Watches(svm.New(r.Standard.Version), handler.EnqueueRequestsFromMapFunc(r.migrationsForStandard), builder.WithPredicates(standardStateChanged))
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

// migrationsForCRD maps a CRD event to the StorageMigrations of its resource.
func (r *StorageMigrationReconciler) migrationsForCRD(ctx context.Context, crd client.Object) []reconcile.Request {
	var list migrationv1alpha1.StorageMigrationList
	if err := r.Client.List(ctx, &list, client.MatchingFields{resourceIndex: crd.GetName()}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Listing StorageMigrations for a CRD event", "crd", crd.GetName())
		return nil
	}
	requests := make([]reconcile.Request, 0, len(list.Items))
	for _, sm := range list.Items {
		requests = append(requests, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&sm)})
	}
	return requests
}

// Reconcile reads the StorageMigration live, decides, and patches status once.
func (r *StorageMigrationReconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, retErr error) {
	sm := &migrationv1alpha1.StorageMigration{}
	if err := r.APIReader.Get(ctx, req.NamespacedName, sm); err != nil {
		if apierrors.IsNotFound(err) {
			r.passes.stop(req.Name)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !sm.DeletionTimestamp.IsZero() {
		r.passes.stop(req.Name)
		return ctrl.Result{}, nil
	}
	original := sm.DeepCopy()
	defer func() {
		if equality.Semantic.DeepEqual(original.Status, sm.Status) {
			return
		}
		err := r.Client.Status().Patch(ctx, sm, client.MergeFrom(original))
		switch {
		case statusRefused(err):
			err = r.recordStatusRefused(ctx, sm, original, err)
			res = ctrl.Result{RequeueAfter: r.passes.refused.When(sm.Name)}
		case err == nil && !equality.Semantic.DeepEqual(original.Status.LastPass, sm.Status.LastPass):
			// A pass's end is recorded: a refusal before it is over.
			r.passes.refused.Forget(sm.Name)
		}
		if err != nil {
			retErr = errors.Join(retErr, client.IgnoreNotFound(err))
		}
	}()

	out, requeueAfter := r.reconcile(ctx, sm)
	if out.phase == phaseReconciling && reRunRequested(sm) {
		// Say at once that the request was seen (kubectl restow migrate
		// --wait takes a status change as the operator's answer); the
		// token is handled when its pass starts.
		out.message += ". A re-run was requested: it starts when this one ends"
	}
	r.announceTransition(sm, original, out)
	r.showStandard(ctx, sm, original)
	setConditions(&sm.Status, out, sm.Generation)
	sm.Status.ProgressSummary = progressSummary(&sm.Status)
	return ctrl.Result{RequeueAfter: requeueAfter}, nil
}

// statusRefused reports whether the API server refused a status write for
// good: any 4xx but a conflict (the object changed: the next reconcile reads
// it anew), a missing object, a 429 and a 401 (credentials rotating).
func statusRefused(err error) bool {
	var status apierrors.APIStatus
	if err == nil || !errors.As(err, &status) || apierrors.IsConflict(err) || apierrors.IsNotFound(err) || apierrors.IsTooManyRequests(err) || apierrors.IsUnauthorized(err) {
		return false
	}
	code := status.Status().Code
	return code >= 400 && code < 500
}

// recordStatusRefused writes, in place of a status the API server refused,
// the status the StorageMigration had with Stalled/StatusRefused and the
// API server's answer, and logs and records it. The reconcile is retried
// with a backoff of its own, as long as the stalled one: a pass that cannot
// record its end would otherwise be started again at once, and again. A pass under way goes on
// (its own checks guard any prune); its end is recorded, or refused, as
// any status.
func (r *StorageMigrationReconciler) recordStatusRefused(ctx context.Context, sm, original *migrationv1alpha1.StorageMigration, refusal error) error {
	msg := fmt.Sprintf("The API server refused this StorageMigration's status, so passes cannot record their progress; tried again with backoff: %s", migrator.MessageUpTo(refusal, 1024))
	ctrl.LoggerFrom(ctx).Error(errors.New(migrator.Message(refusal)), "The API server refused a status write; the migration is Stalled until it accepts one", "reason", apierrors.ReasonForError(refusal))
	fallback := original.DeepCopy()
	setConditions(&fallback.Status, stalled(migrationv1alpha1.StatusRefusedReason, msg), sm.Generation)
	fallback.Status.ProgressSummary = progressSummary(&fallback.Status)
	if c := meta.FindStatusCondition(original.Status.Conditions, migrationv1alpha1.StalledCondition); c == nil || c.Reason != migrationv1alpha1.StatusRefusedReason {
		r.Recorder.Eventf(sm, nil, corev1.EventTypeWarning, migrationv1alpha1.StatusRefusedReason, "Migrate", "%s", msg)
	}
	if equality.Semantic.DeepEqual(original.Status, fallback.Status) {
		return nil
	}
	return r.Client.Status().Patch(ctx, fallback, client.MergeFrom(original))
}

// showStandard lists in status the standard StorageVersionMigrations of
// sm's resource, and records an event for each one that appears or changes
// state: another migrator is at work on the resource.
func (r *StorageMigrationReconciler) showStandard(ctx context.Context, sm, original *migrationv1alpha1.StorageMigration) {
	ms, err := r.Standard.forResource(ctx, schema.GroupResource{Group: sm.Spec.Resource.Group, Resource: sm.Spec.Resource.Resource})
	if err != nil {
		// Shown again on the next reconcile; the migration does not depend on it.
		ctrl.LoggerFrom(ctx).V(1).Info("Could not list the StorageVersionMigrations of the resource", "error", err.Error())
		return
	}
	sm.Status.StorageVersionMigrations = statusStandard(ms)
	for _, m := range sm.Status.StorageVersionMigrations {
		if slices.Contains(original.Status.StorageVersionMigrations, m) {
			continue
		}
		msg := fmt.Sprintf("StorageVersionMigration %s of this resource is %s", m.Name, m.State)
		switch {
		case svm.State(m.State).Final():
		case r.Standard.Served:
			msg += "; restow serves the StorageVersionMigrations whose status no other controller writes, with the same safeguards as this StorageMigration"
		default:
			msg += "; its controller may prune the CRD's status.storedVersions without restow's settle window or its wait for every API server"
		}
		r.Recorder.Eventf(sm, nil, corev1.EventTypeNormal, "StorageVersionMigration", "Migrate", "%s", msg)
	}
}

// announceTransition records an event when the Ready condition's reason
// changes (the migration starts waiting, a pass pauses or settles, it
// recovers), unless the step that decided the outcome recorded one itself.
// Warnings are for Stalled and for transient errors.
func (r *StorageMigrationReconciler) announceTransition(sm, original *migrationv1alpha1.StorageMigration, out outcome) {
	if out.announced {
		return
	}
	if prev := meta.FindStatusCondition(original.Status.Conditions, migrationv1alpha1.ReadyCondition); prev != nil && prev.Reason == out.reason {
		return
	}
	eventType := corev1.EventTypeNormal
	if out.phase == phaseStalled || out.reason == migrationv1alpha1.TransientErrorReason {
		eventType = corev1.EventTypeWarning
	}
	r.Recorder.Eventf(sm, nil, eventType, out.reason, "Migrate", "%s", out.message)
}

// reconcile follows the pass of sm, or starts one if the resource needs it.
func (r *StorageMigrationReconciler) reconcile(ctx context.Context, sm *migrationv1alpha1.StorageMigration) (outcome, time.Duration) {
	p := r.passes.get(sm.Name)
	if p == nil {
		return r.startIfNeeded(ctx, sm)
	}
	state := p.read()
	if !state.done {
		if p.generation != sm.Generation {
			// The spec changed: restart with the new knobs. The pass ends
			// cancelled and wakes us.
			p.cancel()
		}
		sm.Status.Progress = statusProgress(state.progress)
		sm.Status.FailedObjects = statusFailures(state.progress.Failures)
		return passUnderWay(p.target, state.progress, sm.Status.Progress, time.Now()), r.StatusInterval
	}
	r.passes.forget(sm.Name)
	v := judge(p.target, state, time.Now())
	requeueAfter := r.record(ctx, sm, p, state, v)
	if v.eventReason != "" {
		v.outcome = v.withEvent()
	}
	switch {
	case p.generation != sm.Generation && v.phase != phaseStalled:
		// The spec changed after the pass had ended: act on it now, so
		// observedGeneration catches up.
		return reconciling(migrationv1alpha1.ProgressingReason, "The spec changed; a new pass starts"), restartDelay
	case reRunRequested(sm):
		// A re-run was requested while this pass ran: it asks for a pass
		// that starts after the request, so start one now.
		requeueAfter = restartDelay
	}
	return v.outcome, requeueAfter
}

// record writes a verdict into status, events and metrics, and returns when
// to look again.
func (r *StorageMigrationReconciler) record(ctx context.Context, sm *migrationv1alpha1.StorageMigration, p *pass, state passState, v verdict) time.Duration {
	resource := p.target.Resource.GroupResource().String()
	sm.Status.Progress = nil
	if v.checkpoint {
		// The last progress matches its continue token, so a resumed pass
		// counts no page twice.
		sm.Status.Progress = statusProgress(state.progress)
	}
	if v.summary != nil {
		sm.Status.LastPass, sm.Status.FailedObjects = v.summary, statusFailures(state.result.Failures)
	}
	if v.eventReason != "" {
		r.Recorder.Eventf(sm, nil, v.eventType, v.eventReason, v.eventAction, "%s", v.eventMessage)
	}
	passesTotal.WithLabelValues(resource, v.result).Inc()
	switch v.next {
	case nextRestart:
		return restartDelay
	case nextResume:
		ctrl.LoggerFrom(ctx).Info("Pass paused by a transient error, resuming later", "error", migrator.Message(state.err))
		return transientRetryDelay
	case nextStalled:
		return r.passes.stalled.When(sm.Name)
	}
	// The pass reached its end without failures.
	r.passes.stalled.Forget(sm.Name)
	if pruned := state.result.Pruned; len(pruned) > 0 {
		storedVersionsPrunes.WithLabelValues(resource).Inc()
		r.Recorder.Eventf(sm, nil, corev1.EventTypeNormal, "Pruned", "Prune", "Removed %v from status.storedVersions of CRD %s", pruned, p.target.CRD.Name)
	}
	passDuration.WithLabelValues(resource).Observe(v.summary.CompletionTime.Sub(v.summary.StartTime.Time).Seconds())
	ctrl.LoggerFrom(ctx).Info("Pass succeeded", "targetVersion", v.summary.TargetVersion, "listed", v.summary.Listed, "migrated", v.summary.Migrated,
		"skipped", v.summary.Skipped, "rechecked", v.summary.Rechecked, "pruned", v.summary.PrunedVersions)
	return 0
}

func reRunRequested(sm *migrationv1alpha1.StorageMigration) bool {
	return sm.Annotations[migrationv1alpha1.ReRunAnnotation] != sm.Status.LastHandledReRunToken
}

// startIfNeeded resolves the resource and starts a pass if it needs one.
func (r *StorageMigrationReconciler) startIfNeeded(ctx context.Context, sm *migrationv1alpha1.StorageMigration) (outcome, time.Duration) {
	gr := schema.GroupResource{Group: sm.Spec.Resource.Group, Resource: sm.Spec.Resource.Resource}
	target, err := r.Migrator.Resolve(ctx, gr)
	var waitErr *migrator.WaitError
	var stalledErr *migrator.StalledError
	if !errors.As(err, &waitErr) {
		r.passes.waiting.Forget(sm.Name)
	}
	switch {
	case waitErr != nil:
		sm.Status.ObservedGeneration = sm.Generation
		return reconciling(migrationv1alpha1.WaitingForStorageVersionReason, waitErr.Message), r.passes.waiting.When(sm.Name)
	case errors.As(err, &stalledErr):
		sm.Status.ObservedGeneration = sm.Generation
		// A re-run requested now has its answer: it stalled.
		sm.Status.LastHandledReRunToken = sm.Annotations[migrationv1alpha1.ReRunAnnotation]
		if c := meta.FindStatusCondition(sm.Status.Conditions, migrationv1alpha1.StalledCondition); c == nil || c.Status != metav1.ConditionTrue || c.Message != stalledErr.Message {
			// Once per cause, not once per retry.
			r.Recorder.Eventf(sm, nil, corev1.EventTypeWarning, migrationv1alpha1.UnsupportedReason, "Migrate", "%s", stalledErr.Message)
		}
		return stalled(migrationv1alpha1.UnsupportedReason, stalledErr.Message).withEvent(), r.passes.stalled.When(sm.Name)
	case err != nil:
		return reconciling(migrationv1alpha1.TransientErrorReason, migrator.Message(err)), transientRetryDelay
	}

	why := passNeeded(sm, target)
	if why == "" {
		sm.Status.ObservedGeneration = sm.Generation
		msg := fmt.Sprintf("All objects are stored at %s", target.TargetVersion())
		if c := meta.FindStatusCondition(sm.Status.Conditions, migrationv1alpha1.ReadyCondition); c != nil && c.Status == metav1.ConditionTrue &&
			c.ObservedGeneration == sm.Generation && strings.HasSuffix(c.Message, " stored at "+target.TargetVersion()) {
			// Keep the last pass's count ("All 200 objects are ...").
			msg = c.Message
		}
		return ready(msg), 0
	}
	return r.startPass(ctx, sm, target, why), r.StatusInterval
}

// passNeeded says why the resource needs a pass, or returns "".
func passNeeded(sm *migrationv1alpha1.StorageMigration, target migrator.Target) string {
	last := sm.Status.LastPass
	switch {
	case sm.Status.Progress != nil:
		return "resuming an interrupted pass"
	case last == nil:
		return "first pass"
	case sm.Generation != sm.Status.ObservedGeneration:
		return "the spec changed"
	case reRunRequested(sm):
		return "a re-run was requested"
	case last.TargetVersion != target.TargetVersion():
		return "the storage version changed"
	case last.Failed > 0:
		return "retrying objects that failed"
	case target.CRD != nil && pruneEnabled(sm) && !slices.Equal(target.CRD.StoredVersions, []string{target.CRD.StorageVersion}):
		return "status.storedVersions lists other versions"
	case target.CRD != nil && slices.ContainsFunc(last.ServedVersions, func(v string) bool { return !slices.Contains(target.CRD.ServedVersions, v) }):
		return "a version stopped being served: re-pointing managedFields that name it"
	}
	return ""
}

// startPass launches a pass in the background, resuming an interrupted one
// from its checkpoint when it was taken on the same CRD at the same
// generation.
func (r *StorageMigrationReconciler) startPass(ctx context.Context, sm *migrationv1alpha1.StorageMigration, target migrator.Target, why string) outcome {
	opts := migrator.Options{
		Concurrency:  r.Concurrency,
		PageSize:     r.PageSize,
		ViaStatus:    sm.Spec.RewriteViaStatus != nil && *sm.Spec.RewriteViaStatus,
		RetryBackoff: r.RetryBackoff,
		SettleWindow: r.SettleWindow,
		Prune:        pruneEnabled(sm),
	}
	if sm.Spec.Concurrency != nil {
		opts.Concurrency = int(*sm.Spec.Concurrency)
	}
	if sm.Spec.PageSize != nil {
		opts.PageSize = int64(*sm.Spec.PageSize)
	}
	cp := checkpoint(&sm.Status)
	resumed := cp.Resumes(target)
	if !resumed {
		switch {
		case cp != nil && cp.LagWait < target.LagWait:
			why = "starting over: the interrupted pass waited less for every API server to switch than this control plane needs"
		case cp != nil:
			why = "starting over: the CRD or the target version changed since the interrupted pass"
		}
		cp = migrator.NewCheckpoint(target)
	}
	opts.Resume = cp
	p := &pass{target: target, state: passState{progress: migrator.Progress{Checkpoint: *cp}}, counted: cp.Counts}

	sm.Status.TargetVersion = target.TargetVersion()
	sm.Status.ObservedGeneration = sm.Generation
	sm.Status.LastHandledReRunToken = sm.Annotations[migrationv1alpha1.ReRunAnnotation]
	sm.Status.Progress = statusProgress(p.state.progress)
	sm.Status.FailedObjects = statusFailures(cp.Failures)

	log := ctrl.LoggerFrom(ctx)
	launched := r.passes.launch(ctx, sm, p, func(ctx context.Context, observe migrator.Observer) (migrator.Result, error) {
		return r.Migrator.Migrate(ctrl.LoggerInto(ctx, log), target, opts, observe)
	})
	if !launched {
		return reconciling(migrationv1alpha1.ProgressingReason, "The operator is stopping; the pass starts when it runs again")
	}
	log.Info("Starting pass", "resource", target.Resource.GroupResource(), "targetVersion", target.TargetVersion(), "reason", why, "resumed", resumed)
	r.Recorder.Eventf(sm, nil, corev1.EventTypeNormal, "PassStarted", "Migrate", "Rewriting %s to %s: %s", target.Resource.GroupResource(), target.TargetVersion(), why)
	if switchedBy := cp.StartTime.Add(cp.LagWait); !resumed && time.Until(switchedBy) > time.Second {
		return reconciling(migrationv1alpha1.WaitingForStorageVersionReason, migrator.LagMessage(target, switchedBy)).withEvent()
	}
	return reconciling(migrationv1alpha1.ProgressingReason, fmt.Sprintf("Rewriting objects to %s (%s)", target.TargetVersion(), why)).withEvent()
}

func pruneEnabled(sm *migrationv1alpha1.StorageMigration) bool {
	return sm.Spec.PruneStoredVersions == nil || *sm.Spec.PruneStoredVersions
}
