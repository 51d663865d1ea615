// Package cli is kubectl-restow, the kubectl plugin: plan, migrate, run and
// status. It takes kubectl's connection flags from cli-runtime and runs
// passes with the operator's own engine (internal/migrator).
package cli

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/migrator"
	restowscheme "github.com/restow/restow/internal/scheme"
	"github.com/restow/restow/internal/version"
)

// Exit codes, beyond 0 for success and 1 for an error.
const (
	// ExitPending: plan --fail-if-pending found CRDs to migrate; migrate
	// --wait or run ended Stalled or with objects that could not be rewritten.
	ExitPending = 2
	// ExitTimeout: migrate --wait or run reached --timeout.
	ExitTimeout = 3
	// ExitNoOperator: migrate --wait saw no restow operator answer within
	// --operator-timeout.
	ExitNoOperator = 4
)

// exitError ends the command with code, printing err.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// Execute runs kubectl-restow with args and returns the process's exit code.
func Execute(ctx context.Context, args []string, streams genericiooptions.IOStreams) int {
	cmd := NewCommand(streams)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintln(streams.ErrOut, "error:", oneLine(err.Error()))
	if exit := (*exitError)(nil); errors.As(err, &exit) {
		return exit.code
	}
	return 1
}

// oneLine puts a message on one line: a wrapped or joined error, or a
// condition's message, may hold line breaks.
func oneLine(s string) string {
	return strings.ReplaceAll(strings.TrimSpace(s), "\n", "; ")
}

// NewCommand builds the kubectl-restow command tree.
func NewCommand(streams genericiooptions.IOStreams) *cobra.Command {
	f := &factory{flags: genericclioptions.NewConfigFlags(true)}
	root := &cobra.Command{
		Use:   "kubectl-restow",
		Short: "Re-store custom resources at their CRD's storage version",
		Long: `kubectl restow shows which CRDs still have objects stored at an old version,
and migrates them: through the restow operator (migrate) or in-process (run).`,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl restow"},
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	f.flags.AddFlags(root.PersistentFlags())
	root.SetFlagErrorFunc(flagError)
	root.AddCommand(
		newPlanCommand(f, streams),
		newMigrateCommand(f, streams),
		newRunCommand(f, streams),
		newStatusCommand(f, streams),
		newVerifyCommand(f, streams),
		newPreflightCommand(f, streams),
		newPrepareCommand(f, streams),
		newVersionCommand(streams),
	)
	root.Version = version.Get().String()
	root.SetVersionTemplate("kubectl-restow {{.Version}}\n")
	return root
}

// wrapTransport, when set, wraps the transport of every client clients
// makes: the tests record every request a command sends.
var wrapTransport func(http.RoundTripper) http.RoundTripper

// fieldManager names the plugin in managedFields.
const fieldManager = "kubectl-restow"

// factory builds clients from kubectl's flags.
type factory struct {
	flags *genericclioptions.ConfigFlags
}

// namespace is the namespace the command is limited to: "" for every
// namespace. Only an explicit -n/--namespace limits it: a migration is about
// a resource, so the kubeconfig context's namespace does not apply, and
// --all-namespaces says the default out loud.
func (f *factory) namespace(allNamespaces bool) (string, error) {
	ns := ""
	if f.flags.Namespace != nil {
		ns = *f.flags.Namespace
	}
	if ns != "" && allNamespaces {
		return "", errors.New("--namespace and --all-namespaces cannot be used together")
	}
	return ns, nil
}

func addAllNamespacesFlag(cmd *cobra.Command, all *bool) {
	cmd.Flags().BoolVarP(all, "all-namespaces", "A", false, "Cover every namespace (the default unless -n/--namespace is given).")
}

// clients reach one cluster: an uncached client for restow's and
// apiextensions' types, one that also watches, and the migrator the operator
// uses.
type clients struct {
	client   client.Client
	watcher  client.WithWatch
	mapper   meta.RESTMapper
	migrator *migrator.Migrator
}

// clients checks kubectl's connection flags, connects and asks the API
// server for its version: a kubeconfig it refuses (401) or an API server
// it cannot reach ends the command there, in one line, before discovery
// would log the same error again.
func (f *factory) clients(ctx context.Context) (*clients, error) {
	if err := f.validate(); err != nil {
		return nil, err
	}
	cfg, err := f.flags.ToRESTConfig()
	if err != nil {
		return nil, err
	}
	// A pass sends a request per object; kubectl's 5 per second would make
	// it crawl, and 200 held the manager to 0.38x of the API server's pace
	// (docs/benchmarks.md, Tuning). As the manager's: a safety net only;
	// the API server's priority and fairness does the throttling.
	cfg.QPS, cfg.Burst = 1000, 2000
	if wrapTransport != nil {
		cfg.Wrap(wrapTransport)
	}
	mapper, err := f.flags.ToRESTMapper()
	if err != nil {
		return nil, err
	}
	scheme, err := restowscheme.New()
	if err != nil {
		return nil, err
	}
	watcher, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme, Mapper: mapper})
	if err != nil {
		return nil, err
	}
	c := client.WithFieldOwner(watcher, fieldManager)
	meta, objects, throttle, err := migrator.ThrottledClients(cfg)
	if err != nil {
		return nil, err
	}
	// The readiness gate needs discovery as the API server sees it now.
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	if err := reachable(ctx, disco, cfg.Host); err != nil {
		return nil, err
	}
	return &clients{
		client:  c,
		watcher: watcher,
		mapper:  mapper,
		migrator: &migrator.Migrator{
			Client: c, Reader: c, Metadata: meta, Objects: objects, Discovery: disco, Mapper: mapper, Throttle: throttle, Config: cfg,
		},
	}, nil
}

