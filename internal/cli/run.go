package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/cli-runtime/pkg/printers"

	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/storedversions"
)

// resolveInterval is how often run looks again while the API server has not
// switched to the storage version yet.
const resolveInterval = 250 * time.Millisecond

type runOptions struct {
	dryRun       bool
	prune        bool
	viaStatus    bool
	concurrency  int
	pageSize     int64
	settleWindow time.Duration
	lagBound     time.Duration
	lagLimit     time.Duration
	apiServers   string
	several      bool
	timeout      time.Duration
	namespace    string
	// expectStorage, when set, is the storage version the caller made the
	// live one: a pass that resolves another (it moved back meanwhile)
	// does not start.
	expectStorage string
	// space says how the pass learns etcd's room.
	space spaceFlags
	// setUp says that the caller set the migrator up with these options
	// once, for several passes side by side (prepare): see setUpMigrator.
	setUp bool
}

// setUpMigrator sets the process's migrator up for passes with o: the API
// servers' lag and how etcd's room is read. These are the migrator's own,
// shared by its passes, so they are set once before any pass starts; the
// returned function closes the etcd client, if any.
func (o runOptions) setUpMigrator(m *migrator.Migrator) (closeEtcd func(), err error) {
	m.LagBound, m.AssumeSeveral, m.LagLimit = o.lagBound, o.several, o.lagLimit
	// validate parsed it already.
	m.APIServerAddresses, _ = migrator.ParseAPIServerAddresses(o.apiServers)
	return o.space.apply(m)
}

func newRunCommand(f *factory, streams genericiooptions.IOStreams) *cobra.Command {
	opts := runOptions{}
	allNamespaces := false
	cmd := &cobra.Command{
		Use:   "run RESOURCE|CRD",
		Short: "Run one migration pass in-process, without the operator",
		Long: `run rewrites every object of the resource so the API server stores it at the
CRD's storage version, with the operator's own engine, then prunes the CRD's
status.storedVersions. Before it prunes it waits out the settle window
(--settle-window, counted from when every API server stores at the new
version), so that writes that began on the old storage have ended, and
rewrites again what others wrote meanwhile. On a control plane of several API
servers (or an unknown number) it first reads each server's own discovery at
its address, since each switches when its own informer sees the CRD update,
and starts once every one shows the switch; it waits --apiserver-lag-bound
after the switch only for a server it cannot reach or verify, and stops
(APIServerLagging) if one it reaches still stores at the old version after
--apiserver-lag-limit. It needs no operator: use it in CI
jobs, Helm hooks and Argo CD PostSync hooks. With -n/--namespace it rewrites
the objects of one namespace and never prunes: the other namespaces are not
proven. It exits 2, nothing pruned, if the resource cannot be migrated as
asked, objects could not be rewritten (they are listed), an API server still
stores at the old version after --apiserver-lag-limit (APIServerLagging), or
etcd's space stopped the pass (EtcdQuota, EtcdNotCompacting, EtcdAlarm); 3 on
--timeout; 1 on an error.`,
		Example: `  kubectl restow run crontabs.stable.example.com
  kubectl restow run crontabs --dry-run
  kubectl restow run crontabs -n team-a`,
		Args: oneResource,
		RunE: func(cmd *cobra.Command, args []string) error {
			err := opts.validate()
			if err != nil {
				return err
			}
			if opts.namespace, err = f.namespace(allNamespaces); err != nil {
				return err
			}
			c, err := f.clients(cmd.Context())
			if err != nil {
				return err
			}
			return untilTimeout(cmd.Context(), opts.timeout, func(ctx context.Context) error {
				return run(ctx, c, streams, args[0], opts)
			})
		},
	}
	cmd.Flags().BoolVar(&opts.dryRun, "dry-run", false, "List and count the objects, write nothing.")
	cmd.Flags().BoolVar(&opts.prune, "prune-stored-versions", true, "After a pass without failures, trim the CRD's status.storedVersions to the storage version.")
	cmd.Flags().BoolVar(&opts.viaStatus, "via-status", false, "Rewrite through the /status subresource (steps around admission on the main resource).")
	cmd.Flags().IntVar(&opts.concurrency, "concurrency", migrator.DefaultConcurrency, "Most objects rewritten in parallel; the pass paces itself below it.")
	cmd.Flags().Int64Var(&opts.pageSize, "page-size", migrator.DefaultPageSize, "Objects listed per page.")
	cmd.Flags().DurationVar(&opts.settleWindow, "settle-window", migrator.DefaultSettleWindow, "How long after the storage switch writes that began on the old storage may still commit: at least twice the API server's --request-timeout.")
	cmd.Flags().DurationVar(&opts.lagBound, "apiserver-lag-bound", migrator.DefaultLagBound, "How long any API server may take to see a CRD update after another: with several API servers the pass reads each one's discovery at its own address and starts once all show the switch; for a server it cannot reach or verify, it waits this long after the switch before its first page.")
	cmd.Flags().DurationVar(&opts.lagLimit, "apiserver-lag-limit", migrator.DefaultLagLimit, "How long after the switch the pass waits at most for an API server it reaches that still stores at the old version; then it stops, with nothing rewritten or pruned. At least --apiserver-lag-bound.")
	cmd.Flags().StringVar(&opts.apiServers, "apiservers", "", "Comma-separated host:port of API servers besides those in default/kubernetes's EndpointSlices: each counts as one, and the pass reads its discovery there (certificate verified as kubernetes.default.svc).")
	cmd.Flags().BoolVar(&opts.several, "assume-several-apiservers", false, "Wait for --apiserver-lag-bound without counting the API servers (for API servers that share a host name and publish no address of their own in default/kubernetes's endpoints).")
	cmd.Flags().DurationVar(&opts.timeout, "timeout", 0, "Give up after this long (0: no limit).")
	opts.space.add(cmd.Flags())
	addAllNamespacesFlag(cmd, &allNamespaces)
	return cmd
}

