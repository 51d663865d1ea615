package controllers

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/svm"
)

// Options configure restow's controllers. cmd/manager fills them from flags;
// tests from their own needs, so both wire the controllers the same way.
// They are said here once: the reconcilers embed them.
type Options struct {
	// Concurrency and PageSize apply when a StorageMigration leaves them unset.
	Concurrency int
	PageSize    int64
	// StatusInterval is how often status is written while a run goes on.
	StatusInterval time.Duration
	// StalledRetryBase and StalledRetryMax bound the backoff before a run
	// that ended Stalled is tried again (for a StorageVersionMigration,
	// before a run that paused on transient errors resumes).
	StalledRetryBase, StalledRetryMax time.Duration
	// RetryBackoff spaces retries of transient errors within a run; zero
	// means migrator.DefaultRetryBackoff.
	RetryBackoff wait.Backoff
	// SettleWindow is how long after the storage switch a run waits before
	// it re-checks and prunes; zero means migrator.DefaultSettleWindow.
	SettleWindow time.Duration
	// LagBound and AssumeSeveral say how long API servers may lag each
	// other's switch of a CRD's storage version, and whether to count them;
	// see migrator.Migrator.
	LagBound      time.Duration
	AssumeSeveral bool
	// APIServerAddresses and LagLimit: API servers besides those in
	// default/kubernetes's EndpointSlices, and how long a pass waits at
	// most for one that has not switched; see migrator.Migrator.
	APIServerAddresses []string
	LagLimit           time.Duration
	// MaxPasses bounds the passes that list and rewrite at once; zero means
	// the migrator's default.
	MaxPasses int
	// MaxBuiltInPasses bounds, within MaxPasses, the passes over built-in
	// resources; zero means migrator.DefaultMaxBuiltInPasses.
	MaxBuiltInPasses int

	// AutoMigrate runs the automatic trigger: a StorageMigration for every
	// CRD whose status.storedVersions lists more than its storage version.
	AutoMigrate bool
	// AutoMigrateSelector limits the trigger to CRDs whose labels match; nil
	// selects every CRD.
	AutoMigrateSelector labels.Selector
	// DeferToStandard makes the automatic trigger leave a resource that a
	// standard StorageVersionMigration is migrating to it.
	DeferToStandard bool
	// ServeStandard runs restow's controller of standard
	// StorageVersionMigrations, for clusters where no in-tree one runs.
	ServeStandard bool
	// AutoMigrateBuiltIns runs the automatic trigger of built-in resources
	// (BuiltInMigrationReconciler): a StorageMigration for each, which
	// records a baseline and re-stores the objects once a control-plane
	// upgrade moves the storage version.
	AutoMigrateBuiltIns bool
	// BuiltInInterval is how often that trigger reads discovery besides at
	// start and when an API server's identity Lease appears, goes or changes
	// holder; zero means
	// DefaultBuiltInInterval. BuiltInExclude are resource.group patterns it
	// leaves alone.
	BuiltInInterval time.Duration
	BuiltInExclude  []string
	// ReEncrypt names the built-in resources restow re-encrypts once every
	// API server reports a new encryption state (migrator.Migrator's
	// ReEncrypt); the trigger of built-in resources keeps a StorageMigration
	// for each, also with AutoMigrateBuiltIns off.
	ReEncrypt []schema.GroupResource
	// EncryptionCheckInterval is how often a StorageMigration of a resource
	// in ReEncrypt reads every API server's encryption state when nothing
	// else wakes it; zero means DefaultEncryptionCheckInterval.
	EncryptionCheckInterval time.Duration
	// Space says how passes learn etcd's room (migrator.SpaceOptions);
	// Setup sets its Changed to the manager's metrics.
	Space migrator.SpaceOptions
	// UnknownResourceGrace is how long a served StorageVersionMigration of a
	// resource that does not exist waits before it ends Failed; zero means
	// a minute, as the in-tree controller waits.
	UnknownResourceGrace time.Duration
}

