package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/storedversions"
)

// The end of a pass is judged once (judge, a pure function) and recorded in
// one place (record): the engine's outcome becomes conditions, status, an
// event, metrics and the next requeue here, nowhere else.

// next is what comes after a pass ended.
type next int

const (
	// nextNone: done until something changes.
	nextNone next = iota
	// nextRestart: a new pass starts at once.
	nextRestart
	// nextResume: the pass paused; it resumes from its checkpoint shortly.
	nextResume
	// nextStalled: retried with the stalled backoff.
	nextStalled
)

// verdict is what the end of a pass means.
type verdict struct {
	outcome
	next next
	// result labels restow_passes_total: succeeded, stalled, transient, restarted.
	result string
	// eventType and eventReason, when set, record the message as an event.
	eventType, eventReason, eventAction string
	eventMessage                        string
	// checkpoint keeps the pass's checkpoint in status for a resume.
	checkpoint bool
	// summary is the last pass, for a pass that reached its end.
	summary *migrationv1alpha1.PassSummary
}

// judge decides what the end of a pass means. now is the completion time.
func judge(target migrator.Target, state passState, now time.Time) verdict {
	version := target.TargetVersion()
	var stalledErr *migrator.StalledError
	switch err := state.err; {
	case errors.Is(err, context.Canceled):
		// Cancelled for a new spec: start over from where it got to.
		return verdict{outcome: reconciling(migrationv1alpha1.ProgressingReason, "Restarting the pass for the new spec"),
			next: nextRestart, result: "restarted", checkpoint: true}
	case errors.Is(err, storedversions.ErrCRDChanged):
		return verdict{outcome: reconciling(migrationv1alpha1.ProgressingReason, "The CRD changed during the pass; a new pass starts"),
			next: nextRestart, result: "restarted",
			eventType: corev1.EventTypeNormal, eventReason: migrationv1alpha1.ProgressingReason, eventAction: "Migrate",
			eventMessage: fmt.Sprintf("CRD %s changed during the pass; starting a new pass", target.CRD.Name)}
	case errors.As(err, &stalledErr):
		return verdict{outcome: stalled(migrationv1alpha1.UnsupportedReason, stalledErr.Message), next: nextStalled, result: "stalled",
			eventType: corev1.EventTypeWarning, eventReason: migrationv1alpha1.UnsupportedReason, eventAction: "Migrate", eventMessage: stalledErr.Message}
	case err != nil:
		return verdict{outcome: reconciling(migrationv1alpha1.TransientErrorReason, "The pass paused after transient errors and resumes shortly: "+migrator.Message(err)),
			next: nextResume, result: "transient", checkpoint: true}
	}

	result := state.result
	summary := &migrationv1alpha1.PassSummary{
		ObjectCounts: statusCounts(result.Counts), StartTime: metav1.NewTime(result.StartTime), CompletionTime: metav1.NewTime(now),
		TargetVersion: version, PrunedVersions: result.Pruned,
	}
	if target.CRD != nil {
		summary.ServedVersions = target.CRD.ServedVersions
	}
	if summary.Failed > 0 {
		msg := fmt.Sprintf("%d of %d objects could not be rewritten to %s; status.failedObjects names them. Nothing was pruned; the pass is retried with backoff", summary.Failed, summary.Listed, version)
		return verdict{outcome: stalled(migrationv1alpha1.ObjectsFailedReason, msg), next: nextStalled, result: "stalled", summary: summary,
			eventType: corev1.EventTypeWarning, eventReason: migrationv1alpha1.ObjectsFailedReason, eventAction: "Migrate", eventMessage: msg}
	}
	msg := fmt.Sprintf("All %d objects are stored at %s", summary.Listed, version)
	return verdict{outcome: ready(msg), result: "succeeded", summary: summary,
		eventType: corev1.EventTypeNormal, eventReason: migrationv1alpha1.SucceededReason, eventAction: "Migrate",
		eventMessage: fmt.Sprintf("%s (%d re-encoded, %d already stored, %d changed by others meanwhile, %d rewritten again after the settle window)",
			msg, summary.Migrated, summary.AlreadyStored, summary.Skipped, summary.Rechecked)}
}