// validate checks the flags, before any request.
func (o runOptions) validate() error {
	for _, err := range []error{
		between("concurrency", int64(o.concurrency), 1, maxConcurrency),
		between("page-size", o.pageSize, 1, maxPageSize),
		positive("settle-window", o.settleWindow),
		positive("apiserver-lag-bound", o.lagBound),
		atLeast("apiserver-lag-limit", o.lagLimit, "apiserver-lag-bound", o.lagBound),
		apiServerList(o.apiServers),
		zeroOrPositive("timeout", o.timeout),
		o.space.validate(),
	} {
		if err != nil {
			return err
		}
	}
	return nil
}

func run(ctx context.Context, c *clients, streams genericiooptions.IOStreams, arg string, opts runOptions) error {
	if !opts.setUp {
		closeEtcd, err := opts.setUpMigrator(c.migrator)
		if err != nil {
			return err
		}
		defer closeEtcd()
	}
	gr, target, err := runTarget(ctx, c, streams, arg, opts)
	if err != nil {
		return err
	}
	version := target.TargetVersion()
	if opts.dryRun {
		return dryRun(ctx, c, streams, gr, target, opts)
	}
	total, err := c.migrator.Count(ctx, target)
	if err != nil {
		total = -1
	}
	if target.LagWait > time.Second {
		fmt.Fprintln(streams.ErrOut, migrator.LagMessage(target, time.Now().Add(target.LagWait))+".")
	}
	bar := newProgress(streams.Out, fmt.Sprintf("Rewriting %s%s to %s", gr, inNamespace(target), version), total)
	start := time.Now()
	result, err := c.migrator.Migrate(ctx, target, migrator.Options{
		Concurrency:  opts.concurrency,
		PageSize:     opts.pageSize,
		ViaStatus:    opts.viaStatus,
		SettleWindow: opts.settleWindow,
		Prune:        opts.prune,
	}, runObserver(streams, bar, opts.prune && !target.Partial()))
	var stalledErr *migrator.StalledError
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, storedversions.ErrCRDChanged):
		return fmt.Errorf("CRD %s changed during the pass, so status.storedVersions was not pruned: run again", target.CRD.Name)
	case errors.As(err, &stalledErr):
		msg := stalledErr.Message
		if !strings.Contains(msg, "nothing was rewritten or pruned") {
			msg += "; nothing was pruned"
		}
		return &exitError{code: ExitPending, err: fmt.Errorf("%s: %s", stalledErr.Why(), msg)}
	default:
		return fmt.Errorf("the pass stopped: %s", migrator.Message(err))
	}
	bar.set(result.Done(), result.Listed)
	bar.finish()
	if s := c.migrator.SpaceStats(); s.Waits > 0 {
		fmt.Fprintf(streams.ErrOut, "etcd's room: the pass waited %d times for a compaction past its rewrites, and saw %d (%d readings of %s).\n", s.Waits, s.Compactions, s.Readings, s.Last.Source)
	}
	return report(streams, gr, target, result, time.Since(start))
}

