package controllers_test

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
