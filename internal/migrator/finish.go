package migrator

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/restow/restow/internal/migrator/pace"
	"github.com/restow/restow/internal/storedversions"
)

// The finish of a migration: why a prune must wait, and what it re-checks.
//
// When a CRD's storage version changes, kube-apiserver serves requests that
// had already begun on the old storage until they end, and tears that
// storage down at the latest twice its request timeout later; in an HA
// control plane each API server switches when its own informer sees the
// CRD. Such a write (held by a slow admission webhook, or sent through a
// lagging API server) can commit at the old version after the pass rewrote
// the object, with no conflict for the pass. So the migration measures a
// settle window from the moment every API server had switched (StartTime,
// plus the lag bound with several: lag.go), and once the
// window is over it reads the resourceVersion of the moment (windowEnd) and
// lists every object again (windowEnd is saved in the checkpoint, so a
// resumed migration keeps it). resourceVersions of one resource are
// comparable (KEP-5504, apimachinery's resourceversion package): an object
//   - not written since the first pass's list snapshot was rewritten by the
//     pass itself without a write, which proves it was stored at the target;
//   - written after windowEnd was written on the new storage;
//   - last written by the pass itself (a resourceVersion its rewrite
//     answered with, kept until windowEnd is known) is at the target;
//   - written by anyone else in between may be at the old version: it is
//     rewritten again now, when no old storage is left.
//
// The re-check costs one list of metadata pages plus one patch per object
// others wrote within the window, and the memory of the pass's own writes
// within the window, not of every object.

// startRecheck enters the re-check. It starts from the first page, also when
// resumed: the counts and failures of an interrupted re-check (the first pass
// had none, or nothing would be re-checked) are dropped, not added twice.
func (mg *migration) startRecheck() {
	mg.mu.Lock()
	mg.cp.Rechecked, mg.cp.Failed, mg.cp.Failures = 0, 0, nil
	mg.mu.Unlock()
	mg.setPhase(PhaseRechecking)
}

func (mg *migration) setPhase(phase Phase) {
	mg.mu.Lock()
	mg.cp.Phase = phase
	mg.mu.Unlock()
	mg.report()
}

// settle waits until the settle window is over and reads the
// resourceVersion of then, unless the first pass already did
// (closeWindowAt): every write that began on the old storage has committed
// at or below it.
func (mg *migration) settle(ctx context.Context) error {
	end := mg.settleEnd()
	if err := pace.SleepUntil(ctx, end); err != nil {
		return err
	}
	mg.mu.Lock()
	known := mg.cp.WindowEnd != ""
	mg.mu.Unlock()
	if known {
		return nil
	}
	if err := mg.retryTransient(ctx, func() error { return mg.readWindowEnd(ctx) }); err != nil {
		return mg.passError("reading the resourceVersion at the end of the settle window of", err)
	}
	return nil
}

// readWindowEnd reads the resourceVersion of now with one list of one
// object, and keeps it as the end of the settle window unless one is kept.
func (mg *migration) readWindowEnd(ctx context.Context) error {
	list, _, err := mg.listPage(ctx, "", 1, false, true)
	if err != nil {
		return err
	}
	mg.noteWindowEnd(list.ResourceVersion)
	return nil
}

// closeWindowAt notes the end of the settle window as soon as it is over,
// while the first pass may still run: from then on the pass's own writes
// need no record, so that record stays bounded by the window, not by the
// size of the resource.
func (mg *migration) closeWindowAt(ctx context.Context) {
	end := mg.settleEnd()
	if pace.SleepUntil(ctx, end) != nil {
		return
	}
	// Until it is read, the record of the pass's own writes grows: try
	// again until it is (settle reads it too, and stops on failure).
	_ = wait.PollUntilContextCancel(ctx, closeWindowRetry, true, func(ctx context.Context) (bool, error) {
		// One list each time, not retried: a pass that retries shows it.
		return mg.readWindowEnd(ctx) == nil, nil
	})
}

// closeWindowRetry spaces the attempts at reading the end of the settle
// window while the first pass runs.
const closeWindowRetry = 5 * time.Second

// settleEnd is when the settle window ends: set as the migration begins,
// and again when it knows every API server switched (switch.go).
func (mg *migration) settleEnd() time.Time {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	return mg.settleUntil
}

// recheck runs the re-check once the settle window is over. When it
// rewrote every object the migration settled, and with opts.Prune the
// CRD's status.storedVersions loses what it proved, on a live read of a
// CRD whose history kept the storage version (storedversions.Prune).
func (mg *migration) recheck(ctx context.Context) (Result, error) {
	mg.startRecheck()
	if err := mg.pass(ctx, true); err != nil {
		return mg.result(), err
	}
	result := mg.result()
	if result.Failed > 0 {
		return result, nil
	}
	result.Settled = true
	if !mg.opts.Prune {
		return result, nil
	}
	crd := mg.target.CRD
	var err error
	result.Pruned, err = storedversions.Prune(ctx, mg.m.Client, mg.m.Reader, storedversions.Expected{
		Name: crd.Name, UID: crd.UID, StorageVersion: crd.StorageVersion, Generation: crd.Generation,
		Kept: mg.history.kept,
	})
	return result, err
}
