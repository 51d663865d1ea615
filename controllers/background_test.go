package controllers_test

import (
	"context"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/controllers"
)

// TestBackgroundWaitsForAPass: background work yields to a pass. The
// automatic StorageMigration of a built-in resource, created while a pass
// over a CRD rewrites, records no baseline (it reads no API server's
// discovery) while the pass rewrites; once the migration has ended, it
// does. Without the gate the baseline is recorded within a reconcile of its
// creation, mid-pass.
func TestBackgroundWaitsForAPass(t *testing.T) {
	f := fixture{group: "yield.controllers.restow.dev", kind: "Widget", plural: "widgets", namespaced: true}
	f.install(t, "v1beta1", "v1")
	f.createObjects(t, 1500, tenNamespaces...)
	f.switchStorage(t, "v1")
	// A settle window that outlasts the pass (it counts from the switch),
	// several times the deferral's 5 s retry: the gate holds through it.
	startManagerWith(t, nil, controllers.Options{SettleWindow: 25 * time.Second})
	under := f.slowPassUnderWay(t, nil)

	builtIn := &migrationv1alpha1.StorageMigration{
		ObjectMeta: metav1.ObjectMeta{Name: "podtemplates", Labels: map[string]string{
			migrationv1alpha1.AutomaticLabel: "true",
			migrationv1alpha1.BuiltInLabel:   "true",
		}},
		Spec: migrationv1alpha1.StorageMigrationSpec{
			Resource:  migrationv1alpha1.GroupResource{Resource: "podtemplates"},
			FirstPass: migrationv1alpha1.FirstPassSkip,
		},
	}
	if err := env.Client.Create(t.Context(), builtIn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), builtIn) })

	// Two more status writes of the pass (200 ms apart here) after the
	// creation: the built-in StorageMigration's first reconcile came and
	// went meanwhile.
	migrated := under.Status.Progress.Migrated
	var seen int
	waitFor(t, under.Name, time.Minute, "two more writes of progress", func(sm *migrationv1alpha1.StorageMigration) bool {
		if p := sm.Status.Progress; p != nil && p.Migrated > migrated {
			migrated = p.Migrated
			seen++
		}
		return seen >= 2 || sm.Status.Progress == nil
	})
	mid := &migrationv1alpha1.StorageMigration{}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Name: builtIn.Name}, mid); err != nil {
		t.Fatal(err)
	}
	settling := waitFor(t, under.Name, time.Minute, "the settle window", func(sm *migrationv1alpha1.StorageMigration) bool {
		return sm.Status.Progress != nil && sm.Status.Progress.Phase == migrationv1alpha1.PassSettling || sm.Status.LastPass != nil
	})
	inWindow := &migrationv1alpha1.StorageMigration{}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Name: builtIn.Name}, inWindow); err != nil {
		t.Fatal(err)
	}
	if settling.Status.Progress != nil && inWindow.Status.Baseline != nil {
		t.Errorf("the built-in StorageMigration recorded its baseline at %s, in the settle window of the migration over %s", inWindow.Status.Baseline.RecordedAt, f.crdName())
	}
	under = waitFor(t, under.Name, time.Minute, "Ready", readyAt("v1"))
	if seen < 2 {
		t.Fatalf("the pass ended (%d objects) before two more writes of progress: too fast to show the gate", under.Status.LastPass.Listed)
	}
	if mid.Status.Baseline != nil {
		t.Errorf("the built-in StorageMigration recorded its baseline at %s, while the pass over %s rewrote (it ended at %s)",
			mid.Status.Baseline.RecordedAt, f.crdName(), under.Status.LastPass.CompletionTime)
	}
	// Once the migration has ended (the gate opens at its prune), the
	// baseline comes.
	ended := waitFor(t, builtIn.Name, time.Minute, "a baseline once the pass ended", func(sm *migrationv1alpha1.StorageMigration) bool {
		return sm.Status.Baseline != nil
	})
	if at, done := ended.Status.Baseline.RecordedAt, under.Status.LastPass.CompletionTime; at.Before(&done) {
		t.Errorf("baseline recorded at %s, before the migration over %s ended at %s (its settle window and re-check are waited for too)", at, f.crdName(), done)
	}
	f.assertStored(t, "v1", 1500)
}

// TestFirstSweepWaitsForTheMigration: the manager starts, with both
// triggers on, while a CRD's objects wait to be re-stored (an operator and
// its CRD upgraded together, say). The trigger of built-in resources makes
// its first sweep, and creates its StorageMigrations, only once the CRD's
// migration has ended: at start, that migration is created and launched in
// the same second as the sweep would begin, before it holds the gate the
// sweep waits on. Without the wait, they are created at once.
func TestFirstSweepWaitsForTheMigration(t *testing.T) {
	f := fixture{group: "warm.controllers.restow.dev", kind: "Gadget", plural: "gadgets", namespaced: true}
	f.install(t, "v1beta1", "v1")
	f.createObjects(t, 1500, tenNamespaces...)
	f.switchStorage(t, "v1")
	f.deleteMigrationsAtEnd(t)
	if n := len(builtInMigrations(t)); n != 0 {
		t.Fatalf("%d automatic StorageMigrations of built-in resources before the manager starts", n)
	}
	// The settle window (counted from the switch) keeps the migration
	// under way for seconds after its pass.
	startManagerWith(t, nil, controllers.Options{AutoMigrate: true, AutoMigrateBuiltIns: true, SettleWindow: 10 * time.Second})
	// Registered after the manager's start, so run before its stop.
	t.Cleanup(func() {
		if err := env.Client.DeleteAllOf(context.Background(), &migrationv1alpha1.StorageMigration{},
			client.MatchingLabels{migrationv1alpha1.BuiltInLabel: "true"}); err != nil {
			t.Error(err)
		}
	})
	// Read in this order, a StorageMigration of a built-in resource seen
	// while status.storedVersions still lists v1beta1 was created before
	// the prune, the migration's last step.
	var early []string
	under := waitFor(t, f.crdName(), time.Minute, "Ready", func(sm *migrationv1alpha1.StorageMigration) bool {
		if names := builtInMigrations(t); len(early) == 0 && len(names) > 0 && len(f.fx().StoredVersions(t)) > 1 {
			early = names
		}
		return readyAt("v1")(sm)
	})
	f.assertStored(t, "v1", 1500)
	f.assertStoredVersions(t, "v1")
	if len(early) > 0 {
		t.Errorf("%d automatic StorageMigrations of built-in resources (%s first) created before the migration over %s ended",
			len(early), early[0], f.crdName())
	}
	if err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		return slices.Contains(builtInMigrations(t), "configmaps"), nil
	}); err != nil {
		t.Fatalf("no automatic StorageMigration of configmaps after the migration over %s ended at %s: %v",
			f.crdName(), under.Status.LastPass.CompletionTime, err)
	}
}

// builtInMigrations names the automatic StorageMigrations of built-in
// resources.
func builtInMigrations(t *testing.T) []string {
	t.Helper()
	var list migrationv1alpha1.StorageMigrationList
	if err := env.Client.List(t.Context(), &list, client.MatchingLabels{migrationv1alpha1.BuiltInLabel: "true"}); err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(list.Items))
	for _, sm := range list.Items {
		names = append(names, sm.Name)
	}
	return names
}
