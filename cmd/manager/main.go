// Command manager runs the restow operator.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/restow/restow/controllers"
	"github.com/restow/restow/internal/logging"
	"github.com/restow/restow/internal/migrator"
	restowscheme "github.com/restow/restow/internal/scheme"
	"github.com/restow/restow/internal/version"
)

type options struct {
	logging              logging.Options
	kubeconfig           string
	metricsAddr          string
	secureMetrics        bool
	enableHTTP2          bool
	probeAddr            string
	pprofAddr            string
	leaderElect          bool
	leaderElectNamespace string
	leaseDuration        time.Duration
	renewDeadline        time.Duration
	retryPeriod          time.Duration
	qps                  float64
	burst                int
	concurrency          int
	maxPasses            int
	maxBuiltInPasses     int
	pageSize             int64
	statusInterval       time.Duration
	settleWindow         time.Duration
	lagBound             time.Duration
	assumeSeveral        bool
	apiServers           string
	lagLimit             time.Duration
	stalledRetryBase     time.Duration
	stalledRetryMax      time.Duration
	autoMigrate          bool
	deferToStandard      bool
	serveStandard        bool
	autoMigrateSelector  string
	autoMigrateBuiltIns  bool
	reEncrypt            string
	builtInInterval      time.Duration
	encryptionCheck      time.Duration
	builtInExclude       string
	printVersion         bool
	etcd                 etcdOptions
}

