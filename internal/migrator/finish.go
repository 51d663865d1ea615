package migrator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

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

// Migrate runs a whole migration of target: the first pass over every
// object, then, for a CRD whose status.storedVersions lists other versions,
// the settle window, the re-check and the prune (with opts.Prune). It
// returns the result when it reached its end, with failures if objects
// could not be rewritten (nothing is pruned then); a *TransientError or
// *StalledError when it stopped, with the last Progress to resume from; and
// an error wrapping storedversions.ErrCRDChanged when the CRD changed
// meanwhile, so a new migration must start.
func (m *Migrator) Migrate(ctx context.Context, target Target, opts Options, observe Observer) (Result, error) {
	// A migration covers every object: only Rewrite starts after a token.
	opts.Continue = ""
	mg := newMigration(m, target, opts, observe)
	if err := mg.checkViaStatus(); err != nil {
		return mg.result(), err
	}
	ctx, cancel := context.WithCancel(ctx)
	var window sync.WaitGroup
	defer window.Wait()
	defer cancel()
	if target.CRD != nil {
		window.Go(func() { mg.closeWindowAt(ctx) })
	}
	// Only a migration that may prune re-checks, and needs the record.
	mg.recordWrites = target.CRD != nil && opts.Prune && !target.Partial()
	if mg.progress().Phase == PhaseRewriting {
		// No answer counts before every API server has switched (lag.go);
		// the report shows until when.
		mg.report()
		if err := sleepUntil(ctx, later(mg.switchedBy, mg.cp.StartTime.Add(informerLag))); err != nil {
			return mg.result(), err
		}
		if err := mg.pass(ctx, false); err != nil {
			return mg.result(), err
		}
		if mg.result().Failed > 0 || target.CRD == nil {
			return mg.result(), nil
		}
		// The first pass is over: a checkpoint taken from now on resumes
		// here, also when reading the CRD below fails.
		mg.setPhase(PhaseSettling)
	}
	if target.CRD == nil {
		return mg.result(), nil
	}
	crd, err := mg.liveCRD(ctx)
	if err != nil || !opts.Prune || target.Partial() || slices.Equal(crd.Status.StoredVersions, []string{target.CRD.StorageVersion}) {
		// Nothing to prune: with pruning off restow does not touch
		// storedVersions, a pass over one namespace proves nothing about
		// the others, and [target] holds no other version.
		return mg.result(), err
	}
	if err := mg.settle(ctx); err != nil {
		return mg.result(), err
	}
	mg.startRecheck()
	if err := mg.pass(ctx, true); err != nil {
		return mg.result(), err
	}
	result := mg.result()
	if result.Failed > 0 {
		return result, nil
	}
	result.Pruned, err = storedversions.Prune(ctx, m.Client, m.Reader, storedversions.Expected{
		Name: target.CRD.Name, UID: target.CRD.UID, StorageVersion: target.CRD.StorageVersion, Generation: target.CRD.Generation,
	})
	return result, err
}

// startRecheck enters the re-check. It starts from the first page, also when
// resumed: the counts and failures of an interrupted re-check (the first pass
// had none, or nothing would be re-checked) are dropped, not added twice.
func (mg *migration) startRecheck() {
	mg.mu.Lock()
	mg.cp.Rechecked, mg.cp.Failed, mg.cp.Failures = 0, 0, nil
	mg.mu.Unlock()
	mg.setPhase(PhaseRechecking)
}

// liveCRD reads the CRD live at the end of the first pass. A CRD deleted
// meanwhile took its objects with it: that is no success. A CRD that
// changed (another storage version, spec or identity) needs a new pass.
func (mg *migration) liveCRD(ctx context.Context) (*apiextensionsv1.CustomResourceDefinition, error) {
	want := mg.target.CRD
	crd := &apiextensionsv1.CustomResourceDefinition{}
	err := mg.m.Reader.Get(ctx, client.ObjectKey{Name: want.Name}, crd)
	switch {
	case apierrors.IsNotFound(err):
		return nil, &StalledError{Message: fmt.Sprintf("CRD %s was deleted during the pass, with its objects; nothing is left to migrate", want.Name)}
	case err != nil:
		return nil, &TransientError{Err: fmt.Errorf("reading CRD %s after the pass: %w", want.Name, err)}
	case !crd.DeletionTimestamp.IsZero():
		return nil, &StalledError{Message: fmt.Sprintf("CRD %s is being deleted, with its objects; nothing is left to migrate", want.Name)}
	case crd.UID != want.UID || crd.Generation != want.Generation || storedversions.StorageVersion(crd) != want.StorageVersion:
		return nil, fmt.Errorf("CRD %s: %w", want.Name, storedversions.ErrCRDChanged)
	}
	return crd, nil
}

