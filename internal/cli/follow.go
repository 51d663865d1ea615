package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
)

// Ending is how a followed StorageMigration ended (read from its conditions,
// as kstatus does), or Waiting while it has not.
type Ending int

const (
	// Waiting means it is not over yet.
	Waiting Ending = iota
	// Succeeded means it is Ready for what was asked.
	Succeeded
	// Stalled means it needs a person.
	Stalled
)

// Until decides from a StorageMigration whether following it is over.
type Until func(*migrationv1alpha1.StorageMigration) Ending

// Answered is over once the StorageMigration has handled the re-run request
// token (a pass started for it, or it stalled) and then became Ready or
// Stalled for its current spec.
func Answered(token string) Until {
	return func(sm *migrationv1alpha1.StorageMigration) Ending {
		if sm.Status.LastHandledReRunToken != token {
			return Waiting
		}
		return settled(sm)
	}
}

// ReadyAt is over once the last pass brought every object to version, or the
// StorageMigration stalled.
func ReadyAt(version string) Until {
	return func(sm *migrationv1alpha1.StorageMigration) Ending {
		out := settled(sm)
		if out == Succeeded && !sm.ReadyAt(version) {
			return Waiting
		}
		return out
	}
}

// settled reads kstatus's verdict: Current with no pass under way is done,
// Failed (Stalled) needs a person.
func settled(sm *migrationv1alpha1.StorageMigration) Ending {
	switch state, _, _ := stateOf(sm); {
	case state == stateFailed:
		return Stalled
	case state == stateCurrent && sm.Status.Progress == nil:
		return Succeeded
	}
	return Waiting
}

// migrationWatch lists and watches the StorageMigration name, or all of
// them when name is "".
func migrationWatch(c client.WithWatch, name string) *cache.ListWatch {
	narrow := func(opts metav1.ListOptions) *client.ListOptions {
		if name != "" {
			opts.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		}
		return &client.ListOptions{Raw: &opts}
	}
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			list := &migrationv1alpha1.StorageMigrationList{}
			err := c.List(ctx, list, narrow(opts))
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return c.Watch(ctx, &migrationv1alpha1.StorageMigrationList{}, narrow(opts))
		},
	}
}

// errDeleted ends following a StorageMigration that was deleted.
var errDeleted = errors.New("it was deleted")

// watchMigration hands each state of the StorageMigration name (all of them
// when name is "") to fn, from a watch, until fn says it is done or ctx
// ends. A StorageMigration that does not exist yet is waited for. It
// returns ctx's error when ctx ended first.
func watchMigration(ctx context.Context, c client.WithWatch, name string, fn func(watch.EventType, *migrationv1alpha1.StorageMigration) (bool, error)) error {
	lw := migrationWatch(c, name)
	// The informer retries a failing list forever: list once first, so a
	// missing API or a refusal (RBAC) ends the command with its error.
	if _, err := lw.ListWithContext(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		if meta.IsNoMatchError(err) {
			return errNotInstalled
		}
		return err
	}
	_, err := watchtools.UntilWithSync(ctx, lw, &migrationv1alpha1.StorageMigration{}, nil, func(ev watch.Event) (bool, error) {
		sm, ok := ev.Object.(*migrationv1alpha1.StorageMigration)
		if !ok {
			return false, fmt.Errorf("watching StorageMigrations: unexpected %T", ev.Object)
		}
		return fn(ev.Type, sm)
	})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// Follow watches the StorageMigration name until until says it is over,
// showing its progress on out, and returns it. total estimates the objects
// of the pass (-1 if not known) until the StorageMigration reports its own
// estimate. A StorageMigration that does not exist yet is waited for.
func Follow(ctx context.Context, c client.WithWatch, name string, total int64, until Until, out io.Writer) (*migrationv1alpha1.StorageMigration, Ending, error) {
	sm := &migrationv1alpha1.StorageMigration{}
	var bar *progress
	var ending Ending
	settling := false
	err := watchMigration(ctx, c, name, func(ev watch.EventType, latest *migrationv1alpha1.StorageMigration) (bool, error) {
		if ev == watch.Deleted {
			return false, fmt.Errorf("StorageMigration %s: %w", name, errDeleted)
		}
		sm = latest
		if ending = until(sm); ending != Waiting {
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
			bar.set(p.Done(), p.Listed)
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
		bar.set(p.Done(), estimate)
		return false, nil
	})
	if ending == Succeeded && sm.Status.LastPass != nil && !settling {
		if bar == nil {
			// The pass ended between two updates.
			bar = newProgress(out, "Rewriting "+resourceOf(sm)+" to "+sm.Status.LastPass.TargetVersion, total)
		}
		bar.set(sm.Status.LastPass.Done(), sm.Status.LastPass.Listed)
		bar.finish()
	}
	return sm, ending, err
}
