// Package controlplane runs a local Kubernetes control plane: etcd and
// kube-apiserver built from source by the Makefile (KUBEBUILDER_ASSETS), on
// loopback. It installs and switches CRDs, creates objects in bulk, and reads
// etcd directly, which is the only honest proof of a storage version: an API
// read shows the version it was asked for, converted. It can run several
// kube-apiservers on the one etcd behind a balancer, one of them lagging
// (ha.go). make demo runs on it, and internal/testenv builds the tests'
// control plane on it.
package controlplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	restowscheme "github.com/restow/restow/internal/scheme"
)

// Options configure the control plane.
type Options struct {
	// CRDDirectoryPaths are directories or files of CRDs installed at start,
	// such as config/crd/bases.
	CRDDirectoryPaths []string
	// APIServerArgs are extra kube-apiserver flags, without the leading
	// dashes, such as {"etcd-compaction-interval": "5s"}. Every API server
	// gets them.
	APIServerArgs map[string]string
	// EtcdArgs are extra etcd flags, without the leading dashes, such as
	// {"quota-backend-bytes": "201326592"}.
	EtcdArgs map[string]string
	// APIServers is how many kube-apiservers serve on the one etcd: 1 when
	// zero. With more, Config and the kubeconfigs reach them through a TCP
	// balancer that hands each new connection to the next server (ha.go);
	// with the flag goaway-chance in APIServerArgs, clients move between
	// servers as they do behind a production control plane's balancer.
	APIServers int
	// LaggingAPIServer, with APIServers above 1, connects the last API
	// server to etcd through a proxy that holds back etcd's watch events by
	// what SetWatchLag sets (nothing at first): it sees a CRD update, and so
	// switches the CRD's storage version, that much later than the others.
	LaggingAPIServer bool
	// OwnAddresses runs every API server (APIServers of them, at least one)
	// in a network namespace of its own, on an address of its own that it
	// publishes in the default/kubernetes Service's endpoints, with a
	// serving certificate for that address and the Service's names, as a
	// production control plane's servers are (ownaddresses.go). It needs
	// root (or CAP_NET_ADMIN and CAP_SYS_ADMIN).
	OwnAddresses bool
	// SharedHostName, with OwnAddresses, gives every API server the same
	// host name, and so one identity Lease for all of them, as on control
	// planes whose servers run in containers of one name.
	SharedHostName bool
	// UnpublishedAPIServer, with OwnAddresses and more than one API server,
	// keeps the last one (the lagging one, with LaggingAPIServer) out of the
	// default/kubernetes Service's endpoints
	// (--endpoint-reconciler-type=none): a server that clients reach
	// through the balancer but that no client finds an address of.
	UnpublishedAPIServer bool
	// StorageVersionMigrations serves the standard StorageVersionMigration
	// API (storagemigration.k8s.io) in every version the build has past
	// alpha: v1 and v1beta1 from 1.37, v1beta1 in 1.35 and 1.36 (beta, off
	// by default); nothing older. No kube-controller-manager runs, so no
	// in-tree controller acts on them.
	StorageVersionMigrations bool
}

// ControlPlane is a running control plane.
type ControlPlane struct {
	// Config reaches the API server, or the balancer in front of several,
	// as an administrator.
	Config *rest.Config
	// Scheme knows the built-in types, apiextensions/v1 and restow's API.
	Scheme *runtime.Scheme
	// Client is a direct (uncached) client built from Config and Scheme,
	// which can also watch.
	Client client.WithWatch

	environment *envtest.Environment
	// first reaches the first API server only: the one envtest started.
	first client.Client
	// users serializes envtest's AddUser, whose certificate authority is
	// not safe for concurrent use (tests write kubeconfigs from several
	// goroutines, such as a watch beside a run).
	users sync.Mutex
	etcd  *clientv3.Client
	// restarted is the kube-apiserver RestartAPIServer started last, if any.
	restarted     *exec.Cmd
	restartedWait chan struct{}

	// With several API servers (ha.go): those started beside envtest's, the
	// balancer in front of all, and the lagging server's proxy to etcd.
	extra    []*extraAPIServer
	balancer *relay
	lag      *lagProxy

	// With OwnAddresses (ownaddresses.go): every server is one of extra,
	// each in one of networks, reaching etcd through one of forwards (or
	// lag), with its certificate in pkiDir.
	ownAddresses bool
	networks     []*hostNetwork
	forwards     []*relay
	pkiDir       string
}

