package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/preflight"
)

type prepareOptions struct {
	manifestFlags
	// migrateOptions hold --timeout and --operator-timeout, as migrate's.
	migrateOptions
	dryRun       bool
	ahead        bool
	inProcess    bool
	settleWindow time.Duration
}

// prepareLong is the help of prepare.
var prepareLong = fmt.Sprintf(`prepare judges the manifests as preflight does, and for every CRD that needs
prepare (the manifest drops versions status.storedVersions lists) migrates
every object to the live storage version and prunes status.storedVersions
to it, with the same proof, settle window and rules for several API servers
as any migration; then apply the release. Where the manifest drops the live
storage version too (a skipped release, a downgrade), it first makes the
version preflight names (both sides serve it, and every object keeps every
field there) the storage version, as the field manager that owns
spec.versions: that needs update and patch on the CRD. That takes the
release's CRD (-f): --keep names versions, not schemas, so such a CRD is
blocked with --keep.

Where restow's StorageMigration API is installed (the operator), prepare
hands each migration to it (a StorageMigration, or a new pass of the one
there is) and follows it, so that one resource never has two migrations at
once; elsewhere, or with --in-process, it migrates in this process as
kubectl restow run does. With --ahead it also migrates each CRD whose
apply passes but keeps listing older versions in status.storedVersions
(preflight warns of them), where the release keeps the live storage
version. A CRD that is blocked is left as it is. A CRD that is blocked or whose
migration fails does not stop the others.

It exits 0 when every CRD then applies; otherwise with the weightiest
outcome: 1 on an error, %d when no operator answered where its API is
installed, %d when one is blocked, %d when a migration left objects it could
not rewrite (named, and nothing pruned); %d on --timeout, which stops the
rest.`, ExitNoOperator, ExitBlocked, ExitPending, ExitTimeout)

func newPrepareCommand(f *factory, streams genericiooptions.IOStreams) *cobra.Command {
	opts := prepareOptions{}
	cmd := &cobra.Command{
		Use:   "prepare -f FILE|DIR|- [-f ...] | --keep CRD=VERSION[,VERSION...]",
		Short: "Migrate what a CRD upgrade needs migrated, so that the API server accepts it",
		Long:  prepareLong,
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
				return runPrepare(ctx, c, streams, manifests, opts)
			})
		},
	}
	opts.add(cmd)
	cmd.Flags().BoolVar(&opts.dryRun, "dry-run", false, "Say what prepare would migrate, and change nothing.")
	cmd.Flags().BoolVar(&opts.ahead, "ahead", false, "Also migrate each CRD whose apply passes but keeps listing versions besides its storage version in status.storedVersions, so that a later release that drops them passes (off by default: the apply does not need it, and the restow operator does it by itself).")
	cmd.Flags().BoolVar(&opts.inProcess, "in-process", false, "Migrate in this process even where restow's StorageMigration API is installed: make sure no restow operator runs.")
	cmd.Flags().DurationVar(&opts.settleWindow, "settle-window", migrator.DefaultSettleWindow, "In this process: how long after the storage switch writes that began on the old storage may still commit, before the prune.")
	cmd.Flags().DurationVar(&opts.timeout, "timeout", defaultWaitTimeout, "Give up after this long (0: no limit).")
	cmd.Flags().DurationVar(&opts.operatorTimeout, "operator-timeout", defaultOperatorTimeout, "Where the operator migrates: how long to wait for it to answer before concluding that none is running.")
	return cmd
}

// prepareAtOnce bounds how many CRDs one prepare works on at once. Their
// settle windows run side by side, so that a chart of many CRDs takes
// about as long as its slowest; the passes themselves share the bound of
// the process's migrator (migrator.DefaultMaxPasses) or the operator's.
const prepareAtOnce = 16

// prepared is how prepare left one CRD: the state judged first, and the
// error it ended with (nil when it is prepared or left as it is).
type prepared struct {
	crd   string
	state preflight.State
	err   error
}