// validate checks the kubectl flags that the client libraries would take
// without a word (a negative --request-timeout) or report without the
// flag's name (a --kubeconfig file that does not exist).
func (f *factory) validate() error {
	if path := ptr.Deref(f.flags.KubeConfig, ""); path != "" {
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("--kubeconfig %q: no such file", path)
		} else if err != nil {
			return fmt.Errorf("--kubeconfig %q: %w", path, err)
		}
	}
	if timeout := ptr.Deref(f.flags.Timeout, ""); timeout != "" {
		d, err := clientcmd.ParseTimeout(timeout)
		switch {
		case err != nil:
			return fmt.Errorf("--request-timeout %q is not a duration: a whole number of seconds, or %s", timeout, durationForm)
		case d < 0:
			return fmt.Errorf("--request-timeout must be 0 (no limit) or positive, got %s", timeout)
		}
	}
	return nil
}

// reachable asks the API server for its version, which every client may
// read: it fails only for credentials the API server refuses or an API
// server that does not answer. Other refusals are left to the requests
// that follow, which say what was refused.
func reachable(ctx context.Context, disco discovery.DiscoveryInterface, host string) error {
	err := disco.RESTClient().Get().AbsPath("/version").Do(ctx).Error()
	var status apierrors.APIStatus
	switch {
	case err == nil, ctx.Err() != nil:
		return ctx.Err()
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("the API server at %s refused the kubeconfig's credentials (401 Unauthorized): check --kubeconfig, --context and --user", host)
	case errors.As(err, &status):
		return nil
	}
	return fmt.Errorf("cannot reach the API server at %s: %w", host, err)
}

// durationForm says what a duration looks like.
const durationForm = "a number with a unit, such as 30s, 5m or 1h30m"

// flagError says in one line which flag's value could not be parsed, and
// what the flag takes.
func flagError(_ *cobra.Command, err error) error {
	var invalid *pflag.InvalidValueError
	if !errors.As(err, &invalid) {
		return err
	}
	var takes string
	switch invalid.GetFlag().Value.Type() {
	case "duration":
		takes = "a duration: " + durationForm
	case "int", "int32", "int64":
		takes = "a whole number"
	case "float32", "float64":
		takes = "a number"
	case "bool":
		takes = "true or false"
	case "quantity":
		takes = "a size, such as 2Gi or 512Mi"
	default:
		return err
	}
	return fmt.Errorf("--%s %q is not %s", invalid.GetFlag().Name, invalid.GetValue(), takes)
}

// Bounds of run's flags, as the operator's: those of a StorageMigration's
// spec.concurrency and spec.pageSize.
const (
	maxConcurrency = 1024
	maxPageSize    = 10000
)

