package controllers

import (
	"context"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/migrator"
)

// Background work (the automatic StorageMigrations of built-in resources
// that nobody asked anything of) yields to passes and costs no request
// where nothing moved.

// backgroundRetry is how soon a StorageMigration put off looks again: a
// read of the manager's cache, no request.
const backgroundRetry = 5 * time.Second

// backgroundDeferMax bounds how long background work waits for passes:
// past it, it goes ahead beside them. A moved storage version or a
// rotation must not wait for a backlog of passes to drain, and a baseline
// whose first sight was not stamped could take in an upgrade meanwhile.
const backgroundDeferMax = time.Minute

// baselineDeferMax bounds how long a first baseline waits for passes when
// the trigger stamped what it first saw (FirstSeenHashAnnotation) and
// every API server still publishes it: an upgrade meanwhile is re-stored
// from the stamp. An upgrade and its rollback between two sweeps go unseen,
// as they do once a baseline is recorded.
const baselineDeferMax = 10 * time.Minute

// firstSweepWait is how long, after the manager starts, a StorageMigration
// at rest waits for the trigger's first sweep before it resolves its
// resource anyway.
const firstSweepWait = time.Minute

// background says whether to leave the reconcile of req for now, and when
// to look again (zero: not until something wakes it). It reads the
// StorageMigration from the cache, so leaving it costs no request. Only the
// automatic StorageMigration of a built-in resource, with no run of its
// own, that nobody asked anything of (no new spec, no re-run) and that
// resumes no interrupted pass, is left: while any migration is under way,
// for at most backgroundDeferMax in a row (its baseline, its encryption
// check, a re-store after an upgrade all wait), and, at rest, while the
// trigger's last sweep shows every API server still publishing the
// storageVersionHash it recorded and nothing else asks for it.
func (r *StorageMigrationReconciler) background(ctx context.Context, req ctrl.Request) (time.Duration, bool) {
	if r.runs.get(req.Name) != nil {
		return 0, false
	}
	sm := &migrationv1alpha1.StorageMigration{}
	if err := r.Client.Get(ctx, req.NamespacedName, sm); err != nil {
		r.deferrals.Delete(req.Name)
		return 0, false
	}
	// A spec changed since it was last observed is someone's ask; a new
	// StorageMigration, never observed, is the trigger's.
	specChanged := sm.Status.ObservedGeneration != 0 && sm.Generation != sm.Status.ObservedGeneration
	if !isBuiltInAutomatic(sm) || !sm.DeletionTimestamp.IsZero() || sm.Status.Progress != nil || specChanged || reRunRequested(sm) {
		r.deferrals.Delete(req.Name)
		return 0, false
	}
	if r.Migrator.Rewriting() {
		since, _ := r.deferrals.LoadOrStore(req.Name, time.Now())
		if time.Since(since.(time.Time)) < r.deferMax(sm) {
			return backgroundRetry, true
		}
	}
	r.deferrals.Delete(req.Name)
	if r.seen == nil || !r.atRest(sm) || r.standardChanged(ctx, sm) {
		return 0, false
	}
	gr := schema.GroupResource{Group: sm.Spec.Resource.Group, Resource: sm.Spec.Resource.Resource}
	switch swept, unmoved := r.seen.unmoved(gr, recordedHash(sm)); {
	case unmoved:
		return 0, true
	case !swept && time.Since(r.started) < firstSweepWait:
		return backgroundRetry, true
	}
	return 0, false
}

// deferMax is how long sm's background work waits for passes in a row:
// longer for a first baseline whose stamped first sight every API server
// still publishes in the trigger's last sweep; a move since is a re-store,
// which waits no longer than any other.
func (r *StorageMigrationReconciler) deferMax(sm *migrationv1alpha1.StorageMigration) time.Duration {
	gr := schema.GroupResource{Group: sm.Spec.Resource.Group, Resource: sm.Spec.Resource.Resource}
	if sm.Status.Baseline == nil && sm.Status.LastPass == nil && r.seen != nil {
		if _, unmoved := r.seen.unmoved(gr, sm.Annotations[migrationv1alpha1.FirstSeenHashAnnotation]); unmoved {
			return baselineDeferMax
		}
	}
	return backgroundDeferMax
}