func (mg *migration) setPhase(phase Phase) {
	mg.mu.Lock()
	mg.cp.Phase = phase
	mg.mu.Unlock()
	mg.report()
}

// settle waits until the settle window is over and notes its end.
func (mg *migration) settle(ctx context.Context) error {
	if err := sleepUntil(ctx, mg.settleUntil); err != nil {
		return err
	}
	return mg.closeWindow(ctx)
}

// closeWindowAt notes the end of the settle window as soon as it is over,
// while the first pass may still run: from then on the pass's own writes
// need no record, so that record stays bounded by the window, not by the
// size of the resource.
func (mg *migration) closeWindowAt(ctx context.Context) {
	if sleepUntil(ctx, mg.settleUntil) != nil {
		return
	}
	// Until it is read, the record of the pass's own writes grows: try
	// again until it is (settle reads it too, and stops on failure).
	_ = wait.PollUntilContextCancel(ctx, closeWindowRetry, true, func(ctx context.Context) (bool, error) {
		// One list each time, not retried: a pass that retries shows it.
		list, _, err := mg.listPage(ctx, "", 1, false)
		if err == nil {
			mg.noteWindowEnd(list.ResourceVersion)
		}
		return err == nil, nil
	})
}

// closeWindowRetry spaces the attempts at reading the end of the settle
// window while the first pass runs.
const closeWindowRetry = 5 * time.Second

// maxProven bounds the record of the pass's own writes within the settle
// window: past it, objects are re-checked rather than recorded, so memory
// stays bounded whatever the window's length and the pass's pace.
const maxProven = 1 << 17

// closeWindow reads the resourceVersion of now, after the settle window:
// every write that began on the old storage has committed at or below it.
func (mg *migration) closeWindow(ctx context.Context) error {
	mg.mu.Lock()
	known := mg.cp.WindowEnd != ""
	mg.mu.Unlock()
	if known {
		return nil
	}
	var list *metav1.PartialObjectMetadataList
	err := mg.retryTransient(ctx, func() error {
		var err error
		list, _, err = mg.listPage(ctx, "", 1, false)
		return err
	})
	if err != nil {
		return mg.passError("reading the resourceVersion at the end of the settle window of", err)
	}
	mg.noteWindowEnd(list.ResourceVersion)
	return nil
}

// noteWindowEnd keeps the first resourceVersion read after the settle window.
func (mg *migration) noteWindowEnd(resourceVersion string) {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	if mg.cp.WindowEnd == "" {
		mg.cp.WindowEnd = resourceVersion
	}
}

// noteListSnapshot keeps the resourceVersion of the first pass's list.
func (mg *migration) noteListSnapshot(resourceVersion string) {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	if mg.cp.ListResourceVersion == "" {
		mg.cp.ListResourceVersion = resourceVersion
	}
}

// noteOwnWrite records the resourceVersion a rewrite answered with: at that
// version the object is stored at the target. Only versions after the list
// snapshot and at or before the end of the settle window are of use, so the
// record stops growing once the window has ended; a rewrite whose answer
// comes just after windowEnd was read is still recorded if it committed
// before.
func (mg *migration) noteOwnWrite(resourceVersion string) {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	if !mg.recordWrites || mg.cp.ListResourceVersion == "" {
		return
	}
	if after, err := resourceversion.CompareResourceVersion(resourceVersion, mg.cp.ListResourceVersion); err != nil || after <= 0 {
		return
	}
	if mg.cp.WindowEnd != "" {
		if after, err := resourceversion.CompareResourceVersion(resourceVersion, mg.cp.WindowEnd); err != nil || after > 0 {
			return
		}
	}
	if len(mg.proven) < maxProven {
		mg.proven[resourceVersion] = struct{}{}
	}
}

// mustRecheck reports whether an object listed after the settle window
// with resourceVersion may still be stored at the old version. Anything it
// cannot compare is re-checked.
func (mg *migration) mustRecheck(resourceVersion string) bool {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	if mg.cp.WindowEnd == "" || mg.cp.ListResourceVersion == "" {
		return true
	}
	sinceList, err1 := resourceversion.CompareResourceVersion(resourceVersion, mg.cp.ListResourceVersion)
	sinceWindow, err2 := resourceversion.CompareResourceVersion(resourceVersion, mg.cp.WindowEnd)
	switch {
	case errors.Join(err1, err2) != nil:
		return true
	case sinceList <= 0, sinceWindow > 0:
		return false
	}
	_, proven := mg.proven[resourceVersion]
	return !proven
}
