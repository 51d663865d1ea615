package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
)

// Defaults of migrate --wait.
const (
	// defaultWaitTimeout bounds the whole wait.
	defaultWaitTimeout = time.Hour
	// defaultOperatorTimeout is how long migrate --wait gives the operator
	// to answer: it writes status at once for a new request, and every
	// --status-interval (5 s by default) while a pass runs.
	defaultOperatorTimeout = 30 * time.Second
)

type migrateOptions struct {
	wait            bool
	timeout         time.Duration
	operatorTimeout time.Duration
}

func newMigrateCommand(f *factory, streams genericiooptions.IOStreams) *cobra.Command {
	opts := migrateOptions{}
	cmd := &cobra.Command{
		Use:   "migrate RESOURCE|CRD",
		Short: "Ask the restow operator to migrate a resource, and optionally wait",
		Long: fmt.Sprintf(`migrate creates a StorageMigration for the resource, or, if one exists, asks it
for a new pass (the migration.restow.dev/requested-at annotation). With --wait
it follows the pass with a progress bar until the StorageMigration is Ready
(exit 0) or Stalled (exit %d), or --timeout passes (exit %d). If no restow
operator answers within --operator-timeout, it says so and exits %d.`, ExitPending, ExitTimeout, ExitNoOperator),
		Example: `  kubectl restow migrate crontabs.stable.example.com --wait
  kubectl restow migrate crontabs --wait --timeout 30m`,
		Args: oneResource,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := opts.validate(); err != nil {
				return err
			}
			c, err := f.clients(cmd.Context())
			if err != nil {
				return err
			}
			ctx, cancel := withTimeout(cmd.Context(), opts.timeout)
			defer cancel()
			return requestMigration(ctx, c, streams, args[0], opts)
		},
	}
	cmd.Flags().BoolVar(&opts.wait, "wait", false, "Follow the pass until the StorageMigration is Ready or Stalled.")
	cmd.Flags().DurationVar(&opts.timeout, "timeout", defaultWaitTimeout, "Give up waiting after this long (0: no limit).")
	cmd.Flags().DurationVar(&opts.operatorTimeout, "operator-timeout", defaultOperatorTimeout, "With --wait, how long to wait for the restow operator to answer before concluding that none is running.")
	return cmd
}

// validate checks the flags, before any request.
func (o migrateOptions) validate() error {
	if err := zeroOrPositive("timeout", o.timeout); err != nil {
		return err
	}
	return positive("operator-timeout", o.operatorTimeout)
}

// requestMigration is the migrate command: it asks the operator for a
// migration of the resource arg names (a StorageMigration, or a re-run of
// the one there is) and follows it. The run command migrates in this process
// instead, with the engine's Migrator.Migrate.
func requestMigration(ctx context.Context, c *clients, streams genericiooptions.IOStreams, arg string, opts migrateOptions) error {
	gr, err := c.resolveResource(arg)
	if err != nil {
		return err
	}
	existing, err := c.migrationsFor(ctx, gr)
	if err != nil {
		return err
	}
	c.warnStandardActive(ctx, streams.ErrOut, gr)
	token := time.Now().UTC().Format(time.RFC3339Nano)
	sm, err := c.askForPass(ctx, streams, gr, existing, token)
	if err != nil {
		return err
	}
	if !opts.wait {
		return nil
	}
	name := sm.Name
	if err := waitForOperator(ctx, c, sm, token, opts.operatorTimeout); err != nil {
		return err
	}

	total := int64(-1)
	if target, err := c.migrator.Resolve(ctx, gr); err == nil {
		if n, err := c.migrator.Count(ctx, target); err == nil {
			total = n
		}
	}
	sm, ending, err := Follow(ctx, c.watcher, name, total, Answered(token), streams.Out)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return &exitError{code: ExitTimeout, err: fmt.Errorf("timed out waiting for StorageMigration %s: %s", name, summarize(sm))}
	case err != nil:
		return err
	case ending == Stalled:
		_, reason, message := stateOf(sm)
		return &exitError{code: ExitPending, err: fmt.Errorf("StorageMigration %s is Stalled (%s): %s", name, reason, message)}
	}
	printPassSummary(streams, sm)
	return nil
}

