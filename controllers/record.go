package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/svm"
)

// One place records an outcome: record writes what a reconcile of a
// StorageMigration concluded into its status, its events and the metrics.
// The steps that decide (reconcile, startIfNeeded, startRun, judge and
// ended) write none of them; they fill in an outcome. Reconcile then patches
// status once; only when the API server refuses that patch does
// recordStatusRefused write a status of its own. (The object metrics and
// the gauges of a run under way are counted by the run as it goes, page by
// page: runs.go, launch.)

// stepEvent is an event that the step that decided an outcome records of
// its own, richer than the one a transition of Ready's reason would get
// (docs/architecture.md, Events).
type stepEvent struct {
	eventType, reason, action, message string
}

// field is a value for a field of status, or, unset, none: the field keeps
// its value.
type field[T any] struct {
	value T
	set   bool
}

func set[T any](value T) field[T] { return field[T]{value: value, set: true} }

func (f field[T]) writeTo(dst *T) {
	if f.set {
		*dst = f.value
	}
}

// statusFields are the fields of status that a reconcile sets besides the
// conditions and progressSummary, which follow from the outcome and from
// these.
type statusFields struct {
	observedGeneration       field[int64]
	lastHandledReRunToken    field[string]
	targetVersion            field[string]
	progress                 field[*migrationv1alpha1.PassProgress]
	failedObjects            field[[]migrationv1alpha1.FailedObject]
	lastPass                 field[*migrationv1alpha1.PassSummary]
	baseline                 field[*migrationv1alpha1.StorageBaseline]
	encryption               field[*migrationv1alpha1.EncryptionRecord]
	storageVersionMigrations field[[]migrationv1alpha1.StandardMigration]
}

func (f statusFields) writeTo(s *migrationv1alpha1.StorageMigrationStatus) {
	f.observedGeneration.writeTo(&s.ObservedGeneration)
	f.lastHandledReRunToken.writeTo(&s.LastHandledReRunToken)
	f.targetVersion.writeTo(&s.TargetVersion)
	f.progress.writeTo(&s.Progress)
	f.failedObjects.writeTo(&s.FailedObjects)
	f.lastPass.writeTo(&s.LastPass)
	f.baseline.writeTo(&s.Baseline)
	f.encryption.writeTo(&s.Encryption)
	f.storageVersionMigrations.writeTo(&s.StorageVersionMigrations)
}

// record is the one writer of what a reconcile of sm concluded (out): the
// fields of status, the step's own events, the metrics of a run's end, the
// conditions with the event of their transition, and the events of the
// standard StorageVersionMigrations of the resource. original is sm as read.
func (r *StorageMigrationReconciler) record(sm, original *migrationv1alpha1.StorageMigration, out outcome) {
	out.status.writeTo(&sm.Status)
	if out.condition == conditionReconciling && reRunRequested(sm) {
		// Say at once that the request was seen (kubectl restow migrate
		// --wait takes a status change as the operator's answer); the
		// token is handled when its run starts.
		out.message += ". A re-run was requested: it starts when this one ends"
	}
	for _, e := range out.events {
		r.Recorder.Eventf(sm, nil, e.eventType, e.reason, e.action, "%s", e.message)
	}
	countRunEnd(out.ended)
	r.recordConditions(sm, original, out)
	r.recordStandard(sm, original)
}

// recordConditions writes the conditions of out, and progressSummary, into
// sm's status, and records the event of the transition from original.
func (r *StorageMigrationReconciler) recordConditions(sm, original *migrationv1alpha1.StorageMigration, out outcome) {
	r.announceTransition(sm, original, out)
	setConditions(&sm.Status, out, sm.Generation)
	recordGauges(sm, out)
	sm.Status.ProgressSummary = progressSummary(&sm.Status)
}

// announceTransition records an event when the Ready condition's reason
// changes (the migration starts waiting, a run pauses or settles, it
// recovers, the API server refuses its status), unless the step that decided
// the outcome has an event of its own: one event per transition. Warnings
// are for Stalled and for transient errors.
func (r *StorageMigrationReconciler) announceTransition(sm, original *migrationv1alpha1.StorageMigration, out outcome) {
	if out.announced {
		return
	}
	if prev := meta.FindStatusCondition(original.Status.Conditions, migrationv1alpha1.ReadyCondition); prev != nil && prev.Reason == out.reason {
		return
	}
	eventType := corev1.EventTypeNormal
	if out.condition == conditionStalled || out.reason == migrationv1alpha1.TransientErrorReason {
		eventType = corev1.EventTypeWarning
	}
	r.Recorder.Eventf(sm, nil, eventType, out.reason, "Migrate", "%s", out.message)
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
// with a backoff of its own, as long as the stalled one: a run that cannot
// record its end would otherwise be started again at once, and again. A run
// under way goes on (its own checks guard any prune); its end is recorded,
// or refused, as any status.
//
// This is the one status written outside record and Reconcile's patch, and
// it must be: it is decided by the API server's answer to that patch, after
// record, and it starts again from the status as read, not from what the
// refused patch carried. Its conditions, progressSummary and event go
// through recordConditions all the same, so StatusRefused is announced as
// any transition of Ready's reason, once per cause.
func (r *StorageMigrationReconciler) recordStatusRefused(ctx context.Context, original *migrationv1alpha1.StorageMigration, refusal error) error {
	msg := fmt.Sprintf("The API server refused this StorageMigration's status, so passes cannot record their progress; tried again with backoff: %s", migrator.MessageUpTo(refusal, 1024))
	ctrl.LoggerFrom(ctx).Error(errors.New(migrator.Message(refusal)), "The API server refused a status write; the migration is Stalled until it accepts one", "reason", apierrors.ReasonForError(refusal))
	fallback := original.DeepCopy()
	r.recordConditions(fallback, original, stalled(migrationv1alpha1.StatusRefusedReason, msg))
	if equality.Semantic.DeepEqual(original.Status, fallback.Status) {
		return nil
	}
	return r.Client.Status().Patch(ctx, fallback, client.MergeFrom(original))
}

// standardFor is status.storageVersionMigrations for sm: the standard
// StorageVersionMigrations of its resource, or unset when they could not be
// read.
func (r *StorageMigrationReconciler) standardFor(ctx context.Context, sm *migrationv1alpha1.StorageMigration) field[[]migrationv1alpha1.StandardMigration] {
	ms, err := r.Standard.forResource(ctx, schema.GroupResource{Group: sm.Spec.Resource.Group, Resource: sm.Spec.Resource.Resource})
	if err != nil {
		// Shown again on the next reconcile; the migration does not depend on it.
		ctrl.LoggerFrom(ctx).V(1).Info("Could not list the StorageVersionMigrations of the resource", "error", err.Error())
		return field[[]migrationv1alpha1.StandardMigration]{}
	}
	return set(statusStandard(ms))
}

// recordStandard records an event for each standard StorageVersionMigration
// in sm's status that original did not show, or showed in another state:
// another migrator is at work on the resource.
func (r *StorageMigrationReconciler) recordStandard(sm, original *migrationv1alpha1.StorageMigration) {
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
