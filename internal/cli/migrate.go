package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
)

func newMigrateCommand(f *factory, streams genericiooptions.IOStreams) *cobra.Command {
	var (
		waitFor bool
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "migrate RESOURCE|CRD",
		Short: "Ask the restow operator to migrate a resource, and optionally wait",
		Long: `migrate creates a StorageMigration for the resource, or, if one exists, asks it
for a new pass (the migration.restow.dev/requested-at annotation). With --wait
it follows the pass with a progress bar until the StorageMigration is Ready
(exit 0) or Stalled (exit 2), or --timeout passes (exit 3).`,
		Example: `  kubectl restow migrate crontabs.stable.example.com --wait
  kubectl restow migrate crontabs --wait --timeout 30m`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.clients()
			if err != nil {
				return err
			}
			ctx, cancel := withTimeout(cmd.Context(), timeout)
			defer cancel()
			return migrate(ctx, c, streams, args[0], waitFor)
		},
	}
	cmd.Flags().BoolVar(&waitFor, "wait", false, "Follow the pass until the StorageMigration is Ready or Stalled.")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "Give up waiting after this long (0: no limit).")
	return cmd
}

func migrate(ctx context.Context, c *clients, streams genericiooptions.IOStreams, arg string, waitFor bool) error {
	gr, err := c.resolveResource(arg)
	if err != nil {
		return err
	}
	existing, err := c.migrationsFor(ctx, gr)
	if err != nil {
		return err
	}
	token := time.Now().UTC().Format(time.RFC3339Nano)
	var name string
	if len(existing) > 0 {
		sm := &existing[0]
		name = sm.Name
		patch := client.RawPatch(client.Merge.Type(), fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, migrationv1alpha1.ReRunAnnotation, token))
		if err := c.client.Patch(ctx, sm, patch); err != nil {
			return fmt.Errorf("requesting a new pass of StorageMigration %s: %w", name, err)
		}
		fmt.Fprintf(streams.Out, "Requested a new pass of StorageMigration %s.\n", name)
	} else {
		sm := newStorageMigration(gr, token)
		name = sm.Name
		if err := c.client.Create(ctx, sm); err != nil {
			if apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("a StorageMigration named %s exists for another resource: create one for %s by hand under another name", name, gr)
			}
			return fmt.Errorf("creating StorageMigration %s: %w", name, err)
		}
		fmt.Fprintf(streams.Out, "Created StorageMigration %s.\n", name)
	}
	if !waitFor {
		return nil
	}

	total := int64(-1)
	if target, err := c.migrator.Resolve(ctx, gr); err == nil {
		if n, err := c.migrator.Count(ctx, target); err == nil {
			total = n
		}
	}
	sm, outcome, err := Follow(ctx, c.client, name, total, Answered(token), streams.Out)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		hint := ""
		if state, _, _ := migrationState(sm); state == statePending {
			hint = "; is the restow operator running? (`kubectl restow run` needs none)"
		}
		return &exitError{code: ExitTimeout, err: fmt.Errorf("timed out waiting for StorageMigration %s: %s%s", name, describe(sm), hint)}
	case err != nil:
		return err
	case outcome == Stalled:
		_, reason, message := migrationState(sm)
		return &exitError{code: ExitPending, err: fmt.Errorf("StorageMigration %s is Stalled (%s): %s", name, reason, message)}
	}
	printPassSummary(streams, sm)
	return nil
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

func describe(sm *migrationv1alpha1.StorageMigration) string {
	if sm == nil || sm.Name == "" {
		return "it does not exist"
	}
	state, reason, message := migrationState(sm)
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
	fmt.Fprintf(streams.Out, "StorageMigration %s is Ready: %d objects stored at %s (%d rewritten, %d changed by others meanwhile)",
		sm.Name, last.Listed, last.TargetVersion, last.Migrated, last.Skipped)
	if len(last.PrunedVersions) > 0 {
		fmt.Fprintf(streams.Out, "; removed %v from status.storedVersions", last.PrunedVersions)
	}
	fmt.Fprintln(streams.Out, ".")
}
