package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/cli-runtime/pkg/printers"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/storedversions"
	"github.com/restow/restow/internal/svm"
)

// defaultAssumedRate is the pass throughput plan assumes for a migration
// that is not running: at or below the manager's median in every make bench
// run committed to docs/bench since 2026-11-21, 304 to 537 objects/s over
// 10,000 and 50,000 objects on a 2-core test control plane, from the storage
// switch to the prune (docs/benchmarks.md, "Results").
const defaultAssumedRate = 300

// planEntry is a CRD whose status.storedVersions lists more than its
// storage version.
type planEntry struct {
	CRD            string   `json:"crd"`
	StorageVersion string   `json:"storageVersion"`
	StoredVersions []string `json:"storedVersions"`
	ServedVersions []string `json:"servedVersions"`
	// Objects is how many objects a pass would rewrite; absent if they
	// could not be counted.
	Objects   *int64         `json:"objects,omitempty"`
	Migration *planMigration `json:"migration,omitempty"`
	// Estimate is how long the rest of the migration may take.
	Estimate string `json:"estimate,omitempty"`
	// StorageVersionMigrations are the standard StorageVersionMigrations of
	// the resource, oldest first; absent when there are none, or when the
	// cluster serves no such API.
	StorageVersionMigrations []planStandard `json:"storageVersionMigrations,omitempty"`
	// BlockedBy says what stands between now and removing the old versions
	// from the CRD.
	BlockedBy []string `json:"blockedBy"`
}

// planStandard is a standard StorageVersionMigration of a CRD's resource.
type planStandard struct {
	Name  string `json:"name"`
	State string `json:"state"`
}

// planMigration is the StorageMigration that covers a CRD.
type planMigration struct {
	Name      string `json:"name"`
	Automatic bool   `json:"automatic"`
	State     string `json:"state"`
	Reason    string `json:"reason,omitempty"`
	Message   string `json:"message,omitempty"`
}

type planOutput struct {
	// Namespace, when set, is the only namespace whose objects were counted.
	Namespace string      `json:"namespace,omitempty"`
	Pending   []planEntry `json:"pending"`
	// standard: the standard StorageVersionMigrations were read, so the
	// table has their column; without the API it is as it always was.
	standard bool
}

func newPlanCommand(f *factory, streams genericiooptions.IOStreams) *cobra.Command {
	var (
		output        string
		failIfPending bool
		assumedRate   float64
		allNamespaces bool
	)
	cmd := &cobra.Command{
		Use:   "plan",
		Short: "Show the CRDs whose objects may still be stored at an old version",
		Long: `plan lists every CRD whose status.storedVersions lists more than its storage
version: how many objects a migration would rewrite, which StorageMigration
covers it and in what state, an estimate of the time left, and what blocks
removing the old versions from the CRD. With -n/--namespace it counts the
objects of namespaced CRDs in that namespace only. plan only reads. With
--fail-if-pending it exits 2 while any CRD is listed, whoever migrates it (a
gate in CI before a release that removes an old version); 1 on an error.`,
		Example: `  kubectl restow plan
  kubectl restow plan -o yaml
  # In CI: fail while anything is left to migrate.
  kubectl restow plan --fail-if-pending`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := validateOutput(output); err != nil {
				return err
			}
			if !(assumedRate > 0) || math.IsInf(assumedRate, 1) {
				return fmt.Errorf("--assumed-rate must be a positive number of objects per second, got %v", assumedRate)
			}
			namespace, err := f.namespace(allNamespaces)
			if err != nil {
				return err
			}
			c, err := f.clients(cmd.Context())
			if err != nil {
				return err
			}
			result, err := plan(cmd.Context(), c, streams.ErrOut, namespace, assumedRate, time.Now())
			if err != nil {
				return err
			}
			if output != "" {
				err = printStructured(streams.Out, output, result)
			} else {
				err = printPlan(streams, result)
			}
			if err != nil {
				return err
			}
			if n := len(result.Pending); failIfPending && n > 0 {
				return &exitError{code: ExitPending, err: fmt.Errorf("%d CRDs may still have objects stored at an old version", n)}
			}
			return nil
		},
	}
	addOutputFlag(cmd, &output)
	cmd.Flags().BoolVar(&failIfPending, "fail-if-pending", false, fmt.Sprintf("Exit with code %d while any CRD is left to migrate.", ExitPending))
	cmd.Flags().Float64Var(&assumedRate, "assumed-rate", defaultAssumedRate, "Objects per second assumed for the estimate of a migration that is not running.")
	addAllNamespacesFlag(cmd, &allNamespaces)
	return cmd
}

