package cli

import (
	"context"
	"errors"
	"fmt"
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
	// BlockedBy says what stands between now and removing the old versions
	// from the CRD.
	BlockedBy []string `json:"blockedBy"`
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
objects of namespaced CRDs in that namespace only.`,
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
			entries, err := plan(cmd.Context(), c, namespace, assumedRate, time.Now())
			if err != nil {
				return err
			}
			if output != "" {
				err = printStructured(streams.Out, output, planOutput{Namespace: namespace, Pending: entries})
			} else {
				err = printPlan(streams, namespace, entries)
			}
			if err != nil {
				return err
			}
			if failIfPending && len(entries) > 0 {
				return &exitError{code: ExitPending, err: fmt.Errorf("%d CRDs may still have objects stored at an old version", len(entries))}
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

func plan(ctx context.Context, c *clients, namespace string, assumedRate float64, now time.Time) ([]planEntry, error) {
	var crds apiextensionsv1.CustomResourceDefinitionList
	if err := c.client.List(ctx, &crds); err != nil {
		return nil, err
	}
	sms, err := c.storageMigrations(ctx)
	installed := err == nil
	if err != nil && !errors.Is(err, errNotInstalled) {
		return nil, err
	}
	entries := []planEntry{}
	for i := range crds.Items {
		crd := &crds.Items[i]
		if !storedversions.NeedsMigration(crd) {
			continue
		}
		entries = append(entries, planFor(ctx, c, crd, namespace, sms, installed, assumedRate, now))
	}
	return entries, nil
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
		if sms[i].Spec.Resource.Group == crd.Spec.Group && sms[i].Spec.Resource.Resource == crd.Spec.Names.Plural {
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

func printPlan(streams genericiooptions.IOStreams, namespace string, entries []planEntry) error {
	if len(entries) == 0 {
		fmt.Fprintln(streams.Out, "Nothing to migrate: every CRD's status.storedVersions lists only its storage version.")
		return nil
	}
	w := printers.GetNewTabWriter(streams.Out)
	objects := "OBJECTS"
	if namespace != "" {
		objects = "OBJECTS IN " + namespace
	}
	fmt.Fprintf(w, "CRD\tSTORAGE\tSTORED VERSIONS\t%s\tMIGRATION\tSTATE\tESTIMATE\tBLOCKED BY\n", objects)
	for _, e := range entries {
		objects, migration, state := "?", "-", "-"
		if e.Objects != nil {
			objects = fmt.Sprint(*e.Objects)
		}
		if e.Migration != nil {
			migration, state = e.Migration.Name, e.Migration.State
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.CRD, e.StorageVersion, strings.Join(e.StoredVersions, ","), objects,
			migration, state, orDash(e.Estimate), strings.Join(e.BlockedBy, "; "))
	}
	return w.Flush()
}