// passUnderWay says what a running pass is doing.
func passUnderWay(target migrator.Target, p migrator.Progress, status *migrationv1alpha1.PassProgress, now time.Time) outcome {
	switch {
	case p.Retrying != "":
		return reconciling(migrationv1alpha1.TransientErrorReason, "Retrying after a transient error: "+p.Retrying)
	case p.WaitingForSlot:
		return reconciling(migrationv1alpha1.ProgressingReason, "Waiting for one of the passes that run at once (--max-concurrent-passes) to end")
	case p.Phase == migrator.PhaseRewriting && p.Done() == 0 && now.Before(p.SwitchedBy):
		return reconciling(migrationv1alpha1.WaitingForStorageVersionReason, migrator.LagMessage(target, p.SwitchedBy))
	case p.Phase == migrator.PhaseSettling:
		return reconciling(migrationv1alpha1.SettlingReason, fmt.Sprintf(
			"All %d objects were rewritten to %s; waiting until %s, the end of the settle window, for writes that began on the old storage, then re-checking what others wrote meanwhile before pruning",
			p.Listed, target.TargetVersion(), p.SettleUntil.UTC().Format(time.RFC3339)))
	case p.Phase == migrator.PhaseRechecking:
		return reconciling(migrationv1alpha1.SettlingReason, fmt.Sprintf("The settle window is over; rewriting again the objects others wrote within it (%d so far) before pruning", p.Rechecked))
	}
	return reconciling(migrationv1alpha1.ProgressingReason, progressMessage(target.TargetVersion(), status))
}

// The engine's words and the API's: counts, failures, progress, checkpoints.

func statusCounts(c migrator.Counts) migrationv1alpha1.ObjectCounts {
	return migrationv1alpha1.ObjectCounts{Listed: c.Listed, Migrated: c.Migrated, AlreadyStored: c.AlreadyStored, Skipped: c.Skipped, Failed: c.Failed, Rechecked: c.Rechecked}
}

func engineCounts(c migrationv1alpha1.ObjectCounts) migrator.Counts {
	return migrator.Counts{Listed: c.Listed, Migrated: c.Migrated, AlreadyStored: c.AlreadyStored, Skipped: c.Skipped, Failed: c.Failed, Rechecked: c.Rechecked}
}

func statusFailures(failures []migrator.Failure) []migrationv1alpha1.FailedObject {
	if len(failures) == 0 {
		return nil
	}
	out := make([]migrationv1alpha1.FailedObject, 0, len(failures))
	for _, f := range failures {
		out = append(out, migrationv1alpha1.FailedObject{Namespace: f.Namespace, Name: f.Name, Reason: f.Reason, Message: f.Message})
	}
	return out
}

func engineFailures(failures []migrationv1alpha1.FailedObject) []migrator.Failure {
	out := make([]migrator.Failure, 0, len(failures))
	for _, f := range failures {
		out = append(out, migrator.Failure{Namespace: f.Namespace, Name: f.Name, Reason: f.Reason, Message: f.Message})
	}
	return out
}

// statusProgress is status.progress for a pass's progress.
func statusProgress(p migrator.Progress) *migrationv1alpha1.PassProgress {
	progress := &migrationv1alpha1.PassProgress{
		ObjectCounts:             statusCounts(p.Counts),
		StartTime:                metav1.NewTime(p.StartTime),
		RemainingEstimate:        p.RemainingEstimate,
		ContinueToken:            p.Continue,
		Phase:                    migrationv1alpha1.PassPhase(p.Phase),
		CRDUID:                   string(p.CRDUID),
		CRDGeneration:            p.CRDGeneration,
		ListResourceVersion:      p.ListResourceVersion,
		WindowEndResourceVersion: p.WindowEnd,
	}
	if p.Phase != migrator.PhaseRewriting && !p.SettleUntil.IsZero() {
		progress.SettleUntil = &metav1.Time{Time: p.SettleUntil}
	}
	if p.LagWait > 0 {
		progress.LagWait = &metav1.Duration{Duration: p.LagWait}
	}
	if !p.SwitchedBy.IsZero() {
		progress.SwitchedBy = &metav1.Time{Time: p.SwitchedBy}
	}
	return progress
}

// checkpoint is the checkpoint of an interrupted pass saved in status, or nil.
func checkpoint(status *migrationv1alpha1.StorageMigrationStatus) *migrator.Checkpoint {
	p := status.Progress
	if p == nil {
		return nil
	}
	phase := migrator.Phase(p.Phase)
	if phase == "" {
		phase = migrator.PhaseRewriting
	}
	var lagWait time.Duration
	if p.LagWait != nil {
		lagWait = p.LagWait.Duration
	}
	return &migrator.Checkpoint{
		Phase:               phase,
		StartTime:           p.StartTime.Time,
		LagWait:             lagWait,
		TargetVersion:       status.TargetVersion,
		CRDUID:              types.UID(p.CRDUID),
		CRDGeneration:       p.CRDGeneration,
		ListResourceVersion: p.ListResourceVersion,
		WindowEnd:           p.WindowEndResourceVersion,
		Continue:            p.ContinueToken,
		Counts:              engineCounts(p.ObjectCounts),
		Failures:            engineFailures(status.FailedObjects),
	}
}
