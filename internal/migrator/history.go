package migrator

import (
	"context"
	"fmt"
	"sync"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/restow/restow/internal/storedversions"
)

// The CRD's history during a migration: what proves that a CRD whose spec
// changed meanwhile still stores at the target.
//
// What a prune needs is that the CRD's storage version was the target in
// every state it had between the migration's start and the read the prune
// decides on: then every write since the start was encoded at the target,
// whatever else changed (a webhook's caBundle rewritten by an injector, a
// description, a GitOps tool re-applying the CRD). metadata.generation says
// more than that and less: it moves with any spec change, and a switch away
// and back moves it too. So the migration watches its CRD from the
// resourceVersion Resolve read it at:
//   - a state with another storage version or UID, or the CRD's deletion
//     (from its deletionTimestamp on),
//     ends the migration at once, when it is seen (ErrCRDChanged): objects
//     written in that state may be stored at another version, and a new
//     migration must cover them;
//   - a state with the same storage version changes nothing;
//   - the decisions after the pass (liveCRD, the prune) take a live read of
//     the CRD, and accept a generation other than the start's only when the
//     watch has delivered that very read's resourceVersion with nothing
//     between it and the start unseen.
//
// Where the watch cannot say (no Config to watch with, a watch refused or
// ended with an error, the history compacted away so the watch cannot
// resume), nothing is accepted beyond the old rule: the generation must not
// have changed. A watch that ends with a known change of generation ends
// the migration then and there, rather than after a pass whose prune the
// rule would refuse. One that cannot resume because its start was compacted
// (RetryWatcher retries that without a word) does not end: the checks wait
// historyCatchUp for it, and refuse.

const (
	// historyCatchUp bounds the wait for the watch to deliver the state a
	// live read just showed; after it, the generation rule decides.
	historyCatchUp = 10 * time.Second
	// historyPoll spaces the checks of that wait.
	historyPoll = 50 * time.Millisecond
)

// crdHistory is the CRD as the migration's watch saw it since its start.
type crdHistory struct {
	want *CRDState

	mu sync.Mutex
	// watching is false when no watch was started, or it ended with a gap.
	watching bool
	// seen is the resourceVersion of the last state the watch delivered.
	seen string
	// generation is that state's metadata.generation.
	generation int64
	// changed says which state broke the proof, once one did.
	changed string
}

// crdWatcher returns what watches the CRD named name, or nil when the
// Migrator has no Config to watch with.
func (m *Migrator) crdWatcher(name string) (cache.WatcherWithContext, error) {
	if m.Config == nil {
		return nil, nil
	}
	m.crdClientOnce.Do(func() {
		m.crdClient, m.crdClientErr = apiextensionsclient.NewForConfig(m.Config)
	})
	if m.crdClientErr != nil {
		return nil, m.crdClientErr
	}
	crds := m.crdClient.ApiextensionsV1().CustomResourceDefinitions()
	selector := fields.OneTermEqualSelector(metav1.ObjectNameField, name).String()
	return &cache.ListWatch{WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
		opts.FieldSelector = selector
		return crds.Watch(ctx, opts)
	}}, nil
}

// watchHistory follows the CRD from the resourceVersion Resolve read it at,
// until ctx ends, as mg.history. A state that breaks the proof calls abort
// with an error wrapping ErrCRDChanged. The history is known to be watched
// once this returns.
func (mg *migration) watchHistory(ctx context.Context, abort context.CancelCauseFunc) {
	want := mg.target.CRD
	mg.history = &crdHistory{want: want, seen: want.ResourceVersion, generation: want.Generation}
	if want.ResourceVersion == "" {
		return
	}
	watcher, err := mg.m.crdWatcher(want.Name)
	if err == nil && watcher != nil {
		var rw *watchtools.RetryWatcher
		if rw, err = watchtools.NewRetryWatcherWithContext(ctx, want.ResourceVersion, watcher); err == nil {
			mg.history.watching = true
			go mg.history.follow(ctx, rw, abort)
			return
		}
	}
	if err != nil {
		klog.FromContext(ctx).Info("Could not watch the CRD during the migration; a change of its generation starts a new migration", "crd", want.Name, "error", Message(err))
	}
}

