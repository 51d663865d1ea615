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
	p := Progress{Checkpoint: mg.cp, RemainingEstimate: mg.remaining, Retrying: mg.retryingMsg, SwitchedBy: mg.switchedBy, Switching: mg.switching, SettleUntil: mg.settleUntil, WaitingForSlot: mg.waitingForSlot, WaitingForSpace: mg.waitingForSpace}
	if mg.pace != nil {
		p.Concurrency = mg.pace.Limit()
	}
	p.Failures = append([]Failure(nil), mg.cp.Failures...)
	return p
}

// setWaitingForSlot says whether the pass waits for one of the passes
// that run at once to end (Migrator.MaxPasses).
func (mg *migration) setWaitingForSlot(waiting bool) {
	setReported(mg, &mg.waitingForSlot, waiting)
}

// setWaitingForSpace says what the pass waits for before it writes more
// (space.go), or "".
func (mg *migration) setWaitingForSpace(msg string) {
	setReported(mg, &mg.waitingForSpace, msg)
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

// applySwitch reports what one read of every API server decided
// (switch.go): the wait is over, it stalls, or it goes on and says why.
func (mg *migration) applySwitch(d switchDecision) (bool, error) {
	switch {
	case d.err != nil:
		return false, d.err
	case d.done:
		mg.setSwitchedBy(d.by, d.all)
		return true, nil
	}
	mg.setSwitching(d.msg)
	return false, nil
}

// setSwitchedBy records when every API server stores at the target, and
// whether each showed it, and counts the settle window from then.
func (mg *migration) setSwitchedBy(by time.Time, allSwitched bool) {
	mg.mu.Lock()
	mg.switchedBy = by
	mg.cp.LagWait = max(by.Sub(mg.cp.StartTime), 0)
	mg.cp.AllSwitched = allSwitched
	// Only a first pass that did nothing reads the servers, and its
	// checkpoint starts then (newMigration): by comes after it, and the
	// window counts from the last server's switch.
	mg.settleUntil = by.Add(mg.opts.SettleWindow)
	mg.switching = ""
	mg.mu.Unlock()
	mg.report()
}

func (mg *migration) setSwitching(msg string) {
	setReported(mg, &mg.switching, msg)
}
