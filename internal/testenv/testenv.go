// Package testenv owns the test control plane shared by every package that
// needs a real API server: etcd and kube-apiserver built from source by the
// Makefile (KUBEBUILDER_ASSETS), started once per package from TestMain, with
// helpers to install and update CRDs and wait until the API server serves them,
// and an etcd reader that shows the version an object is stored at. That etcd
// read is the only honest proof of a storage version: an API read shows the
// version it was asked for, converted.
package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/go-logr/logr"
	clientv3 "go.etcd.io/etcd/client/v3"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/logging"
)

// Options configure the control plane.
type Options struct {
	// CRDDirectoryPaths are directories or files of CRDs installed at start,
	// such as config/crd/bases.
	CRDDirectoryPaths []string
	// APIServerArgs are extra kube-apiserver flags, without the leading
	// dashes, such as {"etcd-compaction-interval": "5s"}.
	APIServerArgs map[string]string
	// AfterRun, if set, runs after the package's tests and benchmarks, while
	// the control plane is still up; an error fails the run.
	AfterRun func() error
}

// Env is a running control plane.
type Env struct {
	// Config reaches the API server as an administrator.
	Config *rest.Config
	// Scheme knows the built-in types, apiextensions/v1 and restow's API.
	Scheme *runtime.Scheme
	// Client is a direct (uncached) client built from Config and Scheme.
	Client client.Client

	environment *envtest.Environment
	etcd        *clientv3.Client
	// restarted is the kube-apiserver RestartAPIServer started last, if any.
	restarted     *exec.Cmd
	restartedWait chan struct{}
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
	started, err := Start(opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
		os.Exit(1)
	}
	*env = started
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

// Start starts etcd and kube-apiserver from the binaries in KUBEBUILDER_ASSETS.
func Start(opts Options) (*Env, error) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return nil, errors.New("KUBEBUILDER_ASSETS is not set: run the tests with `make test`, or run `make envtest-assets` and export the directory it prints")
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme,
		apiextensionsv1.AddToScheme,
		migrationv1alpha1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	environment := &envtest.Environment{
		Scheme:                scheme,
		CRDDirectoryPaths:     opts.CRDDirectoryPaths,
		ErrorIfCRDPathMissing: len(opts.CRDDirectoryPaths) > 0,
	}
	for flag, value := range opts.APIServerArgs {
		environment.ControlPlane.GetAPIServer().Configure().Set(flag, value)
	}
	cfg, err := environment.Start()
	if err != nil {
		return nil, fmt.Errorf("starting the control plane from KUBEBUILDER_ASSETS=%s: %w", os.Getenv("KUBEBUILDER_ASSETS"), err)
	}
	// Tests create and rewrite thousands of objects; client-go's default
	// limit of 5 requests a second would make them crawl.
	cfg.QPS, cfg.Burst = 2000, 4000
	env := &Env{Config: cfg, Scheme: scheme, environment: environment}
	if env.Client, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		return nil, errors.Join(err, environment.Stop())
	}
	env.etcd, err = clientv3.New(clientv3.Config{
		Endpoints:   []string{environment.ControlPlane.Etcd.URL.String()},
		DialTimeout: 10 * time.Second,
		Logger:      nil,
	})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("connecting to etcd: %w", err), environment.Stop())
	}
	return env, nil
}

// Stop stops the API server and etcd.
func (e *Env) Stop() error {
	return errors.Join(e.etcd.Close(), e.stopRestarted(), e.environment.Stop())
}

// EtcdURL is the address of the control plane's etcd.
func (e *Env) EtcdURL() string {
	return e.environment.ControlPlane.Etcd.URL.String()
}

// Context returns a context that ends with the test or after timeout.
func Context(t testing.TB, timeout time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	t.Cleanup(cancel)
	return ctx
}

// WriteKubeconfig writes a kubeconfig file for an administrator of the
// control plane, for clients that take --kubeconfig (kubectl, the plugin, a
// manager run as a process).
func (e *Env) WriteKubeconfig(path string) error {
	return e.WriteKubeconfigAs(path, "restow-admin", "system:masters")
}

// WriteKubeconfigAs writes a kubeconfig file whose client certificate
// authenticates as user in groups: for a service account,
// "system:serviceaccount:<namespace>:<name>", which RBAC binds as that
// service account.
func (e *Env) WriteKubeconfigAs(path, user string, groups ...string) error {
	added, err := e.environment.AddUser(envtest.User{Name: user, Groups: groups}, nil)
	if err != nil {
		return err
	}
	raw, err := added.KubeConfig()
	if err != nil {
		return err
	}
	return os.WriteFile(path, raw, 0o600)
}
