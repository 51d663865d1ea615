package migrator

import (
	"context"
	"fmt"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/restow/restow/internal/migrator/pace"
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

// liveCRD reads the CRD live at the end of the first pass. A CRD deleted
// meanwhile took its objects with it: that is no success. A CRD that
// changed its identity or storage version, or whose history since the
// migration began restow cannot show (history.go), needs a new migration.
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
	case !mg.history.kept(ctx, crd):
		return nil, mg.history.refused(crd)
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
	if err := pace.SleepUntil(ctx, mg.switchTimes().settleUntil); err != nil {
		return err
	}
	return mg.closeWindow(ctx)
}

// closeWindowAt notes the end of the settle window as soon as it is over,
// while the first pass may still run: from then on the pass's own writes
// need no record, so that record stays bounded by the window, not by the
// size of the resource.
func (mg *migration) closeWindowAt(ctx context.Context) {
	if pace.SleepUntil(ctx, mg.switchTimes().settleUntil) != nil {
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
