package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	svmv1 "k8s.io/api/storagemigration/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/svm"
)

// The one writer of the StorageVersionMigration controller: what a
// reconcile concluded goes into the object's status in one update, then its
// events, the metrics of a run's end and the run's bookkeeping. A status
// the API server refuses, or that conflicts, leaves the run as it was: its
// end is written on the next try, and no new run starts meanwhile.

// The reasons of the standard conditions restow writes, the in-tree
// controller's own, so that tools that read them see no difference.
const (
	svmRunningReason   = "MigrationRunning"
	svmCompletedReason = "MigrationCompleted"
	svmSucceededReason = "StorageVersionMigrationSucceeded"
	svmFailedReason    = "StorageVersionMigrationFailed"
)

// svmOutcome is what a reconcile of a StorageVersionMigration concluded.
type svmOutcome struct {
	// running, when set, is the message of Running=True.
	running string
	// end, when set, ends the migration: Succeeded or Failed, both final.
	end *svmEnd
	// resourceVersion, when set, is status.resourceVersion: restow's claim
	// (the objects the migration covers).
	resourceVersion string
	// events are recorded once status holds the outcome.
	events []svmEvent
	// ended is the end of a run, for the metrics, counted once recorded.
	ended *runEnd
	// settles is the ended run whose end this outcome records: forgotten
	// only once status holds it.
	settles *run
	// resume is the checkpoint of a paused run, kept for the next run once recorded.
	resume *migrator.Checkpoint
	// stop stops the object's run (another controller acts on it); forget
	// drops everything restow keeps of it.
	stop, forget bool
	requeue      time.Duration
	err          error
}

// svmEnd is a final condition: Succeeded or Failed.
type svmEnd struct {
	condition       svmv1.MigrationConditionType
	reason, message string
}

// svmEvent is an event of an outcome. With once set, it is recorded only
// when onceAs (else its message) differs from what the last event of that
// kind said of the object; logError logs it at error level too.
type svmEvent struct {
	stepEvent
	once, onceAs string
	logError     bool
}

// recordStandardOutcome writes out for m (u as read): status in one update
// if it changes, then the events, the metrics and the run's bookkeeping.
func (r *StorageVersionMigrationReconciler) recordStandardOutcome(ctx context.Context, u client.Object, m *svmv1.StorageVersionMigration, out svmOutcome) (ctrl.Result, error) {
	switch {
	case out.forget:
		r.forget(m.Name)
		return ctrl.Result{}, nil
	case out.stop:
		r.runs.stop(m.Name)
		r.mu.Lock()
		delete(r.resume, m.Name)
		r.mu.Unlock()
	}
	original := m.DeepCopy()
	out.writeTo(m)
	if err := r.updateStatus(ctx, original, m); err != nil {
		switch {
		case apierrors.IsConflict(err):
			// Someone wrote the object: the next reconcile reads it anew
			// (another writer stops restow) and records the same end.
			return ctrl.Result{RequeueAfter: restartDelay}, nil
		case statusRefused(err):
			return r.recordRefused(ctx, u, original, out, err), nil
		}
		return ctrl.Result{}, err
	}
	r.runs.refused.Forget(m.Name)
	r.sayOnce(saidRefused, m.Name, "")
	for _, e := range out.events {
		r.recordEvent(ctx, u, e)
	}
	countRunEnd(out.ended)
	if out.settles != nil {
		r.runs.forget(m.Name)
	}
	if out.resume != nil {
		r.mu.Lock()
		r.resume[m.Name] = out.resume
		r.mu.Unlock()
	}
	return ctrl.Result{RequeueAfter: out.requeue}, out.err
}

// writeTo sets out's status fields on m.
func (out svmOutcome) writeTo(m *svmv1.StorageVersionMigration) {
	if out.resourceVersion != "" {
		m.Status.ResourceVersion = out.resourceVersion
	}
	switch {
	case out.end != nil:
		setStandardCondition(m, out.end.condition, metav1.ConditionTrue, out.end.reason, out.end.message)
		setStandardCondition(m, svmv1.MigrationRunning, metav1.ConditionFalse, svmCompletedReason, "Migration completed")
	case out.running != "":
		setStandardCondition(m, svmv1.MigrationRunning, metav1.ConditionTrue, svmRunningReason, out.running)
	}
}

func setStandardCondition(m *svmv1.StorageVersionMigration, t svmv1.MigrationConditionType, status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{
		Type: string(t), Status: status, Reason: reason, Message: message, ObservedGeneration: m.Generation,
	})
}

// updateStatus writes m's status if it differs from original's. An update,
// not a patch: it carries the resourceVersion read, so a status another
// controller wrote meanwhile is never overwritten.
func (r *StorageVersionMigrationReconciler) updateStatus(ctx context.Context, original, m *svmv1.StorageVersionMigration) error {
	if equality.Semantic.DeepEqual(original.Status, m.Status) {
		return nil
	}
	updated, err := svm.ToUnstructured(m, r.Version)
	if err != nil {
		return err
	}
	return r.Client.Status().Update(ctx, updated, client.FieldOwner(StatusFieldOwner))
}

// recordEvent records e on u, once per cause when e says so.
func (r *StorageVersionMigrationReconciler) recordEvent(ctx context.Context, u client.Object, e svmEvent) {
	if e.once != "" {
		what := e.onceAs
		if what == "" {
			what = e.message
		}
		if !r.sayOnce(e.once, u.GetName(), what) {
			return
		}
	}
	if e.logError {
		ctrl.LoggerFrom(ctx).Error(errors.New(e.message), "Recorded a warning", "reason", e.reason)
	}
	r.Recorder.Eventf(u, nil, e.eventType, e.reason, e.action, "%s", e.message)
}

// recordRefused says, once per cause, that the API server refused the
// status of out, and when restow tries again: a Warning event, a log at
// error level and, on an object restow has claimed, Running's message where
// the API server accepts that. The run stays as it was: an ended run's end
// is what the next try records, never a new run.
func (r *StorageVersionMigrationReconciler) recordRefused(ctx context.Context, u client.Object, original *svmv1.StorageVersionMigration, out svmOutcome, refusal error) ctrl.Result {
	answer := migrator.MessageUpTo(refusal, 1024)
	msg := "The API server refused restow's write of this StorageVersionMigration's status: " + answer + "; restow tries again with backoff"
	if out.end != nil {
		msg = fmt.Sprintf("restow's run ended, %s: %s. The API server refused to record it: %s. The run is not repeated; restow tries again to record its end, with backoff",
			out.end.condition, out.end.message, answer)
	}
	ctrl.LoggerFrom(ctx).Error(errors.New(migrator.Message(refusal)), "The API server refused a StorageVersionMigration's status", "reason", apierrors.ReasonForError(refusal))
	r.recordEvent(ctx, u, svmEvent{stepEvent: stepEvent{corev1.EventTypeWarning, StatusRefusedEventReason, "Migrate", msg}, once: saidRefused, onceAs: answer})
	if original.Status.ResourceVersion != "" {
		// Where the API server refuses the end only, Running says it.
		fallback := original.DeepCopy()
		setStandardCondition(fallback, svmv1.MigrationRunning, metav1.ConditionTrue, svmRunningReason, msg)
		if err := r.updateStatus(ctx, original, fallback); err != nil {
			ctrl.LoggerFrom(ctx).V(1).Info("The API server refused Running's message too", "error", migrator.Message(err))
		}
	}
	return ctrl.Result{RequeueAfter: r.runs.refused.When(original.Name)}
}