func (o *options) bindFlags(fs *flag.FlagSet) {
	o.logging.BindFlags(fs)
	o.etcd.bindFlags(fs)
	fs.BoolVar(&o.printVersion, "version", false, "Print the version and exit.")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Kubeconfig file to reach the API server with; empty uses $KUBECONFIG, then the in-cluster service account.")
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8443", `Address of the metrics endpoint; "0" turns it off.`)
	fs.BoolVar(&o.secureMetrics, "metrics-secure", true, "Serve metrics over HTTPS, for authenticated and authorized clients only.")
	fs.BoolVar(&o.enableHTTP2, "enable-http2", false, "Serve metrics over HTTP/2 too (off: HTTP/2 Rapid Reset and Stream Cancellation, CVE-2023-44487 and CVE-2023-39325).")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "Address of the /healthz and /readyz endpoints.")
	fs.StringVar(&o.pprofAddr, "pprof-bind-address", "", `Address of Go's /debug/pprof endpoints, for profiling; empty (or "0") turns them off.`)
	fs.BoolVar(&o.leaderElect, "leader-elect", true, "Elect a leader so only one replica migrates at a time.")
	fs.StringVar(&o.leaderElectNamespace, "leader-election-namespace", "", "Namespace of the leader election Lease; defaults to the pod's namespace.")
	// Longer than client-go's 15/10/2 s, as cert-manager's 60/40 s: a
	// single API server restarting (a control plane upgrade, often when CRDs
	// change) is down for tens of seconds (e2e TestAPIServerRestartMidPass
	// restarts one mid-pass), and a leader that cannot renew within the
	// deadline exits. A migration can wait the longer failover.
	fs.DurationVar(&o.leaseDuration, "leader-election-lease-duration", 60*time.Second, "How long a replica waits before taking over a lease its holder stopped renewing.")
	fs.DurationVar(&o.renewDeadline, "leader-election-renew-deadline", 40*time.Second, "How long the leader keeps trying to renew its lease (through an API server outage) before it gives up and exits.")
	fs.DurationVar(&o.retryPeriod, "leader-election-retry-period", 5*time.Second, "How often replicas try to acquire or renew the lease.")
	// Rewriting objects in bulk needs more than client-go's 5/10 or
	// controller-runtime's 20/30. 1000/2000 is a safety net against a
	// runaway loop, above what one API server takes (docs/benchmarks.md:
	// 200/s held the operator to 0.38x the API server's pace); API Priority
	// and Fairness does the throttling (config/flowcontrol).
	fs.Float64Var(&o.qps, "kube-api-qps", 1000, "Client-side rate limit on requests to the API server, per second.")
	fs.IntVar(&o.burst, "kube-api-burst", 2000, "Client-side burst of requests to the API server.")
	fs.IntVar(&o.maxBuiltInPasses, "max-concurrent-builtin-passes", migrator.DefaultMaxBuiltInPasses, "Most passes over built-in resources (after a control-plane upgrade or a key rotation) that list and rewrite at once, within --max-concurrent-passes.")
	fs.IntVar(&o.maxPasses, "max-concurrent-passes", migrator.DefaultMaxPasses, "Most passes that list and rewrite at once, over every resource: others wait for one to end (waiting out the lag bound or the settle window takes none). Bounds memory and API load when many resources need migrating at once.")
	fs.IntVar(&o.concurrency, "concurrency", migrator.DefaultConcurrency, "Most objects rewritten in parallel per pass, unless a StorageMigration sets spec.concurrency: each pass paces itself below it, to what the API server can take.")
	fs.Int64Var(&o.pageSize, "page-size", migrator.DefaultPageSize, "Objects listed per page, unless a StorageMigration sets spec.pageSize.")
	fs.DurationVar(&o.settleWindow, "settle-window", migrator.DefaultSettleWindow, "How long after every API server has switched to the new storage version (see --apiserver-lag-bound) a migration waits before it re-checks what others wrote and prunes status.storedVersions: writes that began on the old storage may commit until then. At least twice the API server's --request-timeout (default 60s).")
	fs.DurationVar(&o.lagBound, "apiserver-lag-bound", migrator.DefaultLagBound, "How long any API server may take to see a CRD update after another has (its CRD informer's lag). With several API servers (the most that identity Leases in kube-system, the addresses in default/kubernetes's EndpointSlices or --apiservers show), or when their number is unknown, a pass reads each server's own discovery at its address and starts a second after the last one shows the switch; for a server it cannot reach or verify, it waits this long after the switch before its first page. The settle window counts from then: an answer from a server that has not switched proves nothing. One API server: one second.")
	fs.StringVar(&o.apiServers, "apiservers", "", "Comma-separated host:port of API servers besides those in default/kubernetes's EndpointSlices (for servers behind one load balancer address): each counts as one, and restow reads its discovery there, verifying its certificate against the cluster's CA as kubernetes.default.svc.")
	fs.DurationVar(&o.lagLimit, "apiserver-lag-limit", migrator.DefaultLagLimit, "How long after a storage switch a pass waits at most for an API server that it reaches and that still stores at the old version; then the migration stops, Stalled, with nothing rewritten or pruned, and is tried again later. At least --apiserver-lag-bound.")
	fs.BoolVar(&o.assumeSeveral, "assume-several-apiservers", false, "Wait for --apiserver-lag-bound without counting the API servers: for control planes whose API servers share a host name (and so one identity Lease) and publish no address of their own in default/kubernetes's endpoints.")
	fs.DurationVar(&o.statusInterval, "status-interval", 5*time.Second, "How often a running pass writes its progress into status.")
	fs.DurationVar(&o.stalledRetryBase, "stalled-retry-base", 30*time.Second, "First delay before a Stalled migration is tried again; doubles each time.")
	fs.BoolVar(&o.autoMigrate, "auto-migrate", true, "Create a StorageMigration for every CRD whose status.storedVersions lists more than its storage version.")
	fs.BoolVar(&o.deferToStandard, "defer-to-storage-version-migrations", true, "Create no automatic StorageMigration for a resource that a standard StorageVersionMigration (storagemigration.k8s.io) is migrating.")
	fs.BoolVar(&o.serveStandard, "serve-storage-version-migrations", false, "Act as the controller of standard StorageVersionMigrations, for clusters whose kube-controller-manager runs none; restow leaves alone any that another controller writes.")
	fs.StringVar(&o.autoMigrateSelector, "auto-migrate-selector", "", `Label selector limiting automatic migration to the CRDs it matches, e.g. "app.kubernetes.io/part-of=shop"; empty selects every CRD.`)
	fs.DurationVar(&o.stalledRetryMax, "stalled-retry-max", 30*time.Minute, "Longest delay before a Stalled migration is tried again.")
	fs.BoolVar(&o.autoMigrateBuiltIns, "auto-migrate-builtins", true, "Create a StorageMigration for every built-in resource (served by kube-apiserver itself) that records the storage version the API servers store it at, rewriting nothing, and re-stores its objects once a control-plane upgrade moves that version and every API server stores at the new one.")
	fs.DurationVar(&o.encryptionCheck, "reencrypt-check-interval", controllers.DefaultEncryptionCheckInterval, "How often each resource named by --reencrypt-resources reads every API server's encryption state (one metrics read per server), so that a key rotation is re-encrypted within about this long after the last server's reload.")
	fs.DurationVar(&o.builtInInterval, "builtin-discovery-interval", controllers.DefaultBuiltInInterval, "How often the built-in resources' storage versions are read from discovery, besides at start and when an API server's identity Lease in kube-system appears, goes or changes holder; a server restarted in place keeps its Lease, so this period is what sees an in-place upgrade.")
	fs.StringVar(&o.reEncrypt, "reencrypt-resources", "", `Comma-separated resource.group names of built-in resources ("secrets,configmaps") that restow re-encrypts after an encryption key rotation: once every API server's own metrics report one new encryption configuration (or KMS v2 key ID), their objects are rewritten under it. Needs each server's metrics at an address of its own (or a single API server); empty re-encrypts nothing.`)
	fs.StringVar(&o.builtInExclude, "auto-migrate-builtins-exclude", strings.Join(controllers.DefaultBuiltInExclude, ","), `Comma-separated resource.group patterns (shell-style, "events" for the core group's, "*.example.io") of built-in resources that --auto-migrate-builtins leaves alone; empty leaves none alone.`)
}

