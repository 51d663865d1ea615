package testenv

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/controlplane"
)

// ProgressCheck looks once at what a test waits for; see
// controlplane.ProgressCheck.
type ProgressCheck = controlplane.ProgressCheck

// WaitProgress waits until check reports done, with a deadline that follows
// the work rather than the clock: the test fails, saying what it saw last,
// once what check reports as work has not changed for stall (nothing is
// happening: it is going to fail, so it says so early), or when an error
// comes back. A wait that keeps making progress goes on for as long as the
// machine needs, up to waitCeiling and never past the test binary's
// -timeout, so a failure is reported rather than a panic. Changes of work
// are logged, a few seconds apart, so a failed test shows what it saw on the
// way.
func WaitProgress(tb testing.TB, what string, stall time.Duration, check ProgressCheck) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), waitBound(tb))
	defer cancel()
	var logged time.Time
	err := controlplane.WaitProgress(ctx, 50*time.Millisecond, stall, check, func(work string) {
		if time.Since(logged) >= 5*time.Second {
			logged = time.Now()
			tb.Logf("waiting for %s: %s", what, work)
		}
	})
	if err != nil {
		tb.Fatalf("waiting for %s: %v", what, err)
	}
}

// waitCeiling bounds one wait however long it keeps making progress.
const waitCeiling = 15 * time.Minute

// waitBound is waitCeiling, or less so as to end a minute before the test
// binary's -timeout would.
func waitBound(tb testing.TB) time.Duration {
	bound := waitCeiling
	if d, ok := tb.(interface{ Deadline() (time.Time, bool) }); ok {
		if deadline, set := d.Deadline(); set {
			bound = min(bound, time.Until(deadline)-time.Minute)
		}
	}
	return max(bound, time.Second)
}

// WaitForMigration polls the StorageMigration name until it exists and done
// says so, and returns it. Its progress is what its status shows of the
// work: the current pass's counts, phase and continue token, the last pass,
// the conditions' reasons and which objects failed; also, if given, what
// more says (a conversion webhook's count of conversions, say, which moves
// while a pass isolates an object that cannot be converted). It fails once
// none of that has changed for stall.
func (e *Env) WaitForMigration(tb testing.TB, name string, stall time.Duration, what string, done func(*migrationv1alpha1.StorageMigration) bool, more ...func() string) *migrationv1alpha1.StorageMigration {
	tb.Helper()
	sm := &migrationv1alpha1.StorageMigration{}
	ready := ""
	WaitProgress(tb, fmt.Sprintf("StorageMigration %s to be %s", name, what), stall, func(ctx context.Context) (bool, string, error) {
		if err := e.Client.Get(ctx, client.ObjectKey{Name: name}, sm); err != nil {
			// It may not exist yet: the automatic trigger creates it.
			return false, "not found", client.IgnoreNotFound(err)
		}
		// Log the status a user sees at each change of its Ready condition
		// (docs/troubleshooting.md quotes these lines).
		if c := meta.FindStatusCondition(sm.Status.Conditions, migrationv1alpha1.ReadyCondition); c != nil {
			if now := fmt.Sprintf("Ready=%s %s: %s", c.Status, c.Reason, c.Message); now != ready {
				ready = now
				tb.Logf("StorageMigration %s: %s", name, now)
			}
		}
		work := MigrationWork(sm)
		for _, m := range more {
			work += "; " + m()
		}
		return done(sm), work, nil
	})
	return sm
}

// MigrationWork describes how far a StorageMigration's work has got, from its
// status: any change is progress. Condition messages are left out (a
// transient error's message may change on every retry while nothing moves).
func MigrationWork(sm *migrationv1alpha1.StorageMigration) string {
	var b strings.Builder
	st := sm.Status
	fmt.Fprintf(&b, "generation %d observed %d", sm.Generation, st.ObservedGeneration)
	for _, c := range st.Conditions {
		fmt.Fprintf(&b, ", %s=%s/%s", c.Type, c.Status, c.Reason)
	}
	if p := st.Progress; p != nil {
		fmt.Fprintf(&b, "; pass from %s: %s %+v, continue %q", p.StartTime.Format(time.RFC3339), p.Phase, p.ObjectCounts, p.ContinueToken)
	}
	if p := st.LastPass; p != nil {
		fmt.Fprintf(&b, "; last pass to %s ended %s: %+v", p.TargetVersion, p.CompletionTime.Format(time.RFC3339), p.ObjectCounts)
	}
	for _, f := range st.FailedObjects {
		fmt.Fprintf(&b, "; failed %s/%s", f.Namespace, f.Name)
	}
	return b.String()
}

// ReadyAt is true once the StorageMigration's last pass brought every
// object to version (for WaitForMigration).
func ReadyAt(version string) func(*migrationv1alpha1.StorageMigration) bool {
	return func(sm *migrationv1alpha1.StorageMigration) bool { return sm.ReadyAt(version) }
}

// HasCondition is true while the StorageMigration has condition t True with
// reason (for WaitForMigration).
func HasCondition(t, reason string) func(*migrationv1alpha1.StorageMigration) bool {
	return func(sm *migrationv1alpha1.StorageMigration) bool {
		c := meta.FindStatusCondition(sm.Status.Conditions, t)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == reason
	}
}

// WaitForSignals waits until the control plane shows leases identity Leases
// of API servers and addresses addresses in default/kubernetes's
// EndpointSlices, failing once neither has moved for a minute.
func (e *Env) WaitForSignals(tb testing.TB, leases, addresses int) {
	tb.Helper()
	WaitProgress(tb, fmt.Sprintf("%d API servers' identity Leases and %d addresses", leases, addresses), time.Minute, func(ctx context.Context) (bool, string, error) {
		hostnames, listed, err := e.APIServerSignals(ctx)
		return len(hostnames) == leases && len(listed) == addresses, fmt.Sprintf("identity Leases of %v, addresses %v", hostnames, listed), err
	})
}
