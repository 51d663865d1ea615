package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/cli-runtime/pkg/printers"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
)

// The states of a StorageMigration, from its conditions.
const (
	statePending     = "Pending" // restow has not reported on this generation yet
	stateReady       = "Ready"
	stateReconciling = "Reconciling"
	stateStalled     = "Stalled"
)

// migrationState reads the state of a StorageMigration, with the reason and
// message of the condition that decides it.
func migrationState(sm *migrationv1alpha1.StorageMigration) (state, reason, message string) {
	if sm.Status.ObservedGeneration != sm.Generation {
		return statePending, "", "restow has not observed the latest spec yet"
	}
	for _, t := range []string{migrationv1alpha1.StalledCondition, migrationv1alpha1.ReadyCondition, migrationv1alpha1.ReconcilingCondition} {
		if c := meta.FindStatusCondition(sm.Status.Conditions, t); c != nil && c.Status == "True" {
			return t, c.Reason, c.Message
		}
	}
	return statePending, "", "restow has not reported yet"
}

// processed counts the objects a pass has finished with.
func processed(c migrationv1alpha1.ObjectCounts) int64 {
	return c.Migrated + c.Skipped + c.Failed
}

func newStatusCommand(f *factory, streams genericiooptions.IOStreams) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "List the StorageMigrations and how far they got",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := validateOutput(output); err != nil {
				return err
			}
			c, err := f.clients()
			if err != nil {
				return err
			}
			return status(cmd.Context(), c, streams, output)
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

func status(ctx context.Context, c *clients, streams genericiooptions.IOStreams, output string) error {
	sms, err := c.storageMigrations(ctx)
	if err != nil {
		return err
	}
	if output != "" {
		list := &migrationv1alpha1.StorageMigrationList{Items: sms}
		list.APIVersion, list.Kind = "v1", "List"
		for i := range list.Items {
			list.Items[i].APIVersion = migrationv1alpha1.GroupVersion.String()
			list.Items[i].Kind = "StorageMigration"
			// As kubectl get does without --show-managed-fields.
			list.Items[i].ManagedFields = nil
		}
		return printStructured(streams.Out, output, list)
	}
	if len(sms) == 0 {
		fmt.Fprintln(streams.Out, "No StorageMigrations.")
		return nil
	}
	w := printers.GetNewTabWriter(streams.Out)
	fmt.Fprintln(w, "NAME\tRESOURCE\tTARGET\tSTATE\tREASON\tPROGRESS\tLAST PASS\tAGE")
	for i := range sms {
		sm := &sms[i]
		state, reason, _ := migrationState(sm)
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", sm.Name, resourceOf(sm), orDash(sm.Status.TargetVersion), state, orDash(reason),
			progressOf(sm), lastPassOf(sm), duration.HumanDuration(time.Since(sm.CreationTimestamp.Time)))
	}
	return w.Flush()
}

func resourceOf(sm *migrationv1alpha1.StorageMigration) string {
	if sm.Spec.Resource.Group == "" {
		return sm.Spec.Resource.Resource
	}
	return sm.Spec.Resource.Resource + "." + sm.Spec.Resource.Group
}

func progressOf(sm *migrationv1alpha1.StorageMigration) string {
	p := sm.Status.Progress
	if p == nil {
		return "-"
	}
	if p.RemainingEstimate != nil {
		return fmt.Sprintf("%d/~%d", processed(p.ObjectCounts), p.Listed+*p.RemainingEstimate)
	}
	return fmt.Sprintf("%d/%d+", processed(p.ObjectCounts), p.Listed)
}

func lastPassOf(sm *migrationv1alpha1.StorageMigration) string {
	last := sm.Status.LastPass
	if last == nil {
		return "-"
	}
	parts := []string{fmt.Sprintf("%d objects", last.Listed)}
	if last.Failed > 0 {
		parts = append(parts, fmt.Sprintf("%d failed", last.Failed))
	}
	if !last.CompletionTime.IsZero() {
		parts = append(parts, duration.HumanDuration(time.Since(last.CompletionTime.Time))+" ago")
	}
	return strings.Join(parts, ", ")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
