package controllers

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
)

// phase is where a StorageMigration stands after a reconcile.
type phase int

const (
	// phaseReady: every object is at the target version (and pruned).
	phaseReady phase = iota
	// phaseReconciling: a pass is running or waiting for the API server.
	phaseReconciling
	// phaseStalled: the migration needs a user's action.
	phaseStalled
)

// outcome is what a reconcile concluded, with the reason and message the
// conditions carry.
type outcome struct {
	phase   phase
	reason  string
	message string
	// announced says an event was recorded for this outcome already.
	announced bool
}

// withEvent marks o as recorded by an event of its own.
func (o outcome) withEvent() outcome {
	o.announced = true
	return o
}

func ready(message string) outcome {
	return outcome{phase: phaseReady, reason: migrationv1alpha1.SucceededReason, message: message}
}

func reconciling(reason, message string) outcome {
	return outcome{phase: phaseReconciling, reason: reason, message: message}
}

func stalled(reason, message string) outcome {
	return outcome{phase: phaseStalled, reason: reason, message: message}
}

// conditionsFor computes Ready, Reconciling and Stalled for an outcome, with
// kstatus semantics: Reconciling and Stalled are True only while they hold,
// and Ready is True only when nothing is left to do.
func conditionsFor(o outcome, generation int64) []metav1.Condition {
	condition := func(t string, s bool, reason, message string) metav1.Condition {
		status := metav1.ConditionFalse
		if s {
			status = metav1.ConditionTrue
		}
		return metav1.Condition{Type: t, Status: status, Reason: reason, Message: message, ObservedGeneration: generation}
	}
	switch o.phase {
	case phaseReady:
		return []metav1.Condition{
			condition(migrationv1alpha1.ReadyCondition, true, o.reason, o.message),
			condition(migrationv1alpha1.ReconcilingCondition, false, o.reason, ""),
			condition(migrationv1alpha1.StalledCondition, false, o.reason, ""),
		}
	case phaseReconciling:
		return []metav1.Condition{
			condition(migrationv1alpha1.ReadyCondition, false, o.reason, o.message),
			condition(migrationv1alpha1.ReconcilingCondition, true, o.reason, o.message),
			condition(migrationv1alpha1.StalledCondition, false, o.reason, ""),
		}
	default:
		return []metav1.Condition{
			condition(migrationv1alpha1.ReadyCondition, false, o.reason, o.message),
			condition(migrationv1alpha1.ReconcilingCondition, false, o.reason, ""),
			condition(migrationv1alpha1.StalledCondition, true, o.reason, o.message),
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

// progressMessage says how far a pass has come, for the Reconciling condition.
func progressMessage(target string, p *migrationv1alpha1.PassProgress) string {
	done := p.Done()
	if p.RemainingEstimate != nil {
		return fmt.Sprintf("Rewriting objects to %s: %d done, about %d more to list", target, done, *p.RemainingEstimate)
	}
	return fmt.Sprintf("Rewriting objects to %s: %d done", target, done)
}

// progressSummary is status.progressSummary: objects done of objects to
// visit, for the pass under way or else the last pass.
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
