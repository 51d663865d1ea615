package controlplane

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// ProgressCheck looks once at a state being waited for: done says it is
// reached, and work describes how far the work towards it has got (objects
// migrated, objects left to delete). Any change of work is progress.
type ProgressCheck func(ctx context.Context) (done bool, work string, err error)

// StalledError is what WaitProgress returns when the work stopped moving.
type StalledError struct {
	// For is how long work stayed the same.
	For time.Duration
	// Work is what the last look saw.
	Work string
}

func (e *StalledError) Error() string {
	return fmt.Sprintf("no progress for %s; last seen: %s", e.For.Round(time.Second), e.Work)
}

// WaitProgress polls check every interval until it reports done, an error,
// or no progress: a deadline that follows the work, not the clock. It gives
// up with a *StalledError once work has not changed for stall, so a busy
// machine that keeps working is waited for and a stuck one is told early;
// ctx bounds the whole wait. seen, if not nil, is called at each change of
// work (to log it).
func WaitProgress(ctx context.Context, interval, stall time.Duration, check ProgressCheck, seen func(work string)) error {
	last, since := "", time.Now()
	first := true
	err := wait.PollUntilContextCancel(ctx, interval, true, func(ctx context.Context) (bool, error) {
		done, work, err := check(ctx)
		if err != nil || done {
			return done, err
		}
		if first || work != last {
			first, last, since = false, work, time.Now()
			if seen != nil {
				seen(work)
			}
			return false, nil
		}
		if stuck := time.Since(since); stuck >= stall {
			return false, &StalledError{For: stuck, Work: work}
		}
		return false, nil
	})
	if err != nil && ctx.Err() != nil && last != "" {
		return fmt.Errorf("%w; last seen: %s", err, last)
	}
	return err
}
