package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/cli-runtime/pkg/printers"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	restowscheme "github.com/restow/restow/internal/scheme"
)

// The state words are kstatus's, as kubectl wait, Flux and Argo CD read
// the same conditions.
var (
	stateCurrent = kstatus.CurrentStatus.String()
	stateFailed  = kstatus.FailedStatus.String()
)

// stateOf reads the state of a StorageMigration as kstatus computes it from
// its conditions and observedGeneration, with the reason and message of the
// condition that decides it: Stalled when it holds, else Ready.
func stateOf(sm *migrationv1alpha1.StorageMigration) (state, reason, message string) {
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(sm)
	if err != nil {
		return kstatus.UnknownStatus.String(), "", err.Error()
	}
	u := &unstructured.Unstructured{Object: obj}
	u.SetGroupVersionKind(migrationv1alpha1.GroupVersion.WithKind("StorageMigration"))
	result, err := kstatus.Compute(u)
	if err != nil {
		return kstatus.UnknownStatus.String(), "", err.Error()
	}
	state = result.Status.String()
	if sm.Status.ObservedGeneration != sm.Generation {
		return state, "", "restow has not observed the latest spec yet"
	}
	if c := meta.FindStatusCondition(sm.Status.Conditions, migrationv1alpha1.StalledCondition); c != nil && c.Status == metav1.ConditionTrue {
		return state, c.Reason, c.Message
	}
	if c := meta.FindStatusCondition(sm.Status.Conditions, migrationv1alpha1.ReadyCondition); c != nil {
		return state, c.Reason, c.Message
	}
	return state, "", result.Message
}

type statusOptions struct {
	print     *genericclioptions.PrintFlags
	noHeaders bool
	watch     bool
}

func newStatusCommand(f *factory, streams genericiooptions.IOStreams) *cobra.Command {
	s, err := restowscheme.New()
	if err != nil {
		panic(err)
	}
	o := &statusOptions{print: genericclioptions.NewPrintFlags("").WithTypeSetter(s)}
	cmd := &cobra.Command{
		Use:   "status [NAME]",
		Short: "Show the StorageMigrations and how far they got",
		Long: `status lists the StorageMigrations with their state (kstatus's words:
Current, InProgress, Failed), the progress of the pass under way or else of
the last pass, and how long ago the last pass ended. With a NAME and no
--output it describes that one: the Ready message, the counts of the last
pass and the objects it could not rewrite. --watch prints a line on every
change until interrupted. status only reads; it exits 1 on an error.`,
		Example: `  kubectl restow status
  kubectl restow status crontabs.stable.example.com
  kubectl restow status -o wide --watch
  kubectl restow status crontabs.stable.example.com -o jsonpath='{.status.conditions[?(@.type=="Ready")].message}'`,
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case len(args) > 1:
				return fmt.Errorf("status takes at most one NAME, got %d arguments", len(args))
			case len(args) == 1 && strings.TrimSpace(args[0]) == "":
				return errors.New("NAME is empty: name a StorageMigration, or leave NAME out to list them all")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			printer, err := o.printer()
			if err != nil {
				return err
			}
			c, err := f.clients(cmd.Context())
			if err != nil {
				return err
			}
			if o.watch {
				return o.watchStatus(cmd.Context(), c, streams, name, printer)
			}
			return o.status(cmd.Context(), c, streams, name, printer)
		},
	}
	o.print.AddFlags(cmd)
	cmd.Flags().Lookup("output").Usage = fmt.Sprintf("Output format: one of (%s). The default is a table, or a description for one NAME.",
		strings.Join(append([]string{"wide"}, o.print.AllowedFormats()...), ", "))
	cmd.Flags().BoolVar(&o.noHeaders, "no-headers", false, "Print the table without its header line.")
	cmd.Flags().BoolVarP(&o.watch, "watch", "w", false, "After the current state, print a line for every change, until interrupted.")
	return cmd
}