// The manager's exit codes.
const (
	// exitError: anything else went wrong, such as an API server that
	// refuses the manager's credentials (401) or its permission (403).
	exitError = 1
	// exitUsage: a flag, or its value, is wrong. Go's flag package exits
	// with 2 for a bad flag, as does kubebuilder's scaffold, which parses
	// with it.
	exitUsage = 2
)

func main() {
	os.Exit(execute(os.Args[1:], os.Stdout, os.Stderr))
}

// execute runs the manager with args and returns its exit code. An error
// is one line on stderr: before the logger starts, so no log line comes
// first.
func execute(args []string, stdout, stderr io.Writer) int {
	err := run(args, stdout)
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "error:", strings.ReplaceAll(err.Error(), "\n", "; "))
	if usage := (*usageError)(nil); errors.As(err, &usage) {
		return exitUsage
	}
	return exitError
}

// loadConfig reads the kubeconfig file named by --kubeconfig, or finds one
// the usual way: $KUBECONFIG, in-cluster, ~/.kube/config.
func loadConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		cfg, err := ctrl.GetConfig()
		if err != nil {
			return nil, fmt.Errorf("loading kubeconfig: %w", err)
		}
		return cfg, nil
	}
	if _, err := os.Stat(kubeconfig); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, usagef("--kubeconfig %q: no such file", kubeconfig)
		}
		return nil, usagef("--kubeconfig %q: %v", kubeconfig, err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, usagef("--kubeconfig %q is not a usable kubeconfig: %v", kubeconfig, err)
	}
	return cfg, nil
}

// accessTimeout bounds checkAccess's one request.
const accessTimeout = 15 * time.Second

// checkAccess lists one CRD, as the manager must be able to, so that
// credentials the API server refuses (401) or a user without restow's RBAC
// (403) end the manager at once with a line that says so, instead of
// leader election and the caches retrying for ever. Any other failure (the
// API server is down or restarting) is left to the manager's retries.
func checkAccess(cfg *rest.Config) error {
	ctx, cancel := context.WithTimeout(context.Background(), accessTimeout)
	defer cancel()
	mc, err := metadata.NewForConfig(cfg)
	if err != nil {
		return err
	}
	crds := apiextensionsv1.SchemeGroupVersion.WithResource("customresourcedefinitions")
	_, err = mc.Resource(crds).List(ctx, metav1.ListOptions{Limit: 1})
	switch {
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("the API server at %s refused the manager's credentials (401 Unauthorized): check --kubeconfig, or the service account token of the pod", cfg.Host)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("the API server does not let the manager list customresourcedefinitions (403 Forbidden: %s): it needs restow's RBAC (config/rbac), or a --kubeconfig whose user has it", apiMessage(err))
	}
	return nil
}