// between checks an integer flag's value.
func between(name string, v, least, most int64) error {
	if v < least || v > most {
		return fmt.Errorf("--%s must be between %d and %d, got %d", name, least, most, v)
	}
	return nil
}

// positive checks a duration flag that must be above zero.
func positive(name string, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("--%s must be a positive duration, got %s", name, d)
	}
	return nil
}

// atLeast checks a duration flag that must not be below another's value.
func atLeast(name string, d time.Duration, other string, least time.Duration) error {
	if d < least {
		return fmt.Errorf("--%s must be at least --%s (%s), got %s", name, other, least, d)
	}
	return nil
}

// apiServerList checks --apiservers.
func apiServerList(list string) error {
	if _, err := migrator.ParseAPIServerAddresses(list); err != nil {
		return fmt.Errorf("--apiservers: %w", err)
	}
	return nil
}

// zeroOrPositive checks a duration flag whose 0 means no limit.
func zeroOrPositive(name string, d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("--%s must be 0 (no limit) or positive, got %s", name, d)
	}
	return nil
}

// oneResource is the argument check of migrate and run.
func oneResource(cmd *cobra.Command, args []string) error {
	switch {
	case len(args) != 1:
		return fmt.Errorf("%s takes one RESOURCE|CRD argument, got %d", cmd.Name(), len(args))
	case strings.TrimSpace(args[0]) == "":
		return errors.New("RESOURCE|CRD is empty: name a resource, such as crontabs, or a CRD, such as crontabs.stable.example.com")
	}
	return nil
}

// resolveResource turns a command-line argument into a group and resource:
// a CRD name or resource.group ("crontabs.stable.example.com"), a resource
// ("crontabs", "configmaps"), a singular or a short name ("ct").
func (c *clients) resolveResource(arg string) (schema.GroupResource, error) {
	if gvr, _ := schema.ParseResourceArg(arg); gvr != nil {
		if full, err := c.mapper.ResourceFor(*gvr); err == nil {
			return full.GroupResource(), nil
		}
	}
	full, err := c.mapper.ResourceFor(schema.ParseGroupResource(arg).WithVersion(""))
	switch {
	case meta.IsNoMatchError(err):
		return schema.GroupResource{}, fmt.Errorf("the server doesn't have a resource %q", arg)
	case err != nil:
		return schema.GroupResource{}, err
	}
	return full.GroupResource(), nil
}

// migrationsFor lists the StorageMigrations whose resource is gr.
func (c *clients) migrationsFor(ctx context.Context, gr schema.GroupResource) ([]migrationv1alpha1.StorageMigration, error) {
	all, err := c.storageMigrations(ctx)
	if err != nil {
		return nil, err
	}
	var covering []migrationv1alpha1.StorageMigration
	for _, sm := range all {
		if sm.Spec.Resource.Group == gr.Group && sm.Spec.Resource.Resource == gr.Resource {
			covering = append(covering, sm)
		}
	}
	return covering, nil
}

// withTimeout bounds ctx by timeout, if it is positive.
func withTimeout(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if timeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, timeout)
}

// untilTimeout runs fn within timeout (0: no limit) and ends the command
// with ExitTimeout when the timeout passed first.
func untilTimeout(ctx context.Context, timeout time.Duration, fn func(context.Context) error) error {
	ctx, cancel := withTimeout(ctx, timeout)
	defer cancel()
	err := fn(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		return &exitError{code: ExitTimeout, err: err}
	}
	return err
}

// errNotInstalled: the cluster has no StorageMigration API.
var errNotInstalled = errors.New("the cluster has no StorageMigration API: install restow (its install.yaml or Helm chart: https://github.com/restow/restow/blob/main/docs/install.md), or use `kubectl restow run`, which needs no operator")

func (c *clients) storageMigrations(ctx context.Context) ([]migrationv1alpha1.StorageMigration, error) {
	var list migrationv1alpha1.StorageMigrationList
	if err := c.client.List(ctx, &list); err != nil {
		if meta.IsNoMatchError(err) {
			return nil, errNotInstalled
		}
		return nil, err
	}
	return list.Items, nil
}
