// Package testenv is the tests' control plane: internal/controlplane
// started once per package from TestMain (or for one test, Start: several
// API servers, one lagging), with what tests need on top of it: the CRD fixture and its proof from etcd (Fixture), TLS conversion and
// admission webhooks, an admission policy that freezes an object, and an
// observer that fails a test whose storedVersions was pruned early.
package testenv

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/restow/restow/internal/controlplane"
	"github.com/restow/restow/internal/logging"
)

// The control plane's words, for tests that build their own CRDs.
type (
	// CRDVersion describes one version of a test CRD.
	CRDVersion = controlplane.CRDVersion
	// StoredObject is an object as etcd holds it.
	StoredObject = controlplane.StoredObject
)

// NewCRD builds a CRD; see controlplane.NewCRD.
var NewCRD = controlplane.NewCRD

// Options configure the control plane.
type Options struct {
	// CRDDirectoryPaths are directories or files of CRDs installed at start,
	// such as config/crd/bases.
	CRDDirectoryPaths []string
	// APIServerArgs are extra kube-apiserver flags, without the leading
	// dashes, such as {"etcd-compaction-interval": "5s"}.
	APIServerArgs map[string]string
	// EtcdArgs are extra etcd flags, without the leading dashes, such as
	// {"quota-backend-bytes": "201326592"}.
	EtcdArgs map[string]string
	// APIServers and LaggingAPIServer make a control plane of several API
	// servers behind a balancer, one of them lagging; see controlplane.Options.
	APIServers       int
	LaggingAPIServer bool
	// OwnAddresses runs each API server in a network namespace of its own,
	// on an address of its own in the default/kubernetes Service's
	// endpoints; see controlplane.Options.
	OwnAddresses bool
	// SharedHostName gives those servers one host name; see
	// controlplane.Options.
	SharedHostName bool
	// UnpublishedAPIServer keeps the last of those servers out of the
	// Service's endpoints; see controlplane.Options.
	UnpublishedAPIServer bool
	// StorageVersionMigrations serves the standard StorageVersionMigration
	// API; see controlplane.Options.
	StorageVersionMigrations bool
	// AfterRun, if set, runs after the package's tests and benchmarks, while
	// the control plane is still up; an error fails the run.
	AfterRun func() error
}

// Env is a running control plane, for tests.
type Env struct {
	*controlplane.ControlPlane
}

// Main starts one control plane for a package's tests, stores it in *env, runs
// them and exits. Call it from TestMain.
//
// RESTOW_TEST_LOG_LEVEL (debug, info, or a number) sends the logs of the
// controllers under test to stderr, for debugging.
func Main(m *testing.M, opts Options, env **Env) {
	if level := os.Getenv("RESTOW_TEST_LOG_LEVEL"); level != "" {
		log, err := logging.New(logging.Options{Level: level, Encoding: "console"})
		if err != nil {
			fmt.Fprintf(os.Stderr, "testenv: RESTOW_TEST_LOG_LEVEL: %v\n", err)
			os.Exit(1)
		}
		ctrllog.SetLogger(log)
	} else {
		// Without it, controller-runtime prints a stack trace after 30 s
		// to say no logger was set.
		ctrllog.SetLogger(logr.Discard())
	}
	start := time.Now()
	started, err := controlplane.Start(opts.controlPlane())
	if err != nil {
		fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
		os.Exit(1)
	}
	if !flag.Parsed() {
		flag.Parse()
	}
	if testing.Verbose() {
		fmt.Fprintf(os.Stderr, "testenv: etcd and kube-apiserver started in %s\n", time.Since(start).Round(100*time.Millisecond))
	}
	*env = &Env{ControlPlane: started}
	code := m.Run()
	if opts.AfterRun != nil {
		if err := opts.AfterRun(); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
			code = 1
		}
	}
	if err := started.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: stopping the control plane: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

func (o Options) controlPlane() controlplane.Options {
	return controlplane.Options{
		CRDDirectoryPaths: o.CRDDirectoryPaths, APIServerArgs: o.APIServerArgs, EtcdArgs: o.EtcdArgs,
		APIServers: o.APIServers, LaggingAPIServer: o.LaggingAPIServer, OwnAddresses: o.OwnAddresses, SharedHostName: o.SharedHostName, UnpublishedAPIServer: o.UnpublishedAPIServer,
		StorageVersionMigrations: o.StorageVersionMigrations,
	}
}

// Start starts a control plane of the test's own, unlike the package's one
// (several API servers, say), and stops it when the test ends. AfterRun is
// not used.
func Start(t testing.TB, opts Options) *Env {
	t.Helper()
	started, err := controlplane.Start(opts.controlPlane())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := started.Stop(); err != nil {
			t.Errorf("stopping the test's control plane: %v", err)
		}
	})
	return &Env{ControlPlane: started}
}

// Context returns a context that ends with the test or after timeout.
func Context(t testing.TB, timeout time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	t.Cleanup(cancel)
	return ctx
}

// InstallCRDForTest installs a CRD and deletes it when the test ends.
func (e *Env) InstallCRDForTest(t testing.TB, crd *apiextensionsv1.CustomResourceDefinition) {
	t.Helper()
	if err := e.InstallCRD(t.Context(), crd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.deleteCRDAfterTest(t, crd.Name) })
}

// deleteCRDAfterTest deletes a test's CRD with its objects. Its conversion
// webhook may still refuse or be stopped (the webhook's own cleanup may have
// run first): the CRD converts without it from then on, or the API server
// could not delete its objects. Its objects are then purged from etcd, so
// the API server need not delete them one by one (seconds for each
// thousand). The deletion fails loudly, saying how many objects are left,
// when it stops making progress; cleanupCeiling bounds it whatever happens.
func (e *Env) deleteCRDAfterTest(t testing.TB, name string) {
	// t.Context() is already cancelled when cleanups run.
	ctx, cancel := context.WithTimeout(context.Background(), cleanupCeiling)
	defer cancel()
	if err := e.DisarmConversion(ctx, name); err != nil {
		t.Error(err)
	}
	if err := e.PurgeObjects(ctx, name); err != nil {
		t.Error(err)
	}
	if err := e.DeleteCRD(ctx, name); err != nil {
		t.Errorf("cleanup: %v", err)
	}
}

// cleanupCeiling bounds one cleanup step, however long it keeps making
// progress, so a cleanup never eats the package's -timeout.
const cleanupCeiling = 10 * time.Minute
