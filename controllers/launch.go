package controllers

import (
	"context"
	"errors"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/migrator"
)

// What both reconcilers (StorageMigrations, and the StorageVersionMigrations
// restow serves) share to start a run: resolve the resource and sort what
// Resolve said, build the engine's options, launch the run; and the delays
// and the index they both use.

// Requeue delays.
const (
	// The API server usually stores at a new storage version within a
	// fraction of a second of the CRD update; the wait backs off from
	// waitForStorageVersionBase to waitForStorageVersionMax.
	waitForStorageVersionBase = 100 * time.Millisecond
	waitForStorageVersionMax  = 5 * time.Second
	// A StorageMigration that waits for the API servers to agree on their
	// encryption state, or that cannot read every one of them, resolves
	// again from waitForServersBase to waitForServersMax: Resolve reads
	// every server, and behind one address the wait lasts.
	waitForServersBase  = time.Second
	waitForServersMax   = 30 * time.Second
	transientRetryDelay = 5 * time.Second
	restartDelay        = 100 * time.Millisecond
)

// resourceIndex indexes StorageMigrations by the CRD name of their resource
// (resource.group), so a CRD event finds the migrations of its resource,
// and a StorageVersionMigration the StorageMigration that sets its knobs.
const resourceIndex = "spec.resource"

// resolution is what Resolve said of a resource, sorted by what comes next:
// a run of target, or one of waiting (the API server does not store at the
// storage version yet: look again with backoff), stalled (the resource
// cannot be migrated as it is) or transient (retry shortly).
type resolution struct {
	target  migrator.Target
	waiting string
	// waitingServers: waiting for the API servers to agree on a built-in
	// resource's storage version, as through a control-plane upgrade.
	waitingServers bool
	stalled        string
	transient      error
}

// resolve resolves gr with the engine and sorts the answer.
func resolve(ctx context.Context, m *migrator.Migrator, gr schema.GroupResource) resolution {
	target, err := m.Resolve(ctx, gr)
	var waitErr *migrator.WaitError
	var stalledErr *migrator.StalledError
	switch {
	case errors.As(err, &waitErr):
		return resolution{waiting: waitErr.Message, waitingServers: waitErr.Servers}
	case errors.As(err, &stalledErr):
		return resolution{stalled: stalledErr.Message}
	case err != nil:
		return resolution{transient: err}
	}
	return resolution{target: target}
}

// waitFor is how long the StorageMigration (or StorageVersionMigration)
// name, waiting as res says, waits before it resolves again: backing off to
// waitForStorageVersionMax while one API server's informer catches up with
// a CRD, to waitForServersMax while the API servers disagree on a built-in
// resource (an upgrade rolls for minutes, and each look reads every
// server's discovery; a server that restarts, changing its identity
// Lease's holder, wakes the StorageMigrations of built-in resources at
// once).
func (rs *runs) waitFor(name string, res resolution) time.Duration {
	if res.waitingServers {
		return rs.servers.When(name)
	}
	return rs.waiting.When(name)
}

// runOptions are the engine's options for a run: the manager's knobs, and
// whether it prunes and from where it resumes.
func (o Options) runOptions(prune bool, resume *migrator.Checkpoint) migrator.Options {
	return migrator.Options{
		Concurrency:  o.Concurrency,
		PageSize:     o.PageSize,
		RetryBackoff: o.RetryBackoff,
		SettleWindow: o.SettleWindow,
		Prune:        prune,
		Resume:       resume,
	}
}

// startRun launches, for owner, a run of target with opts (its checkpoint
// in opts.Resume, from migrator.ResumeFrom), with the reconcile's logger. It
// reports false when the manager is stopping and nothing started.
func (rs *runs) startRun(ctx context.Context, m *migrator.Migrator, owner client.Object, target migrator.Target, opts migrator.Options) bool {
	log := ctrl.LoggerFrom(ctx)
	// Background work waits from the launch on, not from when the run's
	// goroutine enters Migrate.
	release := m.Hold()
	started := rs.launch(ctx, owner, newRun(target, opts.Resume), func(ctx context.Context, observe migrator.Observer) (migrator.Result, error) {
		defer release()
		return m.Migrate(ctrl.LoggerInto(ctx, log), target, opts, observe)
	})
	if !started {
		release()
	}
	return started
}

// pruneEnabled says whether sm lets its runs prune status.storedVersions.
func pruneEnabled(sm *migrationv1alpha1.StorageMigration) bool {
	return sm.Spec.PruneStoredVersions == nil || *sm.Spec.PruneStoredVersions
}
