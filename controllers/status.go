package controllers

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
)

// condition is which of the kstatus conditions Ready, Reconciling and
// Stalled is True after a reconcile (conditionsFor writes all three).
type condition int

const (
	// conditionReady: every object is at the target version (and pruned).
	conditionReady condition = iota
	// conditionReconciling: a run is under way, or the migration waits for
	// the API server.
	conditionReconciling
	// conditionStalled: the migration needs a user's action.
	conditionStalled
)

// outcome is what a reconcile of a StorageMigration concluded: the
// condition that holds, with the reason and message the conditions carry,
// and what else the reconcile writes for it. The steps that decide
// (startIfNeeded, startRun, the run's end through judge and ended) only
// fill it in; record (record.go) is its one writer, of status, events and
// metrics alike. The StorageVersionMigration reconciler reads the condition,
// reason and message of runUnderWay's and judge's outcomes, and writes the
// standard status itself.
type outcome struct {
	condition condition
	reason    string
	message   string
	// announced says the step that decided this outcome has an event of its
	// own (in events, or one it recorded for an earlier reconcile of the
	// same cause): no event for the transition of Ready's reason.
	announced bool

	// status holds the fields of status, besides the conditions and
	// progressSummary, that the reconcile sets.
	status statusFields
	// events are the step's own events, recorded in this order.
	events []stepEvent
	// ended, when set, is the end of a run, for the metrics.
	ended *runEnd
	// settles, when set, is the ended run whose end this outcome records:
	// the run is forgotten only once status holds its end, so a status the
	// API server refuses is written again from the same end, never from a
	// new run.
	settles *run
}

// withEvents marks o as announced by the step that decided it, with the
// events that step records (none, when it said so before).
func (o outcome) withEvents(events ...stepEvent) outcome {
	o.announced = true
	o.events = slices.Concat(o.events, events)
	return o
}

func ready(message string) outcome {
	return outcome{condition: conditionReady, reason: migrationv1alpha1.SucceededReason, message: message}
}

func reconciling(reason, message string) outcome {
	return outcome{condition: conditionReconciling, reason: reason, message: message}
}

func stalled(reason, message string) outcome {
	return outcome{condition: conditionStalled, reason: reason, message: message}
}

// conditionsFor computes Ready, Reconciling and Stalled for an outcome, with
// kstatus semantics: Reconciling and Stalled are True only while they hold,
// and Ready is True only when nothing is left to do.
func conditionsFor(o outcome, generation int64) []metav1.Condition {
	cond := func(t string, s bool, reason, message string) metav1.Condition {
		status := metav1.ConditionFalse
		if s {
			status = metav1.ConditionTrue
		}
		return metav1.Condition{Type: t, Status: status, Reason: reason, Message: message, ObservedGeneration: generation}
	}
	switch o.condition {
	case conditionReady:
		return []metav1.Condition{
			cond(migrationv1alpha1.ReadyCondition, true, o.reason, o.message),
			cond(migrationv1alpha1.ReconcilingCondition, false, o.reason, ""),
			cond(migrationv1alpha1.StalledCondition, false, o.reason, ""),
		}
	case conditionReconciling:
		return []metav1.Condition{
			cond(migrationv1alpha1.ReadyCondition, false, o.reason, o.message),
			cond(migrationv1alpha1.ReconcilingCondition, true, o.reason, o.message),
			cond(migrationv1alpha1.StalledCondition, false, o.reason, ""),
		}
	default:
		return []metav1.Condition{
			cond(migrationv1alpha1.ReadyCondition, false, o.reason, o.message),
			cond(migrationv1alpha1.ReconcilingCondition, false, o.reason, ""),
			cond(migrationv1alpha1.StalledCondition, true, o.reason, o.message),
		}
	}
}

// setConditions writes the conditions of an outcome into status. A condition
// whose status does not change keeps its lastTransitionTime.
func setConditions(status *migrationv1alpha1.StorageMigrationStatus, o outcome, generation int64) {
	for _, c := range conditionsFor(o, generation) {
		meta.SetStatusCondition(&status.Conditions, c)
	}
}

// progressMessage says how far a run has come, for the Reconciling condition.
func progressMessage(target string, p *migrationv1alpha1.PassProgress) string {
	done := p.Done()
	if p.RemainingEstimate != nil {
		return fmt.Sprintf("Rewriting objects to %s: %d done, about %d more to list", target, done, *p.RemainingEstimate)
	}
	return fmt.Sprintf("Rewriting objects to %s: %d done", target, done)
}

// progressSummary is status.progressSummary: objects done of objects to
// visit, for the run under way or else the last one.
func progressSummary(status *migrationv1alpha1.StorageMigrationStatus) string {
	switch p := status.Progress; {
	case p != nil && p.RemainingEstimate != nil:
		return fmt.Sprintf("%d/~%d", p.Done(), p.Listed+*p.RemainingEstimate)
	case p != nil && p.Phase == migrationv1alpha1.PassRewriting && p.Listed == 0 && p.ContinueToken == "":
		// Nothing listed yet.
		return "0/?"
	case p != nil && p.ContinueToken != "":
		return fmt.Sprintf("%d/%d+", p.Done(), p.Listed)
	case p != nil:
		return fmt.Sprintf("%d/%d", p.Done(), p.Listed)
	case status.LastPass != nil:
		return fmt.Sprintf("%d/%d", status.LastPass.Done(), status.LastPass.Listed)
	}
	return ""
}
