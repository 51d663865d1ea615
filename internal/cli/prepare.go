package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/spf13/cobra"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

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
prepare (the manifest drops versions status.storedVersions lists) migrates
every object to the live storage version and prunes status.storedVersions
to it, with the same proof, settle window and rules for several API servers
as any migration; then apply the release. Where the manifest drops the live
storage version too (a skipped release, a downgrade), it first makes the
version preflight names (both sides serve it, and every object keeps every
field there) the storage version, as the field manager that owns
spec.versions: that needs update and patch on the CRD.

Where restow's StorageMigration API is installed (the operator), prepare
hands each migration to it (a StorageMigration, or a new pass of the one
there is) and follows it, so that one resource never has two migrations at
once; elsewhere, or with --in-process, it migrates in this process as
kubectl restow run does. A CRD that is blocked is left as it is. A CRD that is blocked or whose
migration fails does not stop the others.

It exits 0 when every CRD then applies; otherwise with the weightiest
outcome: 1 on an error, %d when no operator answered where its API is
installed, %d when one is blocked, %d when a migration left objects it could
not rewrite (named, and nothing pruned); %d on --timeout, which stops the
rest.`, ExitNoOperator, ExitBlocked, ExitPending, ExitTimeout),
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
// dry run accepts it. A CRD that is blocked, or whose migration fails, does
// not stop the others; the exit code is the weightiest outcome (an error,
// then blocked, then a migration that left objects behind). Only the end of
// ctx (--timeout, an interrupt) stops the rest.
func prepare(ctx context.Context, c *clients, streams genericiooptions.IOStreams, manifests []preflight.Manifest, opts prepareOptions) error {
	viaOperator, err := c.handsToOperator(ctx, opts.inProcess)
	if err != nil {
		return err
	}
	var failed []error
	blocked := false
	for _, m := range manifests {
		state, err := prepareOne(ctx, c, streams, m, opts, viaOperator)
		if ctx.Err() != nil {
			return errors.Join(err, ctx.Err())
		}
		if err != nil {
			fmt.Fprintf(streams.Out, "%s: not prepared: %s\n", m.Name, oneLine(err.Error()))
			failed = append(failed, fmt.Errorf("%s: %w", m.Name, err))
		}
		blocked = blocked || state == preflight.Blocked
	}
	if len(failed) > 0 {
		code := 0
		if blocked {
			code = ExitBlocked
		}
		for _, err := range failed {
			c := 1
			if exit := (*exitError)(nil); errors.As(err, &exit) {
				c = exit.code
			}
			if weight(c) > weight(code) {
				code = c
			}
		}
		return &exitError{code: code, err: fmt.Errorf("%d of %d CRDs not prepared: %w", len(failed), len(manifests), errors.Join(failed...))}
	}
	if blocked {
		return &exitError{code: ExitBlocked, err: errors.New("a CRD is blocked: prepare cannot let its apply through; see above")}
	}
	return nil
}

// prepareWeight orders prepare's exit codes, lightest first: objects a
// migration could not rewrite, a blocked CRD, no operator answering, an
// error (1, or any code not listed, which is heaviest).
var prepareWeight = map[int]int{0: 0, ExitPending: 1, ExitBlocked: 2, ExitNoOperator: 3}

func weight(code int) int {
	if w, ok := prepareWeight[code]; ok {
		return w
	}
	return len(prepareWeight)
}

// handsToOperator says whether prepare hands its migrations to the restow
// operator: where restow's StorageMigration API is installed, unless
// inProcess. An API it may not read is an error: which of the two would run
// the migration is then unknown.
func (c *clients) handsToOperator(ctx context.Context, inProcess bool) (bool, error) {
	if inProcess {
		return false, nil
	}
	_, err := c.storageMigrations(ctx)
	switch {
	case errors.Is(err, errNotInstalled):
		return false, nil
	case apierrors.IsForbidden(err):
		return false, fmt.Errorf("restow's StorageMigration API is installed, but this identity may not list StorageMigrations, so prepare cannot hand its migrations to the restow operator: grant get, list, watch, create and patch on storagemigrations.migration.restow.dev, or, where no restow operator runs, pass --in-process: %w", err)
	case err != nil:
		return false, err
	}
	return true, nil
}

// prepareOne judges m, migrates its CRD if it needs prepare, and judges it
// again; it returns the state judged first.
func prepareOne(ctx context.Context, c *clients, streams genericiooptions.IOStreams, m preflight.Manifest, opts prepareOptions, viaOperator bool) (preflight.State, error) {
	v, err := c.preflightOne(ctx, m, opts.trustWebhook)
	if err != nil {
		return "", err
	}
	switch {
	case v.State == preflight.Blocked:
		fmt.Fprintf(streams.Out, "%s: blocked, left as it is: %s\n", v.CRD, v.Reason)
		return v.State, nil
	case v.State != preflight.NeedsPrepare:
		fmt.Fprintf(streams.Out, "%s: %s, nothing to prepare: %s\n", v.CRD, v.State, v.Reason)
		return v.State, nil
	case v.Unchecked != "":
		return v.State, fmt.Errorf("%s; nothing was changed", v.Unchecked)
	case opts.dryRun && v.Bridge != "":
		fmt.Fprintf(streams.Out, "%s: would make %s the live storage version (no field of any object is lost at it: checked), migrate every object to it and prune status.storedVersions to [%s] (dry run: nothing changed)\n", v.CRD, v.Bridge, v.Bridge)
		return v.State, nil
	case opts.dryRun:
		fmt.Fprintf(streams.Out, "%s: would migrate every object to %s and prune %v from status.storedVersions (dry run: nothing changed)\n", v.CRD, v.Storage, v.Drops)
		return v.State, nil
	}
	for _, warning := range v.Warnings {
		fmt.Fprintf(streams.ErrOut, "Warning: %s: %s\n", v.CRD, warning)
	}
	target := v.Storage
	if v.Bridge != "" {
		target = v.Bridge
		if state, err := c.toBridge(ctx, streams, m.Name, v); err != nil {
			return state, err
		}
	}
	err = c.migrateFor(ctx, streams, m.Name, target, opts, viaOperator)
	if err != nil {
		if v.Bridge != "" {
			err = fmt.Errorf("%w; the live storage version is now %s, every stored version is still listed, and nothing is lost: run prepare again, or apply the release that is installed to move it back", err, v.Bridge)
		}
		return v.State, errors.Join(err, c.flippedBack(ctx, m.Name, target))
	}
	after, err := c.preflightOne(ctx, m, opts.trustWebhook)
	if err != nil {
		return v.State, err
	}
	if after.State != preflight.OK {
		return v.State, &exitError{code: ExitPending, err: fmt.Errorf("after the migration it is still %s: %s", after.State, after.Reason)}
	}
	fmt.Fprintf(streams.Out, "%s: prepared: status.storedVersions lists %s alone; the apply passes (server-side dry run: %s)\n", v.CRD, target, dryRunSaid(after.DryRun))
	return v.State, nil
}

// dryRunSaid is what a verdict's dry run said, or why none was made.
func dryRunSaid(dryRun string) string {
	if dryRun == "" {
		return "none: --keep gives versions, not a manifest"
	}
	return dryRun
}

// flippedBack says, after a migration to version failed, whether the CRD's
// storage version moved away from it meanwhile (an owner re-applying the
// old CRD: an operator that manages its CRDs, a GitOps self-heal), and
// who wrote it; nil if it did not.
func (c *clients) flippedBack(ctx context.Context, name, version string) error {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := c.client.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
		return fmt.Errorf("reading CRD %s again to see whether its storage version moved: %w", name, err)
	}
	live := preflight.LiveOf(crd)
	if live.Storage == version {
		return nil
	}
	// spec.versions is an atomic list: whoever wrote it last owns it.
	writer, _ := versionsOwner(crd)
	return fmt.Errorf("the storage version of CRD %s went from %s to %s while prepare migrated (spec.versions is now field manager %s's): nothing was pruned. Something re-applies the old CRD (an operator that manages its own CRDs, a GitOps self-heal): pause it, then run prepare again", name, version, live.Storage, writer)
}

// toBridge makes v.Bridge the live storage version of CRD name, onto the
// CRD that was checked only, and, for a conversion webhook, checks the
// round trip again (recheck); it returns the state prepare ends in when it
// fails.
func (c *clients) toBridge(ctx context.Context, streams genericiooptions.IOStreams, name string, v preflight.Verdict) (preflight.State, error) {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := c.client.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
		return v.State, err
	}
	if crd.ResourceVersion != v.CheckedResourceVersion {
		return v.State, fmt.Errorf("CRD %s changed since prepare checked its objects' fields: nothing was changed; run prepare again", name)
	}
	manager, err := c.switchStorage(ctx, crd, v.Bridge)
	if err != nil {
		return v.State, err
	}
	fmt.Fprintf(streams.Out, "%s: made %s the live storage version in place of %s (as field manager %s, which owns spec.versions), after checking that no object loses a field at it\n", v.CRD, v.Bridge, v.Storage, manager)
	if viaWebhook(crd) {
		if err := c.recheck(ctx, name, v); err != nil {
			return preflight.Blocked, err
		}
	}
	return v.State, nil
}

// migrateFor migrates CRD name to target: through the restow operator
// where it runs (so that no second migration runs beside its own), else in
// this process.
func (c *clients) migrateFor(ctx context.Context, streams genericiooptions.IOStreams, name, target string, opts prepareOptions, viaOperator bool) error {
	if viaOperator {
		fmt.Fprintf(streams.Out, "%s: the restow operator migrates it (restow's StorageMigration API is installed), so that it runs no second migration beside this one\n", name)
		follow := opts.migrateOptions
		follow.wait = true
		return requestMigration(ctx, c, streams, name, follow)
	}
	fmt.Fprintf(streams.Out, "%s: migrating in this process\n", name)
	return run(ctx, c, streams, name, runOptions{
		prune: true, concurrency: migrator.DefaultConcurrency, pageSize: migrator.DefaultPageSize,
		settleWindow: opts.settleWindow, lagBound: migrator.DefaultLagBound, lagLimit: migrator.DefaultLagLimit,
		expectStorage: target,
	})
}

// recheck runs the round trip through the conversion webhook again right
// after the storage switch, for objects written at the old storage version
// between the first check and the switch; if one would lose a field, or
// the webhook fails, it moves the storage version back to v.Storage and
// stops, before this process migrates anything and with nothing pruned.
// (Writes that reach the old storage later, through an API server that has
// not switched yet, are what --trust-conversion-webhook vouches for.)
func (c *clients) recheck(ctx context.Context, name string, v preflight.Verdict) error {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := c.client.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
		return c.moveBack(ctx, name, v, fmt.Sprintf("reading the CRD after the switch failed: %v", err))
	}
	stored := slices.DeleteFunc(storedAt(crd), func(s string) bool { return s == v.Bridge })
	trip, err := c.roundTrip(ctx, crd, stored, v.Bridge)
	if err != nil {
		return c.moveBack(ctx, name, v, fmt.Sprintf("the check after the switch failed: %v", err))
	}
	if losses := trip.all(); len(losses) > 0 {
		return c.moveBack(ctx, name, v, fmt.Sprintf("after the switch, %s written at %s meanwhile would lose fields at %s or could not be converted there: %s",
			objectCount(len(losses)), v.Storage, v.Bridge, nameLosses(losses)))
	}
	return nil
}

// moveBack makes v.Storage the storage version of CRD name again, after a
// failed recheck said why, and returns the error prepare ends with. It
// does so even when ctx has ended (an interrupt, --timeout), within a
// bound of its own, on the CRD as it is then.
func (c *clients) moveBack(ctx context.Context, name string, v preflight.Verdict, why string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), moveBackTimeout)
	defer cancel()
	now := v.Bridge
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := c.client.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
			return err
		}
		if now = preflight.LiveOf(crd).Storage; now != v.Bridge {
			return nil
		}
		_, err := c.switchStorage(ctx, crd, v.Storage)
		return err
	})
	back := fmt.Sprintf("moved the storage version back to %s", v.Storage)
	switch {
	case err == nil && now != v.Bridge:
		back = fmt.Sprintf("the storage version was already %s, moved by another client, and is left so", now)
	case err != nil:
		back = fmt.Sprintf("could not move the storage version back to %s (%v): apply the installed release again", v.Storage, err)
	}
	return &exitError{code: ExitBlocked, err: fmt.Errorf("%s; %s, and nothing was pruned", why, back)}
}

// moveBackTimeout bounds moveBack.
const moveBackTimeout = 30 * time.Second