// runTarget resolves the resource arg names, once the API server serves
// its storage version, and scopes it to --namespace.
func runTarget(ctx context.Context, c *clients, streams genericiooptions.IOStreams, arg string, opts runOptions) (schema.GroupResource, migrator.Target, error) {
	gr, err := c.resolveResource(arg)
	if err != nil {
		return gr, migrator.Target{}, err
	}
	target, err := resolveWhenServed(ctx, c, streams, gr)
	if err != nil {
		return gr, target, err
	}
	version := target.TargetVersion()
	if opts.expectStorage != "" && version != opts.expectStorage {
		return gr, target, fmt.Errorf("%s is stored at %s, not %s as this run set it: no pass was made", gr, version, opts.expectStorage)
	}
	if opts.namespace != "" {
		if !target.Namespaced {
			return gr, target, fmt.Errorf("%s is cluster-scoped: --namespace does not apply", gr)
		}
		target.Namespace = opts.namespace
		if target.CRD != nil && !slices.Equal(target.CRD.StoredVersions, []string{version}) {
			fmt.Fprintf(streams.ErrOut, "Only namespace %s: status.storedVersions of CRD %s will not be pruned, since objects in other namespaces are not proven. Run without --namespace to prune.\n", opts.namespace, target.CRD.Name)
		}
	}
	c.warnStandardActive(ctx, streams.ErrOut, gr)
	return gr, target, nil
}

// dryRun counts what a pass would rewrite, and what it would prune.
func dryRun(ctx context.Context, c *clients, streams genericiooptions.IOStreams, gr schema.GroupResource, target migrator.Target, opts runOptions) error {
	version := target.TargetVersion()
	n, err := c.migrator.CountAll(ctx, target, opts.pageSize)
	if err != nil {
		return fmt.Errorf("listing %s: %w", gr, err)
	}
	fmt.Fprintf(streams.Out, "Dry run: a pass would rewrite %d objects of %s%s so they are stored at %s.\n", n, gr, inNamespace(target), version)
	printSpace(ctx, streams.Out, c.migrator, target, n)
	if crd := target.CRD; crd != nil && opts.prune && !target.Partial() && !slices.Equal(crd.StoredVersions, []string{version}) {
		fmt.Fprintf(streams.Out, "Then status.storedVersions of CRD %s would go from %v to [%s].\n", crd.Name, crd.StoredVersions, version)
	}
	return nil
}