// askForPass asks the operator for a pass of gr, named by token: a new pass
// of the StorageMigration that covers it, or a new StorageMigration. One
// created meanwhile under the same name for the same resource (the
// operator's own, made when the CRD's storage version switched) is asked
// for a pass as if it had been listed.
func (c *clients) askForPass(ctx context.Context, streams genericiooptions.IOStreams, gr schema.GroupResource, existing []migrationv1alpha1.StorageMigration, token string) (*migrationv1alpha1.StorageMigration, error) {
	if len(existing) == 0 {
		sm := newStorageMigration(gr, token)
		err := c.client.Create(ctx, sm)
		switch {
		case err == nil:
			fmt.Fprintf(streams.Out, "Created StorageMigration %s.\n", sm.Name)
			return sm, nil
		case !apierrors.IsAlreadyExists(err):
			return nil, fmt.Errorf("creating StorageMigration %s: %w", sm.Name, err)
		}
		there := &migrationv1alpha1.StorageMigration{}
		if err := c.client.Get(ctx, client.ObjectKey{Name: sm.Name}, there); err != nil {
			return nil, fmt.Errorf("reading StorageMigration %s, created meanwhile: %w", sm.Name, err)
		}
		if there.Spec.Resource.Group != gr.Group || there.Spec.Resource.Resource != gr.Resource {
			return nil, fmt.Errorf("a StorageMigration named %s exists for another resource: create one for %s by hand under another name", sm.Name, gr)
		}
		existing = []migrationv1alpha1.StorageMigration{*there}
	}
	sm := &existing[0]
	patch := client.RawPatch(client.Merge.Type(), fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, migrationv1alpha1.ReRunAnnotation, token))
	if err := c.client.Patch(ctx, sm, patch); err != nil {
		return nil, fmt.Errorf("requesting a new pass of StorageMigration %s: %w", sm.Name, err)
	}
	fmt.Fprintf(streams.Out, "Requested a new pass of StorageMigration %s.\n", sm.Name)
	return sm, nil
}

// waitForOperator waits until an operator answered the request: its status
// observed the latest generation and handled token, or changed at all (a
// pass under way writes progress and handles the token only when it ends).
// With no answer within limit, no operator is running.
func waitForOperator(ctx context.Context, c *clients, asked *migrationv1alpha1.StorageMigration, token string, limit time.Duration) error {
	answerCtx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	err := watchMigration(answerCtx, c.watcher, asked.Name, func(ev watch.EventType, sm *migrationv1alpha1.StorageMigration) (bool, error) {
		if ev == watch.Deleted {
			return false, fmt.Errorf("StorageMigration %s: %w", asked.Name, errDeleted)
		}
		handled := sm.Status.ObservedGeneration == sm.Generation && sm.Status.LastHandledReRunToken == token
		return handled || !equality.Semantic.DeepEqual(sm.Status, asked.Status), nil
	})
	switch {
	case err == nil:
		return nil
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return &exitError{code: ExitTimeout, err: fmt.Errorf("timed out waiting for StorageMigration %s: no restow operator answered yet", asked.Name)}
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, context.DeadlineExceeded):
		return &exitError{code: ExitNoOperator, err: fmt.Errorf(
			"no restow operator answered StorageMigration %s within %s (its status did not change): is the operator running? "+
				"(kubectl get deployments -A -l app.kubernetes.io/name=restow, in any namespace and under any release name); `kubectl restow run %s` migrates without one",
			asked.Name, limit, asked.Spec.Resource)}
	}
	return err
}

// newStorageMigration names a StorageMigration after its resource, as the
// operator names automatic ones after their CRD, and requests a pass with token.
func newStorageMigration(gr schema.GroupResource, token string) *migrationv1alpha1.StorageMigration {
	return &migrationv1alpha1.StorageMigration{
		ObjectMeta: metav1.ObjectMeta{
			Name:        gr.String(),
			Annotations: map[string]string{migrationv1alpha1.ReRunAnnotation: token},
		},
		Spec: migrationv1alpha1.StorageMigrationSpec{
			Resource: migrationv1alpha1.GroupResource{Group: gr.Group, Resource: gr.Resource},
		},
	}
}

// summarize says where a StorageMigration stands, in one line.
func summarize(sm *migrationv1alpha1.StorageMigration) string {
	if sm == nil || sm.Name == "" {
		return "it does not exist"
	}
	state, reason, message := stateOf(sm)
	if reason == "" {
		return state + ": " + message
	}
	return fmt.Sprintf("%s (%s): %s", state, reason, message)
}

func printPassSummary(streams genericiooptions.IOStreams, sm *migrationv1alpha1.StorageMigration) {
	last := sm.Status.LastPass
	if last == nil {
		fmt.Fprintf(streams.Out, "StorageMigration %s is Ready.\n", sm.Name)
		return
	}
	proved := "stored at"
	if !last.Settled {
		// No settle window: a write that began on the old storage may
		// land after the pass.
		proved = "rewritten to"
	}
	fmt.Fprintf(streams.Out, "StorageMigration %s is Ready: %d objects %s %s (%d re-encoded, %d already stored, %d changed by others meanwhile, %d rewritten again after the settle window)",
		sm.Name, last.Listed, proved, last.TargetVersion, last.Migrated, last.AlreadyStored, last.Skipped, last.Rechecked)
	if len(last.PrunedVersions) > 0 {
		fmt.Fprintf(streams.Out, "; removed %v from status.storedVersions", last.PrunedVersions)
	}
	fmt.Fprintln(streams.Out, ".")
}
