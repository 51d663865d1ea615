// Package cli is kubectl-restow, the kubectl plugin: plan, migrate, run and
// status. It takes kubectl's connection flags from cli-runtime and runs
// passes with the operator's own engine (internal/migrator).
package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/discovery"
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
	fmt.Fprintln(streams.ErrOut, "error:", err)
	if exit := (*exitError)(nil); errors.As(err, &exit) {
		return exit.code
	}
	return 1
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
	root.AddCommand(
		newPlanCommand(f, streams),
		newMigrateCommand(f, streams),
		newRunCommand(f, streams),
		newStatusCommand(f, streams),
		newVersionCommand(streams),
	)
	root.Version = version.Get().String()
	root.SetVersionTemplate("kubectl-restow {{.Version}}\n")
	return root
}

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

func (f *factory) clients() (*clients, error) {
	cfg, err := f.flags.ToRESTConfig()
	if err != nil {
		return nil, err
	}
	// A pass sends a request per object; kubectl's 5 per second would make
	// it crawl, and 200 held the manager to 0.38x of the API server's pace
	// (docs/benchmarks.md, Tuning). As the manager's: a safety net only;
	// the API server's priority and fairness does the throttling.
	cfg.QPS, cfg.Burst = 1000, 2000
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
	return &clients{
		client:  c,
		watcher: watcher,
		mapper:  mapper,
		migrator: &migrator.Migrator{
			Client: c, Reader: c, Metadata: meta, Objects: objects, Discovery: disco, Mapper: mapper, Throttle: throttle,
		},
	}, nil
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

// errNotInstalled: the cluster has no StorageMigration API.
var errNotInstalled = errors.New("the cluster has no StorageMigration API: install restow (kubectl apply -k config/default), or use `kubectl restow run`, which needs no operator")

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