// runObserver shows a pass's progress on bar, what each API server shows
// while the pass waits for them, and the settle window when the pass will
// prune (prunes).
func runObserver(streams genericiooptions.IOStreams, bar *progress, prunes bool) migrator.Observer {
	// The observer runs on the pass's goroutines: one at a time here.
	var mu sync.Mutex
	var phase migrator.Phase
	var switching, space string
	return func(p migrator.Progress) {
		mu.Lock()
		defer mu.Unlock()
		if p.Switching != switching {
			switching = p.Switching
			if switching != "" {
				fmt.Fprintln(streams.ErrOut, switching+".")
			}
		}
		if p.WaitingForSpace != space {
			if space = p.WaitingForSpace; space != "" {
				fmt.Fprintln(streams.ErrOut, space+".")
			}
		}
		if p.Phase == migrator.PhaseRewriting {
			estimate := int64(-1)
			if p.RemainingEstimate != nil {
				estimate = p.Listed + *p.RemainingEstimate
			}
			bar.set(p.Done(), estimate)
			return
		}
		if p.Phase != phase && p.Phase == migrator.PhaseSettling && prunes {
			bar.set(p.Done(), p.Listed)
			bar.finish()
			fmt.Fprintf(streams.ErrOut, "Settling: waiting until %s for writes that began on the old storage, then re-checking what others wrote meanwhile.\n", p.SettleUntil.Format(time.TimeOnly))
		}
		phase = p.Phase
	}
}

// report says what a pass did: its counts, the objects it could not
// rewrite (then it exits ExitPending), what it pruned.
func report(streams genericiooptions.IOStreams, gr schema.GroupResource, target migrator.Target, result migrator.Result, took time.Duration) error {
	fmt.Fprintf(streams.Out, "%d objects in %s: %d re-encoded, %d already stored, %d changed by others meanwhile, %d rewritten again after the settle window, %d failed.\n",
		result.Listed, took.Round(time.Millisecond), result.Migrated, result.AlreadyStored, result.Skipped, result.Rechecked, result.Failed)
	if result.Failed > 0 {
		w := printers.GetNewTabWriter(streams.Out)
		fmt.Fprintln(w, "NAMESPACE\tNAME\tREASON\tMESSAGE")
		for _, f := range result.Failures {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", orDash(f.Namespace), f.Name, f.Reason, f.Message)
		}
		if err := w.Flush(); err != nil {
			return err
		}
		return &exitError{code: ExitPending, err: fmt.Errorf("%d objects of %s could not be rewritten to %s (the first %d are listed); nothing was pruned", result.Failed, gr, target.TargetVersion(), len(result.Failures))}
	}
	if len(result.Pruned) > 0 {
		fmt.Fprintf(streams.Out, "Removed %v from status.storedVersions of CRD %s.\n", result.Pruned, target.CRD.Name)
	}
	return nil
}

// resolveWhenServed resolves the resource, waiting while the API server has
// not switched to the CRD's storage version yet.
func resolveWhenServed(ctx context.Context, c *clients, streams genericiooptions.IOStreams, gr schema.GroupResource) (migrator.Target, error) {
	var target migrator.Target
	told := false
	err := wait.PollUntilContextCancel(ctx, resolveInterval, true, func(ctx context.Context) (bool, error) {
		var err error
		target, err = c.migrator.Resolve(ctx, gr)
		var waitErr *migrator.WaitError
		var stalledErr *migrator.StalledError
		switch {
		case errors.As(err, &waitErr):
			if !told {
				fmt.Fprintf(streams.ErrOut, "Waiting: %s\n", waitErr.Message)
				told = true
			}
			return false, nil
		case errors.As(err, &stalledErr):
			return false, &exitError{code: ExitPending, err: fmt.Errorf("%s: %s", stalledErr.Why(), stalledErr.Message)}
		}
		return err == nil, err
	})
	// The engine calls any failed read of the CRD transient, for the
	// operator to retry; a refusal does not pass by waiting, so say it as
	// the API server did.
	if status := apierrors.APIStatus(nil); apierrors.IsForbidden(err) && errors.As(err, &status) {
		return target, errors.New(status.Status().Message)
	}
	return target, err
}

// inNamespace says which namespace a limited target covers.
func inNamespace(target migrator.Target) string {
	if target.Partial() {
		return " in namespace " + target.Namespace
	}
	return ""
}
