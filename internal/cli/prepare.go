package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/preflight"
)

type prepareOptions struct {
	manifestFlags
	// migrateOptions hold --timeout and --operator-timeout, as migrate's.
	migrateOptions
	dryRun       bool
	inProcess    bool
	settleWindow time.Duration
}

func newPrepareCommand(f *factory, streams genericiooptions.IOStreams) *cobra.Command {
	opts := prepareOptions{}
	cmd := &cobra.Command{
		Use:   "prepare -f FILE|DIR|- [-f ...] | --keep CRD=VERSION[,VERSION...]",
		Short: "Migrate what a CRD upgrade needs migrated, so that the API server accepts it",
		Long: fmt.Sprintf(`prepare judges the manifests as preflight does, and for every CRD that needs
prepare (the manifest drops versions status.storedVersions lists, and keeps
the live storage version) migrates every object to the live storage version
and prunes status.storedVersions to it, with the same proof, settle window
and rules for several API servers as any migration. It writes no CRD spec:
apply the release after it.

Where restow's StorageMigration API is installed (the operator), prepare
hands each migration to it (a StorageMigration, or a new pass of the one
there is) and follows it, so that one resource never has two migrations at
once; elsewhere, or with --in-process, it migrates in this process as
kubectl restow run does. A CRD that is blocked (the manifest drops the live
storage version too) is left as it is.

It exits 0 when every CRD then applies, %d when one is blocked, %d when a
migration left objects it could not rewrite, %d on --timeout, 1 on an error.`, ExitBlocked, ExitPending, ExitTimeout),
		Example: `  helm template my-release my-chart --include-crds | kubectl restow prepare -f -
  kubectl restow prepare -f config/crd/ -R --dry-run`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("prepare takes no arguments, got %q: give manifests with -f, or versions with --keep", args)
			}
			if err := opts.validate(); err != nil {
				return err
			}
			if err := positive("settle-window", opts.settleWindow); err != nil {
				return err
			}
			manifests, err := opts.manifests(streams.In)
			if err != nil {
				return err
			}
			c, err := f.clients(cmd.Context())
			if err != nil {
				return err
			}
			return untilTimeout(cmd.Context(), opts.timeout, func(ctx context.Context) error {
				return prepare(ctx, c, streams, manifests, opts)
			})
		},
	}
	opts.add(cmd)
	cmd.Flags().BoolVar(&opts.dryRun, "dry-run", false, "Say what prepare would migrate, and change nothing.")
	cmd.Flags().BoolVar(&opts.inProcess, "in-process", false, "Migrate in this process even where restow's StorageMigration API is installed: make sure no restow operator runs.")
	cmd.Flags().DurationVar(&opts.settleWindow, "settle-window", migrator.DefaultSettleWindow, "In this process: how long after the storage switch writes that began on the old storage may still commit, before the prune.")
	cmd.Flags().DurationVar(&opts.timeout, "timeout", defaultWaitTimeout, "Give up after this long (0: no limit).")
	cmd.Flags().DurationVar(&opts.operatorTimeout, "operator-timeout", defaultOperatorTimeout, "Where the operator migrates: how long to wait for it to answer before concluding that none is running.")
	return cmd
}

// prepare migrates every CRD of manifests that needs it, one at a time,
// and judges each again after: the apply passes only once the API server's
// dry run accepts it.
func prepare(ctx context.Context, c *clients, streams genericiooptions.IOStreams, manifests []preflight.Manifest, opts prepareOptions) error {
	_, err := c.storageMigrations(ctx)
	viaOperator := err == nil && !opts.inProcess
	if err != nil && !errors.Is(err, errNotInstalled) {
		return err
	}
	blocked := false
	for _, m := range manifests {
		v, err := c.preflightOne(ctx, m)
		if err != nil {
			return err
		}
		switch {
		case v.State == preflight.Blocked:
			blocked = true
			fmt.Fprintf(streams.Out, "%s: blocked, left as it is: %s\n", v.CRD, v.Reason)
			continue
		case v.State != preflight.NeedsPrepare:
			fmt.Fprintf(streams.Out, "%s: %s, nothing to prepare: %s\n", v.CRD, v.State, v.Reason)
			continue
		case opts.dryRun:
			fmt.Fprintf(streams.Out, "%s: would migrate every object to %s and prune %v from status.storedVersions (dry run: nothing changed)\n", v.CRD, v.Storage, v.Drops)
			continue
		}
		if viaOperator {
			fmt.Fprintf(streams.Out, "%s: the restow operator migrates it (restow's StorageMigration API is installed), so that it runs no second migration beside this one\n", v.CRD)
			follow := opts.migrateOptions
			follow.wait = true
			err = requestMigration(ctx, c, streams, m.Name, follow)
		} else {
			fmt.Fprintf(streams.Out, "%s: migrating in this process\n", v.CRD)
			err = run(ctx, c, streams, m.Name, runOptions{
				prune: true, concurrency: migrator.DefaultConcurrency, pageSize: migrator.DefaultPageSize,
				settleWindow: opts.settleWindow, lagBound: migrator.DefaultLagBound, lagLimit: migrator.DefaultLagLimit,
			})
		}
		if err != nil {
			return err
		}
		after, err := c.preflightOne(ctx, m)
		if err != nil {
			return err
		}
		if after.State != preflight.OK {
			return &exitError{code: ExitPending, err: fmt.Errorf("%s: after the migration it is still %s: %s", after.CRD, after.State, after.Reason)}
		}
		fmt.Fprintf(streams.Out, "%s: prepared: status.storedVersions lists %s alone; the apply passes (server-side dry run: %s)\n", v.CRD, v.Storage, orDash(after.DryRun))
	}
	if blocked {
		return &exitError{code: ExitBlocked, err: errors.New("a CRD is blocked: prepare cannot let its apply through; see above")}
	}
	return nil
}
