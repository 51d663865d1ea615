package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/cli-runtime/pkg/printers"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/svm"
)

// standardIndex holds the standard StorageVersionMigrations
// (storagemigration.k8s.io) of some resources, oldest first, read live: the
// commands show them beside restow's own migrations, since another migrator
// (the in-tree controller of kube-controller-manager, or restow's operator
// with --serve-storage-version-migrations) carries them out and prunes the
// CRD's status.storedVersions by itself. A nil index shows nothing: the
// cluster serves no such API, or it could not be read.
type standardIndex map[schema.GroupResource][]svm.Migration

// standardMigrations reads the StorageVersionMigrations of each of grs. They
// are beside the point of every command, so an error does not fail it: it
// warns in one line on warn and returns nil, as for a cluster without the
// API. It reads all or nothing, so that no resource seems to have none
// because the reading stopped before it.
func (c *clients) standardMigrations(ctx context.Context, warn io.Writer, grs ...schema.GroupResource) standardIndex {
	index, err := c.readStandard(ctx, grs)
	if err != nil {
		// A command whose context ended fails on its own requests.
		if ctx.Err() == nil {
			fmt.Fprintf(warn, "Warning: StorageVersionMigrations (%s) are left out: %s\n", svm.Group, oneLine(err.Error()))
		}
		return nil
	}
	return index
}

// readStandard lists the StorageVersionMigrations of grs at the version the
// cluster serves; nil if it serves none. Discovery is asked live: kubectl's
// cached discovery may predate the API being turned on.
func (c *clients) readStandard(ctx context.Context, grs []schema.GroupResource) (standardIndex, error) {
	if len(grs) == 0 {
		return nil, nil
	}
	version, err := svm.ServedVersion(c.migrator.Discovery)
	if err != nil || version == "" {
		return nil, err
	}
	index := make(standardIndex, len(grs))
	for _, gr := range grs {
		ms, err := svm.ForResource(ctx, c.client, version, gr)
		if err != nil {
			return nil, err
		}
		summaries := make([]svm.Migration, 0, len(ms))
		for _, m := range ms {
			summaries = append(summaries, svm.Summarize(m))
		}
		index[gr] = summaries
	}
	return index, nil
}

// groupResourceOf is the resource of a StorageMigration, as the svm package takes it.
func groupResourceOf(sm *migrationv1alpha1.StorageMigration) schema.GroupResource {
	return schema.GroupResource{Group: sm.Spec.Resource.Group, Resource: sm.Spec.Resource.Resource}
}

// activeStandard is the first of ms, oldest first, that has not ended: the
// one the in-tree controller runs now or next. Nil if none.
func activeStandard(ms []svm.Migration) *svm.Migration {
	for i := range ms {
		if !ms[i].State.Final() {
			return &ms[i]
		}
	}
	return nil
}

// standardNote says that m hands the resource to another migrator, which
// prunes status.storedVersions without restow.
func standardNote(m *svm.Migration) string {
	return fmt.Sprintf("StorageVersionMigration %s is %s: another migrator (the in-tree controller of kube-controller-manager, "+
		"or restow's operator run with --serve-storage-version-migrations) is migrating the resource and may prune status.storedVersions itself", m.Name, m.State)
}

// warnStandardActive warns before a pass of gr that a StorageVersionMigration
// of gr has not ended: two migrators then rewrite the same objects. The pass
// goes on: rewrites are idempotent.
func (c *clients) warnStandardActive(ctx context.Context, warn io.Writer, gr schema.GroupResource) {
	if m := activeStandard(c.standardMigrations(ctx, warn, gr)[gr]); m != nil {
		fmt.Fprintf(warn, "Warning: %s. Going on: rewrites are idempotent.\n", standardNote(m))
	}
}

// describeStandard is the StorageVersionMigrations section of status NAME.
func describeStandard(out io.Writer, ms []svm.Migration, now time.Time) error {
	if len(ms) == 0 {
		_, err := fmt.Fprintln(out, "StorageVersionMigrations: none")
		return err
	}
	fmt.Fprintln(out, "StorageVersionMigrations:")
	w := printers.GetNewTabWriter(out)
	fmt.Fprintln(w, "  NAME\tSTATE\tAGE\tMESSAGE")
	for _, m := range ms {
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\n", m.Name, m.State, duration.HumanDuration(now.Sub(m.Created)), orDash(oneLine(m.Message)))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if m := activeStandard(ms); m != nil {
		_, err := fmt.Fprintf(out, "  %s.\n", standardNote(m))
		return err
	}
	return nil
}