// standardChanged says whether the standard StorageVersionMigrations of
// sm's resource (from the cache) differ from what its status shows: that
// status is this reconcile's to refresh, at rest or not.
func (r *StorageMigrationReconciler) standardChanged(ctx context.Context, sm *migrationv1alpha1.StorageMigration) bool {
	if r.Standard == nil {
		return false
	}
	now := r.standardFor(ctx, sm)
	return !now.set || !equality.Semantic.DeepEqual(now.value, sm.Status.StorageVersionMigrations)
}

// atRest says whether sm, an automatic StorageMigration of a built-in
// resource, rests: Ready, with a hash recorded, proven, and nothing left
// to retry, and not re-encrypted (those read the encryption state each
// period). An unproven baseline waits for every API server to be read.
func (r *StorageMigrationReconciler) atRest(sm *migrationv1alpha1.StorageMigration) bool {
	gr := schema.GroupResource{Group: sm.Spec.Resource.Group, Resource: sm.Spec.Resource.Resource}
	return meta.IsStatusConditionTrue(sm.Status.Conditions, migrationv1alpha1.ReadyCondition) &&
		recordedHash(sm) != "" && (sm.Status.LastPass == nil || sm.Status.LastPass.Failed == 0) &&
		!unprovenBaseline(sm) && !slices.Contains(r.ReEncrypt, gr)
}

// sweptHashes is what the trigger of built-in resources last saw: per
// resource, the storageVersionHash the usual discovery read and every API
// server's own agreed on. A resource they disagree on, or any resource of
// a sweep that could not read every server, is absent.
type sweptHashes struct {
	mu     sync.RWMutex
	swept  bool
	agreed map[schema.GroupResource]string
}

// publish records a sweep: found from the usual read, servers from each
// API server's own discovery.
func (s *sweptHashes) publish(found []builtIn, servers migrator.ServerHashes) {
	agreed := map[schema.GroupResource]string{}
	for _, res := range found {
		if res.hash != "" && !servers.Moved(res.gr, res.hash) {
			agreed[res.gr] = res.hash
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.swept, s.agreed = true, agreed
}

// unmoved says whether a sweep was published, and whether in the last one
// every API server published recorded for gr.
func (s *sweptHashes) unmoved(gr schema.GroupResource, recorded string) (swept, unmoved bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.swept, s.swept && recorded != "" && s.agreed[gr] == recorded
}

// warmUp waits, before the first sweep after the manager starts, until
// the automatic migration of CRDs has looked at each CRD once and no
// StorageMigration someone asked for waits to start, or until ctx ends:
// the first sweep and the StorageMigrations it creates are the trigger's
// largest burst of requests, and the migration a CRD upgrade brings is
// often created in the same second.
func (r *BuiltInMigrationReconciler) warmUp(ctx context.Context) {
	if r.FirstLook != nil {
		if err := r.FirstLook(ctx); err != nil {
			return
		}
	}
	if r.Due == nil {
		return
	}
	_ = wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		return !r.Due(ctx), nil
	})
}

// due says whether a StorageMigration someone asked for (any but the
// automatic ones of built-in resources) waits to start: no run of it is
// under way, and it is new or changed since last observed, asked to run
// again, resumes an interrupted pass, or waits for the API server to
// store at its storage version. It reads the cache only.
func (r *StorageMigrationReconciler) due(ctx context.Context) bool {
	var all migrationv1alpha1.StorageMigrationList
	if err := r.Client.List(ctx, &all, client.UnsafeDisableDeepCopy); err != nil {
		return false
	}
	for i := range all.Items {
		sm := &all.Items[i]
		if isBuiltInAutomatic(sm) || !sm.DeletionTimestamp.IsZero() || r.runs.get(sm.Name) != nil {
			continue
		}
		ready := meta.FindStatusCondition(sm.Status.Conditions, migrationv1alpha1.ReadyCondition)
		if sm.Generation != sm.Status.ObservedGeneration || reRunRequested(sm) || sm.Status.Progress != nil ||
			ready != nil && ready.Reason == migrationv1alpha1.WaitingForStorageVersionReason {
			return true
		}
	}
	return false
}