// follow reads the watch until ctx ends or the history ends.
func (h *crdHistory) follow(ctx context.Context, rw *watchtools.RetryWatcher, abort context.CancelCauseFunc) {
	defer rw.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-rw.ResultChan():
			if !ok {
				h.lose(ctx, abort, "the watch of the CRD ended")
				return
			}
			if !h.note(ev) {
				abort(h.err())
				return
			}
			if ev.Type == watch.Error {
				h.lose(ctx, abort, fmt.Sprintf("the watch of the CRD failed: %v", ev.Object))
				return
			}
		}
	}
}

// note takes one event in and reports whether the proof still holds.
func (h *crdHistory) note(ev watch.Event) bool {
	crd, ok := ev.Object.(*apiextensionsv1.CustomResourceDefinition)
	if !ok {
		return true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case ev.Type == watch.Deleted:
		h.changed = "it was deleted"
	case crd.UID != h.want.UID:
		h.changed = "it was deleted and created again"
	case crd.DeletionTimestamp != nil:
		h.changed = "it is being deleted"
	case storedversions.StorageVersion(crd) != h.want.StorageVersion:
		h.changed = fmt.Sprintf("its storage version became %s (generation %d)", storedversions.StorageVersion(crd), crd.Generation)
	default:
		h.seen, h.generation = crd.ResourceVersion, crd.Generation
		return true
	}
	return false
}

// lose records that the history has a gap from now on. A generation already
// seen to differ from the start's cannot be accepted any more: the
// migration ends now rather than at its prune.
func (h *crdHistory) lose(ctx context.Context, abort context.CancelCauseFunc, why string) {
	if ctx.Err() != nil {
		return
	}
	h.mu.Lock()
	h.watching = false
	moved := h.generation != h.want.Generation
	h.mu.Unlock()
	klog.FromContext(ctx).Info("Lost the watch of the CRD; a change of its generation starts a new migration", "crd", h.want.Name, "reason", why)
	if moved {
		abort(fmt.Errorf("CRD %s: %w: its generation changed, and %s", h.want.Name, storedversions.ErrCRDChanged, why))
	}
}

// err is the error a broken proof ends the migration with.
func (h *crdHistory) err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return fmt.Errorf("CRD %s: %w: %s", h.want.Name, storedversions.ErrCRDChanged, h.changed)
}

// kept reports whether crd, read live, is the CRD the migration began on
// with the storage version it began with in every state in between: by its
// generation, or by the watch, once it delivered crd's resourceVersion.
func (h *crdHistory) kept(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition) bool {
	h.mu.Lock()
	changed := h.changed
	h.mu.Unlock()
	if changed != "" || crd.UID != h.want.UID || crd.DeletionTimestamp != nil || storedversions.StorageVersion(crd) != h.want.StorageVersion {
		return false
	}
	if crd.Generation == h.want.Generation {
		return true
	}
	covered := false
	_ = wait.PollUntilContextTimeout(ctx, historyPoll, historyCatchUp, true, func(context.Context) (bool, error) {
		h.mu.Lock()
		defer h.mu.Unlock()
		after, err := resourceversion.CompareResourceVersion(h.seen, crd.ResourceVersion)
		covered = err == nil && after >= 0
		// A gap after crd's state was seen takes nothing from it.
		return covered || h.changed != "" || !h.watching, nil
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	if covered && h.changed == "" {
		return true
	}
	klog.FromContext(ctx).Info("The CRD's generation changed and its watch cannot show every state since the migration began", "crd", h.want.Name,
		"generation", crd.Generation, "startGeneration", h.want.Generation, "resourceVersion", crd.ResourceVersion, "seen", h.seen)
	return false
}

// refused is the error that ends the migration when kept refuses crd.
func (h *crdHistory) refused(crd *apiextensionsv1.CustomResourceDefinition) error {
	h.mu.Lock()
	changed := h.changed
	h.mu.Unlock()
	if changed != "" {
		return h.err()
	}
	if crd.UID != h.want.UID || crd.DeletionTimestamp != nil || storedversions.StorageVersion(crd) != h.want.StorageVersion {
		return fmt.Errorf("CRD %s: %w: it is being deleted, or its UID or storage version is not the one the migration began on", h.want.Name, storedversions.ErrCRDChanged)
	}
	return fmt.Errorf("CRD %s: %w (generation %d, begun at %d, and the watch of the CRD did not show every state in between)", h.want.Name, storedversions.ErrCRDChanged, crd.Generation, h.want.Generation)
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
