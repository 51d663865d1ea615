package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/sets"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/storedversions"
)

// What a run means: under way (runUnderWay) or at its end (judge, a pure
// function). The end is judged once, here; record (record.go) writes it,
// as every other outcome, into status, events and metrics.

// next is what comes after a run ended.
type next int

const (
	// nextNone: done until something changes.
	nextNone next = iota
	// nextRestart: a new run starts at once.
	nextRestart
	// nextResume: the run paused; a new one resumes from its checkpoint shortly.
	nextResume
	// nextStalled: retried with the stalled backoff.
	nextStalled
	// nextSpace: stopped for etcd's room (an alarm, the quota, no
	// compaction, a size it may not read); resumed from the checkpoint at
	// the stalled backoff's base: the room comes back when a person acts,
	// and a look costs a page's list and one reading.
	nextSpace
)

// spaceReasons are the Stalled reasons of etcd's room (package quota).
var spaceReasons = sets.New(migrationv1alpha1.EtcdAlarmReason, migrationv1alpha1.EtcdQuotaReason, migrationv1alpha1.EtcdNotCompactingReason, migrationv1alpha1.EtcdSpaceUnknownReason)

// verdict is what the end of a run means: the outcome (with the event that
// announces it, if any), what comes next, and what status keeps of it.
type verdict struct {
	outcome
	next next
	// result labels restow_passes_total: succeeded, stalled, transient, restarted.
	result string
	// checkpoint keeps the run's checkpoint in status for a resume.
	checkpoint bool
	// summary is status.lastPass, for a run that reached its end.
	summary *migrationv1alpha1.PassSummary
}

// judge decides what the end of a run means. now is the completion time.
func judge(target migrator.Target, state runState, now time.Time) verdict {
	version := target.TargetVersion()
	var stalledErr *migrator.StalledError
	switch err := state.err; {
	case errors.Is(err, context.Canceled):
		// Cancelled for a new spec: start over from where it got to.
		return verdict{outcome: reconciling(migrationv1alpha1.ProgressingReason, "Restarting the pass for the new spec"),
			next: nextRestart, result: "restarted", checkpoint: true}
	case errors.Is(err, storedversions.ErrCRDChanged):
		return verdict{outcome: reconciling(migrationv1alpha1.ProgressingReason, "The CRD changed during the pass; a new pass starts").
			withEvents(stepEvent{corev1.EventTypeNormal, migrationv1alpha1.ProgressingReason, "Migrate", fmt.Sprintf("CRD %s changed during the pass; starting a new pass", target.CRD.Name)}),
			next: nextRestart, result: "restarted"}
	case errors.As(err, &stalledErr):
		reason := stalledErr.Why()
		v := verdict{outcome: stalled(reason, stalledErr.Message).
			withEvents(stepEvent{corev1.EventTypeWarning, reason, "Migrate", stalledErr.Message}),
			next: nextStalled, result: "stalled"}
		if spaceReasons.Has(reason) {
			// The objects rewritten so far stay rewritten: the next run
			// resumes, as soon as etcd may have room.
			v.next, v.checkpoint = nextSpace, true
		}
		return v
	case err != nil:
		return verdict{outcome: reconciling(migrationv1alpha1.TransientErrorReason, "The pass paused after transient errors and resumes shortly: "+migrator.Message(err)),
			next: nextResume, result: "transient", checkpoint: true}
	}

	summary := statusSummary(target, state.result, now)
	if summary.Failed > 0 {
		msg := fmt.Sprintf("%d of %d objects could not be rewritten to %s; status.failedObjects names them. Nothing was pruned; the pass is retried with backoff", summary.Failed, summary.Listed, version)
		return verdict{outcome: stalled(migrationv1alpha1.ObjectsFailedReason, msg).
			withEvents(stepEvent{corev1.EventTypeWarning, migrationv1alpha1.ObjectsFailedReason, "Migrate", msg}),
			next: nextStalled, result: "stalled", summary: summary}
	}
	msg := readyMessage(target, state.result, summary.Listed)
	return verdict{outcome: ready(msg).
		withEvents(stepEvent{corev1.EventTypeNormal, migrationv1alpha1.SucceededReason, "Migrate",
			fmt.Sprintf("%s (%d re-encoded, %d already stored, %d changed by others meanwhile, %d rewritten again after the settle window)",
				msg, summary.Migrated, summary.AlreadyStored, summary.Skipped, summary.Rechecked)}),
		result: "succeeded", summary: summary}
}