// plan lists the CRDs left to migrate. The standard StorageVersionMigrations
// are read last, so that an error of restow's own reads is the command's
// error and not a warning before it; warn takes the warning.
func plan(ctx context.Context, c *clients, warn io.Writer, namespace string, assumedRate float64, now time.Time) (planOutput, error) {
	out := planOutput{Namespace: namespace, Pending: []planEntry{}}
	var crds apiextensionsv1.CustomResourceDefinitionList
	if err := c.client.List(ctx, &crds); err != nil {
		return out, err
	}
	sms, err := c.storageMigrations(ctx)
	installed := err == nil
	if err != nil && !errors.Is(err, errNotInstalled) {
		return out, err
	}
	var pending []schema.GroupResource
	for i := range crds.Items {
		crd := &crds.Items[i]
		if !storedversions.NeedsMigration(crd) {
			continue
		}
		out.Pending = append(out.Pending, planFor(ctx, c, crd, namespace, sms, installed, assumedRate, now))
		pending = append(pending, crdResource(crd))
	}
	standard := c.standardMigrations(ctx, warn, pending...)
	out.standard = standard != nil
	for i := range out.Pending {
		addStandard(&out.Pending[i], standard[pending[i]])
	}
	return out, nil
}

func crdResource(crd *apiextensionsv1.CustomResourceDefinition) schema.GroupResource {
	return schema.GroupResource{Group: crd.Spec.Group, Resource: crd.Spec.Names.Plural}
}

// addStandard lists the StorageVersionMigrations of e's resource and, while
// one has not ended, says that another migrator will prune status.storedVersions.
func addStandard(e *planEntry, ms []svm.Migration) {
	for _, m := range ms {
		e.StorageVersionMigrations = append(e.StorageVersionMigrations, planStandard{Name: m.Name, State: string(m.State)})
	}
	if m := activeStandard(ms); m != nil {
		e.BlockedBy = append(e.BlockedBy, standardNote(m))
	}
}

func planFor(ctx context.Context, c *clients, crd *apiextensionsv1.CustomResourceDefinition, namespace string, sms []migrationv1alpha1.StorageMigration,
	installed bool, assumedRate float64, now time.Time) planEntry {
	storage := storedversions.StorageVersion(crd)
	e := planEntry{
		CRD:            crd.Name,
		StorageVersion: storage,
		StoredVersions: crd.Status.StoredVersions,
		ServedVersions: storedversions.ServedVersions(crd),
	}
	old := slices.DeleteFunc(slices.Clone(crd.Status.StoredVersions), func(v string) bool { return v == storage })
	e.BlockedBy = append(e.BlockedBy, fmt.Sprintf("status.storedVersions lists %s", strings.Join(old, ", ")))

	if len(e.ServedVersions) == 0 {
		e.BlockedBy = append(e.BlockedBy, "the CRD serves no version, so its objects cannot be listed or rewritten")
	} else {
		version := e.ServedVersions[0]
		if slices.Contains(e.ServedVersions, storage) {
			version = storage
		}
		target := migrator.Target{
			Resource:   schema.GroupVersionResource{Group: crd.Spec.Group, Version: version, Resource: crd.Spec.Names.Plural},
			Namespaced: crd.Spec.Scope == apiextensionsv1.NamespaceScoped,
			Namespace:  namespace,
		}
		if n, err := c.migrator.Count(ctx, target); err != nil {
			e.BlockedBy = append(e.BlockedBy, "its objects cannot be listed: "+migrator.Message(err))
		} else {
			e.Objects = &n
		}
	}

	var sm *migrationv1alpha1.StorageMigration
	for i := range sms {
		if groupResourceOf(&sms[i]) == crdResource(crd) {
			sm = &sms[i]
			break
		}
	}
	switch {
	case sm == nil && !installed:
		e.BlockedBy = append(e.BlockedBy, "restow is not installed: run `kubectl restow run "+crd.Name+"`")
	case sm == nil:
		e.BlockedBy = append(e.BlockedBy, "no StorageMigration covers it: run `kubectl restow migrate "+crd.Name+"`, or run the operator with --auto-migrate")
	default:
		state, reason, message := stateOf(sm)
		e.Migration = &planMigration{Name: sm.Name, Automatic: sm.Labels[migrationv1alpha1.AutomaticLabel] == "true", State: state, Reason: reason, Message: message}
		switch {
		case state == stateFailed:
			e.BlockedBy = append(e.BlockedBy, fmt.Sprintf("StorageMigration %s is Stalled (%s): %s", sm.Name, reason, message))
		case sm.Spec.PruneStoredVersions != nil && !*sm.Spec.PruneStoredVersions:
			e.BlockedBy = append(e.BlockedBy, fmt.Sprintf("StorageMigration %s does not prune status.storedVersions (spec.pruneStoredVersions is false)", sm.Name))
		}
	}
	if e.Objects != nil {
		e.Estimate = estimate(*e.Objects, sm, assumedRate, now).String()
	}
	return e
}

