package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
)

// followInterval is how often Follow reads the StorageMigration. Its status
// changes every few seconds (the operator's --status-interval).
const followInterval = 500 * time.Millisecond

// Outcome is how a followed StorageMigration ended.
type Outcome int

const (
	// Waiting means it is not over yet.
	Waiting Outcome = iota
	// Succeeded means it is Ready for what was asked.
	Succeeded
	// Stalled means it needs a person.
	Stalled
)

// Until decides from a StorageMigration whether following it is over.
type Until func(*migrationv1alpha1.StorageMigration) Outcome

// Answered is over once the StorageMigration has handled the re-run request
// token (a pass started for it, or it stalled) and then became Ready or
// Stalled for its current spec.
func Answered(token string) Until {
	return func(sm *migrationv1alpha1.StorageMigration) Outcome {
		if sm.Status.LastHandledReRunToken != token {
			return Waiting
		}
		return settled(sm)
	}
}

// ReadyAt is over once the last pass brought every object to version, or the
// StorageMigration stalled.
func ReadyAt(version string) Until {
	return func(sm *migrationv1alpha1.StorageMigration) Outcome {
		out := settled(sm)
		if out == Succeeded && !sm.ReadyAt(version) {
			return Waiting
		}
		return out
	}
}

func settled(sm *migrationv1alpha1.StorageMigration) Outcome {
	switch state, _, _ := migrationState(sm); {
	case state == stateStalled:
		return Stalled
	case state == stateReady && sm.Status.Progress == nil:
		return Succeeded
	}
	return Waiting
}

// Follow reads the StorageMigration name until until says it is over, showing
// its progress on out, and returns it. total estimates the objects of the
// pass (-1 if not known) until the StorageMigration reports its own estimate.
// A StorageMigration that does not exist yet is waited for.
func Follow(ctx context.Context, c client.Reader, name string, total int64, until Until, out io.Writer) (*migrationv1alpha1.StorageMigration, Outcome, error) {
	sm := &migrationv1alpha1.StorageMigration{}
	var bar *progress
	var outcome Outcome
	settling := false
	err := wait.PollUntilContextCancel(ctx, followInterval, true, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKey{Name: name}, sm); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		if outcome = until(sm); outcome != Waiting {
			return true, nil
		}
		p := sm.Status.Progress
		if p == nil {
			return false, nil
		}
		if bar == nil {
			bar = newProgress(out, "Rewriting "+resourceOf(sm)+" to "+sm.Status.TargetVersion, total)
		}
		if p.Phase == migrationv1alpha1.PassSettling && p.SettleUntil != nil && !settling {
			settling = true
			bar.set(processed(p.ObjectCounts), p.Listed)
			bar.finish()
			fmt.Fprintf(out, "Settling: every object was rewritten; waiting until %s for writes that began on the old storage, then re-checking what others wrote meanwhile.\n", p.SettleUntil.Local().Format(time.TimeOnly))
		}
		if settling {
			return false, nil
		}
		estimate := int64(-1)
		if p.RemainingEstimate != nil {
			estimate = p.Listed + *p.RemainingEstimate
		}
		bar.set(processed(p.ObjectCounts), estimate)
		return false, nil
	})
	if outcome == Succeeded && sm.Status.LastPass != nil && !settling {
		if bar == nil {
			// The pass ended between two reads.
			bar = newProgress(out, "Rewriting "+resourceOf(sm)+" to "+sm.Status.LastPass.TargetVersion, total)
		}
		bar.set(processed(sm.Status.LastPass.ObjectCounts), sm.Status.LastPass.Listed)
		bar.finish()
	}
	return sm, outcome, err
}