// Start starts etcd and kube-apiserver from the binaries in KUBEBUILDER_ASSETS.
func Start(opts Options) (*ControlPlane, error) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return nil, errors.New("KUBEBUILDER_ASSETS is not set: run the tests with `make test`, or run `make envtest-assets` and export the directory it prints")
	}
	scheme, err := restowscheme.New()
	if err != nil {
		return nil, err
	}
	environment := &envtest.Environment{
		Scheme:                scheme,
		CRDDirectoryPaths:     opts.CRDDirectoryPaths,
		ErrorIfCRDPathMissing: len(opts.CRDDirectoryPaths) > 0,
	}
	if opts.StorageVersionMigrations {
		if opts.APIServerArgs, err = withStorageVersionMigrations(opts.APIServerArgs); err != nil {
			return nil, err
		}
	}
	configureFlags(environment, opts)
	cfg, err := environment.Start()
	if err != nil {
		return nil, fmt.Errorf("starting the control plane from KUBEBUILDER_ASSETS=%s: %w", os.Getenv("KUBEBUILDER_ASSETS"), err)
	}
	// Tests create and rewrite thousands of objects; client-go's default
	// limit of 5 requests a second would make them crawl.
	cfg.QPS, cfg.Burst = 2000, 4000
	cp := &ControlPlane{Config: cfg, Scheme: scheme, environment: environment}
	if err := cp.startMore(opts); err != nil {
		return nil, err
	}
	if cp.Client, err = client.NewWithWatch(cp.Config, client.Options{Scheme: scheme}); err != nil {
		return nil, errors.Join(err, cp.stopHA(), environment.Stop())
	}
	cp.first = cp.Client
	if cp.Config != cfg {
		if cp.first, err = client.New(cp.ServerConfig(0), client.Options{Scheme: scheme}); err != nil {
			return nil, errors.Join(err, cp.stopHA(), environment.Stop())
		}
	}
	cp.etcd, err = clientv3.New(clientv3.Config{
		Endpoints:   []string{environment.ControlPlane.Etcd.URL.String()},
		DialTimeout: 10 * time.Second,
		Logger:      nil,
	})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("connecting to etcd: %w", err), cp.stopHA(), environment.Stop())
	}
	return cp, nil
}

// configureFlags sets the flags of envtest's kube-apiserver and etcd.
func configureFlags(environment *envtest.Environment, opts Options) {
	// envtest's API server listens on loopback, but would publish the
	// host's own address (its default --advertise-address) in the
	// kubernetes Service's endpoints, where restow reaches each API server
	// it counts: no server on loopback publishes an address. Servers on
	// addresses of their own publish theirs (ownaddresses.go).
	environment.ControlPlane.GetAPIServer().Configure().Set("endpoint-reconciler-type", "none")
	for flag, value := range opts.APIServerArgs {
		environment.ControlPlane.GetAPIServer().Configure().Set(flag, value)
	}
	if len(opts.EtcdArgs) > 0 {
		if environment.ControlPlane.Etcd == nil {
			environment.ControlPlane.Etcd = &envtest.Etcd{}
		}
		for flag, value := range opts.EtcdArgs {
			environment.ControlPlane.Etcd.Configure().Set(flag, value)
		}
	}
}

// startMore starts the API servers beyond envtest's first, on addresses of
// their own or behind a balancer on loopback, as opts asks; on an error it
// stops the whole control plane.
func (e *ControlPlane) startMore(opts Options) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	switch {
	case opts.OwnAddresses:
		opts.APIServers = max(1, opts.APIServers)
		if err := e.startOwnAddresses(ctx, opts); err != nil {
			return errors.Join(fmt.Errorf("starting %d API servers on addresses of their own: %w", opts.APIServers, err), e.stopHA(), e.environment.Stop())
		}
	case opts.APIServers > 1:
		if err := e.startHA(ctx, opts); err != nil {
			return errors.Join(fmt.Errorf("starting %d API servers: %w", opts.APIServers, err), e.stopHA(), e.environment.Stop())
		}
	case opts.LaggingAPIServer:
		return errors.Join(errors.New("LaggingAPIServer needs APIServers of 2 or more"), e.environment.Stop())
	}
	return nil
}

// Stop stops the API server and etcd.
func (e *ControlPlane) Stop() error {
	return errors.Join(e.etcd.Close(), e.stopRestarted(), e.stopHA(), e.environment.Stop())
}

// EtcdURL is the address of the control plane's etcd.
func (e *ControlPlane) EtcdURL() string {
	return e.environment.ControlPlane.Etcd.URL.String()
}

// WriteKubeconfig writes a kubeconfig file for an administrator of the
// control plane, for clients that take --kubeconfig (kubectl, the plugin, a
// manager run as a process).
func (e *ControlPlane) WriteKubeconfig(path string) error {
	return e.WriteKubeconfigAs(path, "restow-admin", "system:masters")
}

// WriteKubeconfigAs writes a kubeconfig file whose client certificate
// authenticates as user in groups: for a service account,
// "system:serviceaccount:<namespace>:<name>", which RBAC binds as that
// service account.
func (e *ControlPlane) WriteKubeconfigAs(path, user string, groups ...string) error {
	added, err := e.addUser(user, groups)
	if err != nil {
		return err
	}
	raw, err := added.KubeConfig()
	if err != nil {
		return err
	}
	if raw, err = e.pointAtBalancer(raw); err != nil {
		return err
	}
	return os.WriteFile(path, raw, 0o600)
}

// addUser gives user in groups a client certificate, one caller at a time.
func (e *ControlPlane) addUser(user string, groups []string) (*envtest.AuthenticatedUser, error) {
	e.users.Lock()
	defer e.users.Unlock()
	return e.environment.AddUser(envtest.User{Name: user, Groups: groups}, nil)
}

// ConfigAs returns a client configuration that authenticates with a client
// certificate as user in groups, unlike Config's administrator: RBAC
// authorizes its requests and API Priority and Fairness classifies them
// (system:masters is exempt from both).
func (e *ControlPlane) ConfigAs(user string, groups ...string) (*rest.Config, error) {
	added, err := e.addUser(user, groups)
	if err != nil {
		return nil, err
	}
	cfg := added.Config()
	cfg.Host = e.Config.Host
	cfg.CAData = e.Config.CAData
	cfg.QPS, cfg.Burst = e.Config.QPS, e.Config.Burst
	return cfg, nil
}