// readyMessage is what a run that rewrote every object proves. Only a run
// that settled (the settle window passed and what others wrote within it
// was rewritten again) knows every object is stored at the target: a write
// that began on the old storage can land after a pass that did not.
func readyMessage(target migrator.Target, result migrator.Result, listed int64) string {
	version := target.TargetVersion()
	switch {
	case result.Settled:
		return fmt.Sprintf("All %d objects are stored at %s", listed, version)
	case target.Partial():
		return fmt.Sprintf("All %d objects in the namespace were rewritten to %s", listed, version)
	default:
		return fmt.Sprintf("All %d objects were rewritten to %s", listed, version)
	}
}

// runUnderWay says what a run that has not ended is doing.
func runUnderWay(target migrator.Target, p migrator.Progress, status *migrationv1alpha1.PassProgress, now time.Time) outcome {
	switch {
	case p.Retrying != "":
		return reconciling(migrationv1alpha1.TransientErrorReason, "Retrying after a transient error: "+p.Retrying)
	case p.WaitingForSpace != "":
		return reconciling(migrationv1alpha1.WaitingForEtcdSpaceReason, p.WaitingForSpace)
	case p.WaitingForSlot && target.CRD == nil:
		return reconciling(migrationv1alpha1.ProgressingReason, "Waiting for one of the passes that run at once (--max-concurrent-passes, and --max-concurrent-builtin-passes for built-in resources) to end")
	case p.WaitingForSlot:
		return reconciling(migrationv1alpha1.ProgressingReason, "Waiting for one of the passes that run at once (--max-concurrent-passes) to end")
	case p.Phase == migrator.PhaseRewriting && p.Done() == 0 && p.Switching != "":
		return reconciling(migrationv1alpha1.WaitingForStorageVersionReason, p.Switching)
	case p.Phase == migrator.PhaseRewriting && p.Done() == 0 && now.Before(p.SwitchedBy):
		return reconciling(migrationv1alpha1.WaitingForStorageVersionReason, migrator.LagMessage(target, p.SwitchedBy))
	case p.Phase == migrator.PhaseSettling:
		return reconciling(migrationv1alpha1.SettlingReason, fmt.Sprintf(
			"All %d objects were rewritten to %s; waiting until %s, the end of the settle window, for writes that began on the old storage, then re-checking what others wrote meanwhile before pruning or calling them stored",
			p.Listed, target.TargetVersion(), p.SettleUntil.UTC().Format(time.RFC3339)))
	case p.Phase == migrator.PhaseRechecking:
		return reconciling(migrationv1alpha1.SettlingReason, fmt.Sprintf("The settle window is over; rewriting again the objects others wrote within it (%d so far) before pruning or calling them stored", p.Rechecked))
	}
	return reconciling(migrationv1alpha1.ProgressingReason, progressMessage(target.TargetVersion(), status))
}

// settledUntold is the Settling event of a run that settled while no
// reconcile looked (the window passed during the pass, or between two
// looks under load), before its Succeeded: every run that settles says so,
// whether or not status ever showed it. None when a look said it, or
// status holds it (told by an earlier process of a resumed run).
func settledUntold(sm *migrationv1alpha1.StorageMigration, rn *run, state runState) []stepEvent {
	if !state.result.Settled || rn.settlingTold.Load() {
		return nil
	}
	if c := meta.FindStatusCondition(sm.Status.Conditions, migrationv1alpha1.ReadyCondition); c != nil && c.Reason == migrationv1alpha1.SettlingReason {
		return nil
	}
	return []stepEvent{{corev1.EventTypeNormal, migrationv1alpha1.SettlingReason, "Migrate", fmt.Sprintf(
		"All %d objects were rewritten to %s; the settle window ended at %s, and what others wrote within it (%d) was rewritten again",
		state.result.Listed, rn.target.TargetVersion(), state.progress.SettleUntil.UTC().Format(time.RFC3339), state.result.Rechecked)}}
}
