package migrator_test

import (
	"testing"
	"time"
)

// TestResolveCountsAPIServers: one API server (the package's control plane)
// waits only a moment before the first pass; told to assume several, the
// lag bound.
func TestResolveCountsAPIServers(t *testing.T) {
	fx := switched(t, "count.migrator.restow.dev", 1)
	m, _ := newMigrator(t)
	m.LagBound = time.Minute
	target := resolve(t, m, fx)
	if target.APIServers != 1 || target.LagWait > time.Second {
		t.Errorf("one API server: counted %d, waits %s; want 1 and at most a second", target.APIServers, target.LagWait)
	}
	m.AssumeSeveral = true
	target = resolve(t, m, fx)
	if target.APIServers != 0 || target.LagWait != time.Minute || target.APIServerSignals == "" {
		t.Errorf("assuming several: counted %d, waits %s (%q); want none counted, the lag bound, and why", target.APIServers, target.LagWait, target.APIServerSignals)
	}
}