// estimate is the time left to rewrite objects: at the pace of the pass under
// way, if there is one, else at assumedRate.
func estimate(objects int64, sm *migrationv1alpha1.StorageMigration, assumedRate float64, now time.Time) time.Duration {
	remaining, rate := float64(objects), assumedRate
	if sm != nil && sm.Status.Progress != nil {
		p := sm.Status.Progress
		done := float64(p.Done())
		if elapsed := now.Sub(p.StartTime.Time).Seconds(); done > 0 && elapsed > 0 {
			rate = done / elapsed
		}
		remaining = max(remaining-done, 0)
	}
	return time.Duration(remaining / rate * float64(time.Second)).Round(time.Second)
}

func printPlan(streams genericiooptions.IOStreams, result planOutput) error {
	if len(result.Pending) == 0 {
		fmt.Fprintln(streams.Out, "Nothing to migrate: every CRD's status.storedVersions lists only its storage version.")
		return nil
	}
	w := printers.GetNewTabWriter(streams.Out)
	objects := "OBJECTS"
	if result.Namespace != "" {
		objects = "OBJECTS IN " + result.Namespace
	}
	// The column of the standard StorageVersionMigrations only where the
	// cluster serves them.
	row := func(head []string, standard string, tail ...string) {
		if result.standard {
			head = append(head, standard)
		}
		fmt.Fprintln(w, strings.Join(append(head, tail...), "\t"))
	}
	row([]string{"CRD", "STORAGE", "STORED VERSIONS", objects, "MIGRATION", "STATE"}, "STORAGEVERSIONMIGRATIONS", "ESTIMATE", "BLOCKED BY")
	for _, e := range result.Pending {
		objects, migration, state := "?", "-", "-"
		if e.Objects != nil {
			objects = fmt.Sprint(*e.Objects)
		}
		if e.Migration != nil {
			migration, state = e.Migration.Name, e.Migration.State
		}
		row([]string{e.CRD, e.StorageVersion, strings.Join(e.StoredVersions, ","), objects, migration, state},
			standardCell(e.StorageVersionMigrations), orDash(e.Estimate), strings.Join(e.BlockedBy, "; "))
	}
	return w.Flush()
}

// maxStandardCell is how many StorageVersionMigrations plan's table names
// for a CRD: the newest, which tell where the resource stands; -o json and
// -o yaml list them all.
const maxStandardCell = 3

// standardCell is the cell of plan's table that names a CRD's
// StorageVersionMigrations with their state, oldest first.
func standardCell(ms []planStandard) string {
	if len(ms) == 0 {
		return "-"
	}
	var parts []string
	if older := len(ms) - maxStandardCell; older > 0 {
		parts = append(parts, fmt.Sprintf("%d older", older))
		ms = ms[older:]
	}
	for _, m := range ms {
		parts = append(parts, fmt.Sprintf("%s (%s)", m.Name, m.State))
	}
	return strings.Join(parts, ", ")
}