// printer is the printer for --output, or nil for restow's own table ("",
// "wide").
func (o *statusOptions) printer() (printers.ResourcePrinter, error) {
	switch *o.print.OutputFormat {
	case "", "wide":
		return nil, nil
	}
	printer, err := o.print.ToPrinter()
	if genericclioptions.IsNoCompatiblePrinterError(err) {
		return nil, fmt.Errorf("--output %q is not supported: use one of wide, %s, or leave it out", *o.print.OutputFormat, strings.Join(o.print.AllowedFormats(), ", "))
	}
	return printer, err
}

func (o *statusOptions) wide() bool { return *o.print.OutputFormat == "wide" }

func (o *statusOptions) status(ctx context.Context, c *clients, streams genericiooptions.IOStreams, name string, printer printers.ResourcePrinter) error {
	var obj runtime.Object
	var sms []migrationv1alpha1.StorageMigration
	if name != "" {
		sm := &migrationv1alpha1.StorageMigration{}
		if err := c.client.Get(ctx, client.ObjectKey{Name: name}, sm); err != nil {
			if meta.IsNoMatchError(err) {
				return errNotInstalled
			}
			return err
		}
		obj, sms = sm, []migrationv1alpha1.StorageMigration{*sm}
	} else {
		var err error
		if sms, err = c.storageMigrations(ctx); err != nil {
			return err
		}
		obj = &migrationv1alpha1.StorageMigrationList{Items: sms}
	}
	switch {
	case printer != nil:
		return printer.PrintObj(obj, streams.Out)
	case name != "" && !o.wide():
		sm := &sms[0]
		return describe(streams.Out, sm, c.standardMigrations(ctx, streams.ErrOut, groupResourceOf(sm)), time.Now())
	case len(sms) == 0:
		fmt.Fprintln(streams.ErrOut, "No StorageMigrations found.")
		return nil
	}
	return o.tablePrinter(o.noHeaders).PrintObj(statusTable(sms, time.Now()), streams.Out)
}

// watchStatus prints the current state, then every change, until ctx ends.
func (o *statusOptions) watchStatus(ctx context.Context, c *clients, streams genericiooptions.IOStreams, name string, printer printers.ResourcePrinter) error {
	headers := !o.noHeaders
	err := watchMigration(ctx, c.watcher, name, func(ev watch.EventType, sm *migrationv1alpha1.StorageMigration) (bool, error) {
		if printer != nil {
			return false, printer.PrintObj(sm, streams.Out)
		}
		err := o.tablePrinter(!headers).PrintObj(statusTable([]migrationv1alpha1.StorageMigration{*sm}, time.Now()), streams.Out)
		headers = false
		return false, err
	})
	if errors.Is(err, context.Canceled) {
		// Interrupted, as kubectl get --watch ends.
		return nil
	}
	return err
}

func (o *statusOptions) tablePrinter(noHeaders bool) printers.ResourcePrinter {
	return printers.NewTablePrinter(printers.PrintOptions{NoHeaders: noHeaders, Wide: o.wide()})
}

// statusTable is the table of StorageMigrations; -o wide adds the columns
// of priority 1.
func statusTable(sms []migrationv1alpha1.StorageMigration, now time.Time) *metav1.Table {
	t := &metav1.Table{ColumnDefinitions: []metav1.TableColumnDefinition{
		{Name: "Name", Type: "string", Format: "name"},
		{Name: "Resource", Type: "string"},
		{Name: "State", Type: "string", Description: "kstatus: Current, InProgress or Failed"},
		{Name: "Progress", Type: "string", Description: "objects done of objects to visit, in the pass under way or else the last"},
		{Name: "Last Pass", Type: "string", Description: "how long ago the last pass ended"},
		{Name: "Age", Type: "string"},
		{Name: "Target", Type: "string", Priority: 1},
		{Name: "Reason", Type: "string", Priority: 1},
		{Name: "Message", Type: "string", Priority: 1},
	}}
	for i := range sms {
		sm := &sms[i]
		state, reason, message := stateOf(sm)
		t.Rows = append(t.Rows, metav1.TableRow{
			Cells: []any{sm.Name, resourceOf(sm), state, orDash(sm.Status.ProgressSummary), lastPassOf(sm, now),
				duration.HumanDuration(now.Sub(sm.CreationTimestamp.Time)), orDash(sm.Status.TargetVersion), orDash(reason), orDash(message)},
			Object: runtime.RawExtension{Object: sm},
		})
	}
	return t
}

