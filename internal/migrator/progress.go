package migrator

import "time"

// What a migration reports: its result, and the progress its Observer sees
// after every page and on every change of what it waits for.

func (mg *migration) result() Result {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	return Result{Counts: mg.cp.Counts, Failures: mg.cp.Failures, StartTime: mg.cp.StartTime}
}

// report hands the observer the current progress.
func (mg *migration) report() {
	mg.observing.Lock()
	defer mg.observing.Unlock()
	mg.observe(mg.progress())
}

func (mg *migration) progress() Progress {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	p := Progress{Checkpoint: mg.cp, RemainingEstimate: mg.remaining, Retrying: mg.retryingMsg, SwitchedBy: mg.switchedBy, Switching: mg.switching, SettleUntil: mg.settleUntil, WaitingForSlot: mg.waitingForSlot}
	if mg.pace != nil {
		p.Concurrency = mg.pace.Limit()
	}
	p.Failures = append([]Failure(nil), mg.cp.Failures...)
	return p
}

// switchTimes are when every API server stores at the target version, and
// when the settle window ends: set as the migration begins, and again when
// it knows every server switched (switch.go).
type switchTimes struct{ by, settleUntil time.Time }

func (mg *migration) switchTimes() switchTimes {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	return switchTimes{by: mg.switchedBy, settleUntil: mg.settleUntil}
}

// setWaitingForSlot says whether the pass waits for one of the passes
// that run at once to end (Migrator.MaxPasses).
func (mg *migration) setWaitingForSlot(waiting bool) {
	setReported(mg, &mg.waitingForSlot, waiting)
}

func (mg *migration) setRetrying(msg string) {
	setReported(mg, &mg.retryingMsg, msg)
}

// setReported sets a field of mg's progress under its lock, and reports the
// progress when the value changed.
func setReported[T comparable](mg *migration, field *T, value T) {
	mg.mu.Lock()
	changed := *field != value
	*field = value
	mg.mu.Unlock()
	if changed {
		mg.report()
	}
}