// apiMessage is the message of an API error, without Go's wrapping.
func apiMessage(err error) string {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return status.Status().Message
	}
	return err.Error()
}

func run(args []string, stdout io.Writer) error {
	opts, err := parse(args, stdout)
	if err != nil || opts == nil {
		return err
	}
	if opts.printVersion {
		fmt.Fprintln(stdout, "restow manager", version.Get())
		return nil
	}
	selector, err := opts.validate()
	if err != nil {
		return err
	}
	// validate parsed it already.
	apiServers, _ := migrator.ParseAPIServerAddresses(opts.apiServers)
	cfg, err := loadConfig(opts.kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = float32(opts.qps), opts.burst
	if err := checkAccess(cfg); err != nil {
		return err
	}
	log, err := logging.Setup(opts.logging)
	if err != nil {
		return &usageError{err}
	}
	ctrl.SetLogger(log)

	scheme, err := restowscheme.New()
	if err != nil {
		return err
	}

	mgr, err := newManager(cfg, scheme, opts)
	if err != nil {
		return err
	}
	ctx := ctrl.SetupSignalHandler()
	controllerOpts := opts.controllerOptions(selector, apiServers)
	if controllerOpts.Space, err = opts.etcd.space(); err != nil {
		return err
	}
	if err = controllers.Setup(ctx, mgr, controllerOpts); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return err
	}
	log.Info("Starting manager", "version", version.Get().Version, "migrates", opts.whatItDoes(), "etcdSpace", opts.etcd.etcdSource())
	return mgr.Start(ctx)
}

// newManager makes the controller-runtime manager: metrics (HTTPS with
// authentication and authorization unless --metrics-secure=false; HTTP/1.1
// unless --enable-http2), probes, pprof and leader election as the flags
// say.
func newManager(cfg *rest.Config, scheme *runtime.Scheme, opts *options) (ctrl.Manager, error) {
	var tlsOpts []func(*tls.Config)
	if !opts.enableHTTP2 {
		tlsOpts = append(tlsOpts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
	}
	metricsOpts := metricsserver.Options{BindAddress: opts.metricsAddr, SecureServing: opts.secureMetrics, TLSOpts: tlsOpts}
	if opts.secureMetrics {
		metricsOpts.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        scheme,
		Metrics:                       metricsOpts,
		HealthProbeBindAddress:        opts.probeAddr,
		PprofBindAddress:              opts.pprofAddr,
		LeaderElection:                opts.leaderElect,
		LeaderElectionID:              "restow.migration.restow.dev",
		LeaderElectionNamespace:       opts.leaderElectNamespace,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &opts.leaseDuration,
		RenewDeadline:                 &opts.renewDeadline,
		RetryPeriod:                   &opts.retryPeriod,
	})
	if err != nil {
		return nil, fmt.Errorf("creating the manager: %w", err)
	}
	return mgr, nil
}

// controllerOptions are the controllers' options from the flags.
func (o *options) controllerOptions(selector labels.Selector, apiServers []string) controllers.Options {
	return controllers.Options{
		Concurrency:             o.concurrency,
		MaxPasses:               o.maxPasses,
		MaxBuiltInPasses:        o.maxBuiltInPasses,
		PageSize:                o.pageSize,
		StatusInterval:          o.statusInterval,
		SettleWindow:            o.settleWindow,
		LagBound:                o.lagBound,
		AssumeSeveral:           o.assumeSeveral,
		APIServerAddresses:      apiServers,
		LagLimit:                o.lagLimit,
		StalledRetryBase:        o.stalledRetryBase,
		StalledRetryMax:         o.stalledRetryMax,
		AutoMigrate:             o.autoMigrate,
		DeferToStandard:         o.deferToStandard,
		ServeStandard:           o.serveStandard,
		AutoMigrateSelector:     selector,
		AutoMigrateBuiltIns:     o.autoMigrateBuiltIns,
		BuiltInInterval:         o.builtInInterval,
		EncryptionCheckInterval: o.encryptionCheck,
		BuiltInExclude:          splitList(o.builtInExclude),
		ReEncrypt:               reEncryptResources(o.reEncrypt),
	}
}