// Setup registers restow's controllers with a manager.
func Setup(ctx context.Context, mgr ctrl.Manager, opts Options) error {
	m, err := NewMigrator(mgr)
	if err != nil {
		return err
	}
	m.LagBound, m.AssumeSeveral, m.MaxPasses = opts.LagBound, opts.AssumeSeveral, opts.MaxPasses
	m.MaxBuiltInPasses = opts.MaxBuiltInPasses
	m.APIServerAddresses, m.LagLimit = opts.APIServerAddresses, opts.LagLimit
	m.ReEncrypt = opts.ReEncrypt
	m.Space = opts.Space
	m.Space.Changed = spaceRecorder()
	m.SlotsChanged = func(running int) { passesRunning.Set(float64(running)) }
	recorder := mgr.GetEventRecorder("restow")
	standard, err := standardMigrations(ctx, mgr, m, opts)
	if err != nil {
		return err
	}
	migrations := &StorageMigrationReconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Migrator:  m,
		Recorder:  recorder,
		Standard:  standard,
		Options:   opts,
	}
	builtIns := opts.AutoMigrateBuiltIns || len(opts.ReEncrypt) > 0
	// The triggers hand the StorageMigrations they create or find moved to
	// the StorageMigration controller through wake.
	wake := make(chan event.GenericEvent)
	migrations.Wake = wake
	if builtIns {
		migrations.seen = &sweptHashes{}
	}
	if err := migrations.SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("setting up the StorageMigration controller: %w", err)
	}
	var auto *AutoMigrationReconciler
	if opts.AutoMigrate {
		if auto, err = setupAutoMigration(mgr, standard, opts, wake); err != nil {
			return err
		}
	}
	if builtIns {
		if err := setupBuiltIns(mgr, m, opts, wake, migrations, auto); err != nil {
			return fmt.Errorf("setting up automatic migration of built-in resources: %w", err)
		}
	}
	if standard != nil && opts.ServeStandard {
		if err := setupServed(mgr, m, standard, opts); err != nil {
			return fmt.Errorf("setting up the StorageVersionMigration controller: %w", err)
		}
	}
	return nil
}

// setupAutoMigration registers the automatic trigger of CRDs, which hands
// the StorageMigrations it creates to the StorageMigration controller
// through wake.
func setupAutoMigration(mgr ctrl.Manager, standard *StandardMigrations, opts Options, wake chan<- event.GenericEvent) (*AutoMigrationReconciler, error) {
	auto := &AutoMigrationReconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Recorder:  mgr.GetEventRecorder("restow"),
		Selector:  opts.AutoMigrateSelector,
		Wake:      wake,
	}
	if opts.DeferToStandard {
		auto.Standard = standard
	}
	if err := auto.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("setting up automatic migration: %w", err)
	}
	return auto, nil
}

// setupServed registers restow's controller of standard
// StorageVersionMigrations.
func setupServed(mgr ctrl.Manager, m *migrator.Migrator, standard *StandardMigrations, opts Options) error {
	served := &StorageVersionMigrationReconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Cache:     mgr.GetCache(),
		Migrator:  m,
		Recorder:  mgr.GetEventRecorder("restow"),
		Version:   standard.Version,
		Options:   opts,
	}
	return served.SetupWithManager(mgr)
}

// setupBuiltIns registers the automatic trigger of built-in resources.
func setupBuiltIns(mgr ctrl.Manager, m *migrator.Migrator, opts Options, wake chan<- event.GenericEvent,
	migrations *StorageMigrationReconciler, auto *AutoMigrationReconciler) error {
	leases, err := kubernetes.NewForConfig(mgr.GetConfig())
	if err != nil {
		return err
	}
	interval := opts.BuiltInInterval
	if interval <= 0 {
		interval = DefaultBuiltInInterval
	}
	builtIns := &BuiltInMigrationReconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Discovery: m.Discovery,
		Leases:    leases,
		Recorder:  mgr.GetEventRecorder("restow"),
		Exclude:   opts.BuiltInExclude,
		Interval:  interval,
		Wake:      wake,
		Idle:      m.WaitIdle,
		Sweep:     m.SweepServerHashes,
		Due:       migrations.due,

		ReEncrypt:     opts.ReEncrypt,
		ReEncryptOnly: !opts.AutoMigrateBuiltIns,
		seen:          migrations.seen,
	}
	if auto != nil {
		builtIns.FirstLook = auto.FirstLook
	}
	return builtIns.SetupWithManager(mgr)
}

// standardMigrations reads the standard StorageVersionMigrations of the
// cluster, or returns nil when it serves none, or restow may not list them
// (said in the log).
func standardMigrations(ctx context.Context, mgr ctrl.Manager, m *migrator.Migrator, opts Options) (*StandardMigrations, error) {
	version, err := svm.ServedVersion(m.Discovery)
	if err != nil {
		return nil, err
	}
	log := ctrl.LoggerFrom(ctx)
	if version != "" {
		// A watch the service account may not list would keep the
		// manager's caches from syncing, and the manager from starting.
		err := mgr.GetAPIReader().List(ctx, svm.NewList(version), client.Limit(1))
		if apierrors.IsForbidden(err) {
			log.Error(err, "Leaving standard StorageVersionMigrations out: the service account may not list them (the ClusterRole of this release grants it)")
			version = ""
		}
	}
	if version == "" {
		if opts.ServeStandard {
			log.Error(svm.ErrNotServed, "Not serving StorageVersionMigrations (--serve-storage-version-migrations): enable the API on the API server (Kubernetes 1.35 and later) and restart the manager")
		}
		return nil, nil
	}
	log.Info("The cluster serves standard StorageVersionMigrations", "apiVersion", svm.GVK(version).GroupVersion().String(),
		"serving", opts.ServeStandard, "deferring", opts.DeferToStandard)
	return &StandardMigrations{Version: version, Reader: mgr.GetCache(), Served: opts.ServeStandard}, nil
}