// describe shows one StorageMigration in full, as kubectl describe would,
// then the StorageVersionMigrations of its resource in standard (none
// without the API: a nil index leaves the section out).
func describe(out io.Writer, sm *migrationv1alpha1.StorageMigration, standard standardIndex, now time.Time) error {
	state, reason, message := stateOf(sm)
	w := printers.GetNewTabWriter(out)
	field := func(name, format string, args ...any) {
		fmt.Fprintf(w, "%s:\t%s\n", name, fmt.Sprintf(format, args...))
	}
	field("Name", "%s", sm.Name)
	field("Resource", "%s", resourceOf(sm))
	field("State", "%s", state)
	if reason != "" {
		field("Reason", "%s", reason)
	}
	field("Message", "%s", orDash(message))
	field("Target version", "%s", orDash(sm.Status.TargetVersion))
	field("Progress", "%s", orDash(sm.Status.ProgressSummary))
	if p := sm.Status.Progress; p != nil {
		field("Pass started", "%s ago", duration.HumanDuration(now.Sub(p.StartTime.Time)))
	}
	if last := sm.Status.LastPass; last != nil {
		field("Last pass", "ended %s ago after %s, at %s", duration.HumanDuration(now.Sub(last.CompletionTime.Time)),
			last.CompletionTime.Sub(last.StartTime.Time).Round(time.Second), last.TargetVersion)
		field("  Objects", "%s", countsOf(last.ObjectCounts))
		if len(last.PrunedVersions) > 0 {
			field("  Pruned", "%s removed from status.storedVersions", strings.Join(last.PrunedVersions, ", "))
		}
	} else {
		field("Last pass", "none yet")
	}
	field("Age", "%s", duration.HumanDuration(now.Sub(sm.CreationTimestamp.Time)))
	if err := w.Flush(); err != nil {
		return err
	}
	if err := describeFailed(out, sm.Status.FailedObjects); err != nil {
		return err
	}
	if standard == nil {
		return nil
	}
	return describeStandard(out, standard[groupResourceOf(sm)], now)
}

// describeFailed lists the objects the last pass could not rewrite, if any.
func describeFailed(out io.Writer, failed []migrationv1alpha1.FailedObject) error {
	if len(failed) == 0 {
		return nil
	}
	fmt.Fprintln(out, "Failed objects:")
	w := printers.GetNewTabWriter(out)
	fmt.Fprintln(w, "  NAMESPACE\tNAME\tREASON\tMESSAGE")
	for _, f := range failed {
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\n", orDash(f.Namespace), f.Name, f.Reason, f.Message)
	}
	return w.Flush()
}

// countsOf says what a pass did with its objects.
func countsOf(c migrationv1alpha1.ObjectCounts) string {
	return fmt.Sprintf("%d listed: %d re-encoded, %d already stored, %d changed by others meanwhile, %d rewritten again after the settle window, %d failed",
		c.Listed, c.Migrated, c.AlreadyStored, c.Skipped, c.Rechecked, c.Failed)
}

func resourceOf(sm *migrationv1alpha1.StorageMigration) string {
	return sm.Spec.Resource.String()
}

func lastPassOf(sm *migrationv1alpha1.StorageMigration, now time.Time) string {
	last := sm.Status.LastPass
	if last == nil {
		return "-"
	}
	parts := []string{fmt.Sprintf("%d objects", last.Listed)}
	if last.Failed > 0 {
		parts = append(parts, fmt.Sprintf("%d failed", last.Failed))
	}
	if !last.CompletionTime.IsZero() {
		parts = append(parts, duration.HumanDuration(now.Sub(last.CompletionTime.Time))+" ago")
	}
	return strings.Join(parts, ", ")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