// runPrepare prepares every CRD of manifests that needs it, up to
// prepareAtOnce at a time, and judges each again after: the apply passes
// only once the API server's dry run accepts it. A CRD that is blocked, or
// whose migration fails, does not stop the others; the exit code is the
// weightiest outcome (an error, then blocked, then a migration that left
// objects behind). Only the end of ctx (--timeout, an interrupt) stops the
// rest, and prepare then says where each CRD is.
func runPrepare(ctx context.Context, c *clients, streams genericiooptions.IOStreams, manifests []preflight.Manifest, opts prepareOptions) error {
	viaOperator, err := c.handsToOperator(ctx, opts.inProcess)
	if err != nil {
		return err
	}
	// Set up once for every migration in this process: they run side by side.
	closeEtcd, err := inProcess(opts).setUpMigrator(c.migrator)
	if err != nil {
		return err
	}
	defer closeEtcd()
	shared := genericiooptions.IOStreams{In: streams.In, Out: &lineWriter{w: streams.Out}, ErrOut: &lineWriter{w: streams.ErrOut}}
	p := &preflight.Preparer{
		Client: c.client, TrustWebhook: opts.trustWebhook, DryRun: opts.dryRun, Ahead: opts.ahead,
		Migrate: func(ctx context.Context, name, target string) error {
			return c.migrateFor(ctx, shared, name, target, opts, viaOperator)
		},
		Report: reporter(shared),
	}
	outcomes := make([]prepared, len(manifests))
	slots := make(chan struct{}, prepareAtOnce)
	var wg sync.WaitGroup
	for _, same := range byCRD(manifests) {
		// Manifests of one CRD (-f and --keep both naming it) one after
		// another: the second sees what the first did.
		wg.Go(func() {
			select {
			case slots <- struct{}{}:
				defer func() { <-slots }()
			case <-ctx.Done():
				for _, i := range same {
					outcomes[i] = prepared{crd: manifests[i].Name, err: ctx.Err()}
				}
				return
			}
			for _, i := range same {
				state, err := p.Prepare(ctx, manifests[i])
				outcomes[i] = prepared{manifests[i].Name, state, exitOf(err)}
				if err != nil && ctx.Err() == nil {
					fmt.Fprintf(shared.Out, "%s: not prepared: %s\n", manifests[i].Name, oneLine(err.Error()))
				}
			}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return errors.Join(cutShort(shared.Out, outcomes), ctx.Err())
	}
	return prepareExit(outcomes)
}

// prepareExit is prepare's end once every CRD had its turn: nil when each
// applies, else the weightiest exit code and every CRD's error.
func prepareExit(outcomes []prepared) error {
	var failed []error
	blocked := false
	for _, o := range outcomes {
		if o.err != nil {
			failed = append(failed, fmt.Errorf("%s: %w", o.crd, o.err))
		}
		blocked = blocked || o.state == preflight.Blocked
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
		return &exitError{code: code, err: fmt.Errorf("%d of %d CRDs not prepared: %w", len(failed), len(outcomes), errors.Join(failed...))}
	}
	if blocked {
		return &exitError{code: ExitBlocked, err: errors.New("a CRD is blocked: prepare cannot let its apply through; see above")}
	}
	return nil
}

// byCRD groups the indexes of manifests by the CRD each names, in the
// order each CRD first appears.
func byCRD(manifests []preflight.Manifest) [][]int {
	var groups [][]int
	at := map[string]int{}
	for i, m := range manifests {
		g, ok := at[m.Name]
		if !ok {
			g = len(groups)
			at[m.Name] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// cutShort says, when ctx ended first (--timeout, an interrupt), where each
// CRD is: prepared or with nothing to do, blocked, or not finished (with
// what it ended on), and that a new run takes each on from where it is.
func cutShort(w io.Writer, outcomes []prepared) error {
	var done, blocked, open []string
	var errs []error
	for _, o := range outcomes {
		name := o.crd
		switch {
		case o.err != nil:
			open = append(open, name)
			fmt.Fprintf(w, "%s: not finished: %s\n", name, oneLine(o.err.Error()))
			errs = append(errs, fmt.Errorf("%s: %w", name, o.err))
		case o.state == preflight.Blocked:
			blocked = append(blocked, name)
		default:
			done = append(done, name)
		}
	}
	none := func(names []string) string {
		if len(names) == 0 {
			return "none"
		}
		return strings.Join(slices.Compact(names), ", ")
	}
	fmt.Fprintf(w, "prepare stopped before its end: prepared, or nothing to do: %s; blocked, left as they are: %s; not finished: %s\n", none(done), none(blocked), none(open))
	return errors.Join(append(errs, fmt.Errorf("not finished: %s. Run prepare again: it takes each CRD on from where it is (a storage switch it made stays; the restow operator's migrations go on meanwhile; nothing is pruned before a migration ends)", none(open)))...)
}

// lineWriter lets several goroutines write to w, one whole write at a time:
// each line prepare and its migrations print is one write, and names its CRD.
type lineWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lineWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// exitOf gives an error of prepare's its exit code.
func exitOf(err error) error {
	switch {
	case errors.Is(err, preflight.ErrBlocked):
		return &exitError{code: ExitBlocked, err: err}
	case errors.Is(err, preflight.ErrPending):
		return &exitError{code: ExitPending, err: err}
	}
	return err
}

// reporter prints what prepare does: steps and outcomes on standard
// output, warnings on standard error.
type reporter genericiooptions.IOStreams

func (r reporter) Did(crd, what string) { fmt.Fprintf(r.Out, "%s: %s\n", crd, what) }

func (r reporter) Warn(crd, warning string) {
	fmt.Fprintf(r.ErrOut, "Warning: %s: %s\n", crd, warning)
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
		return false, fmt.Errorf("restow's StorageMigration API is installed, but this identity may not list StorageMigrations, so prepare cannot hand its migrations to the restow operator: grant list and create on storagemigrations.migration.restow.dev, and get, watch and patch on the StorageMigration of each CRD it prepares (by its name), or, where no restow operator runs, pass --in-process: %w", err)
	case err != nil:
		return false, err
	}
	return true, nil
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
	pass := inProcess(opts)
	pass.expectStorage, pass.setUp = target, true
	return run(ctx, c, streams, name, pass)
}

// inProcess is how prepare migrates in this process: as run does by
// default, with prepare's settle window.
func inProcess(opts prepareOptions) runOptions {
	return runOptions{
		prune: true, concurrency: migrator.DefaultConcurrency, pageSize: migrator.DefaultPageSize,
		settleWindow: opts.settleWindow, lagBound: migrator.DefaultLagBound, lagLimit: migrator.DefaultLagLimit,
	}
}
