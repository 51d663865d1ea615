package controllers_test

import (
	"context"
	"slices"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/controllers"
)

// autoOn runs the automatic trigger for every CRD, as the manager does by default.
var autoOn = controllers.Options{AutoMigrate: true}

// deleteMigrationsAtEnd deletes the StorageMigrations of the fixture's
// resource when the test ends: the test control plane runs no garbage
// collector to follow the automatic ones' owner reference. Register it before
// starting the manager, so it runs after the manager stopped.
func (f fixture) deleteMigrationsAtEnd(t *testing.T) {
	t.Helper()
	t.Cleanup(func() {
		for _, sm := range f.migrations(t, context.Background()) {
			if err := env.Client.Delete(context.Background(), &sm); client.IgnoreNotFound(err) != nil {
				t.Error(err)
			}
		}
	})
}

// migrations lists the StorageMigrations whose resource is the fixture's.
func (f fixture) migrations(t *testing.T, ctx context.Context) []migrationv1alpha1.StorageMigration {
	t.Helper()
	var list migrationv1alpha1.StorageMigrationList
	if err := env.Client.List(ctx, &list); err != nil {
		t.Fatal(err)
	}
	return slices.DeleteFunc(list.Items, func(sm migrationv1alpha1.StorageMigration) bool {
		return sm.Spec.Resource != migrationv1alpha1.GroupResource{Group: f.group, Resource: f.plural}
	})
}

// assertOnlyMigration checks that exactly one StorageMigration, named name,
// covers the fixture's resource.
func (f fixture) assertOnlyMigration(t *testing.T, name string) {
	t.Helper()
	sms := f.migrations(t, t.Context())
	names := make([]string, 0, len(sms))
	for _, sm := range sms {
		names = append(names, sm.Name)
	}
	if len(names) != 1 || names[0] != name {
		t.Fatalf("StorageMigrations of %s: %v, want only %s", f.crdName(), names, name)
	}
}

// firstPassStart returns when the manager recorded the first PassStarted
// event of a StorageMigration: events carry the recorder's clock to the
// microsecond.
func firstPassStart(t *testing.T, name string) time.Time {
	t.Helper()
	return waitEvent(t, name, "PassStarted").EventTime.Time
}

// waitEvent waits for an event of the StorageMigration name with reason and
// returns the earliest.
func waitEvent(t *testing.T, name, reason string) eventsv1.Event {
	t.Helper()
	var first *eventsv1.Event
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var list eventsv1.EventList
		if err := env.Client.List(ctx, &list, client.InNamespace(metav1.NamespaceDefault)); err != nil {
			return false, err
		}
		for _, e := range list.Items {
			if e.Regarding.Kind == "StorageMigration" && e.Regarding.Name == name && e.Reason == reason &&
				(first == nil || e.EventTime.Before(&first.EventTime)) {
				first = &e
			}
		}
		return first != nil, nil
	})
	if err != nil {
		t.Fatalf("no %s event for %s: %v", reason, name, err)
	}
	return *first
}

// reconciles sums controller-runtime's count of a controller's reconciles,
// whatever their result, in this test process.
func reconciles(t *testing.T, controller string) float64 {
	t.Helper()
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, family := range families {
		if family.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range family.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == controller {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

// TestAutoMigrationOnStorageSwitch: with 1,000 objects present, a CRD update
// that switches storage v1beta1 → v1 is all it takes. A StorageMigration
// named after the CRD appears, every object ends at v1 in etcd,
// storedVersions is [v1], and the API server then accepts removing v1beta1.
func TestAutoMigrationOnStorageSwitch(t *testing.T) {
	f := fixture{group: "switch.auto.restow.dev", kind: "Widget", plural: "widgets", namespaced: true}
	f.install(t, "v1beta1", "v1")
	f.createObjects(t, 1000, tenNamespaces...)
	f.deleteMigrationsAtEnd(t)
	before := reconciles(t, "automigration")
	startManagerWith(t, nil, autoOn)
	// Measure from a running trigger: it has looked at both CRDs present,
	// restow's and this one, and found nothing to do.
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return reconciles(t, "automigration") >= before+2, nil
	})
	if err != nil {
		t.Fatalf("the trigger did not start: %v", err)
	}
	if sms := f.migrations(t, t.Context()); len(sms) != 0 {
		t.Fatalf("%d StorageMigrations before the storage switch, want none", len(sms))
	}

	switched := time.Now()
	f.switchStorage(t, "v1")
	sm := waitFor(t, f.crdName(), 2*time.Minute, "Ready", readyAt("v1"))
	reaction := firstPassStart(t, sm.Name).Sub(switched)
	t.Logf("From the CRD update to the pass starting: %v", reaction)
	// Not a speed target: a generous bound that only a polling period would break.
	if reaction > 10*time.Second {
		t.Errorf("the pass started %v after the storage switch, want about a second", reaction)
	}

	f.assertStored(t, "v1", 1000)
	f.assertStoredVersions(t, "v1")
	f.assertOnlyMigration(t, f.crdName())
	crd := f.crd(t)
	if sm.Labels[migrationv1alpha1.AutomaticLabel] != "true" {
		t.Errorf("labels = %v, want %s=true", sm.Labels, migrationv1alpha1.AutomaticLabel)
	}
	if len(sm.OwnerReferences) != 1 || sm.OwnerReferences[0].UID != crd.UID || sm.OwnerReferences[0].Kind != "CustomResourceDefinition" {
		t.Errorf("ownerReferences = %+v, want the CRD %s (%s)", sm.OwnerReferences, crd.Name, crd.UID)
	}
	if last := sm.Status.LastPass; last.Listed != 1000 || last.Failed != 0 || !slices.Equal(last.PrunedVersions, []string{"v1beta1"}) {
		t.Errorf("lastPass = %+v, want 1000 listed, none failed, v1beta1 pruned", last)
	}

	// The point of it all: the next release can drop v1beta1.
	if err := f.removeVersion(t, "v1beta1"); err != nil {
		t.Fatalf("removing v1beta1 after the automatic migration: %v", err)
	}
	f.assertStored(t, "v1", 1000)
}

// TestAutoMigrationOptOut: a CRD annotated out, a CRD outside the selector,
// and any CRD while the trigger is off get no StorageMigration. A CRD that is
// opted in, switched at the same time, is the witness that the trigger ran.
func TestAutoMigrationOptOut(t *testing.T) {
	witness := fixture{group: "witness.auto.restow.dev", kind: "Witness", plural: "witnesses", labels: map[string]string{"restow.dev/migrate": "yes"}}
	annotated := fixture{group: "annotated.auto.restow.dev", kind: "Annotated", plural: "annotateds", labels: map[string]string{"restow.dev/migrate": "yes"},
		annotations: map[string]string{migrationv1alpha1.AutoMigrateAnnotation: "false"}}
	unselected := fixture{group: "unselected.auto.restow.dev", kind: "Unselected", plural: "unselecteds"}
	for _, f := range []fixture{witness, annotated, unselected} {
		f.install(t, "v1beta1", "v1")
		f.createObjects(t, 20)
		f.deleteMigrationsAtEnd(t)
	}

	t.Run("annotation and selector", func(t *testing.T) {
		stop := startManagerWith(t, nil, controllers.Options{AutoMigrate: true, AutoMigrateSelector: labels.SelectorFromSet(labels.Set{"restow.dev/migrate": "yes"})})
		defer stop()
		for _, f := range []fixture{witness, annotated, unselected} {
			f.switchStorage(t, "v1")
		}
		waitFor(t, witness.crdName(), time.Minute, "Ready", readyAt("v1"))
		witness.assertStored(t, "v1", 20)
		for _, f := range []fixture{annotated, unselected} {
			if sms := f.migrations(t, t.Context()); len(sms) != 0 {
				t.Errorf("%s: %d StorageMigrations, want none", f.crdName(), len(sms))
			}
			f.assertStored(t, "v1beta1", 20)
			f.assertStoredVersions(t, "v1beta1", "v1")
		}
	})

	t.Run("trigger off", func(t *testing.T) {
		stop := startManagerWith(t, nil, controllers.Options{AutoMigrate: false})
		defer stop()
		// The witness: a StorageMigration made by hand still runs.
		manual := annotated.createMigration(t, nil)
		waitFor(t, manual.Name, time.Minute, "Ready", readyAt("v1"))
		annotated.assertStored(t, "v1", 20)
		if sms := unselected.migrations(t, t.Context()); len(sms) != 0 {
			t.Errorf("%s: %d StorageMigrations with the trigger off, want none", unselected.crdName(), len(sms))
		}
		unselected.assertStoredVersions(t, "v1beta1", "v1")
	})

	t.Run("trigger on for every CRD", func(t *testing.T) {
		// The same CRD is picked up as soon as the trigger selects it.
		stop := startManagerWith(t, nil, autoOn)
		defer stop()
		waitFor(t, unselected.crdName(), time.Minute, "Ready", readyAt("v1"))
		unselected.assertStored(t, "v1", 20)
		unselected.assertStoredVersions(t, "v1")
	})
}

// TestAutoMigrationDefersToUserMigration: a StorageMigration made by hand for
// the resource, under another name, is the only one; and one made after the
// automatic one retires it.
func TestAutoMigrationDefersToUserMigration(t *testing.T) {
	f := fixture{group: "user.auto.restow.dev", kind: "Gizmo", plural: "gizmos", namespaced: true}
	f.install(t, "v1beta1", "v1", "v2")
	f.createObjects(t, 300, "default")
	f.deleteMigrationsAtEnd(t)
	startManagerWith(t, nil, autoOn)

	t.Run("made before the switch", func(t *testing.T) {
		mine := f.createMigration(t, func(sm *migrationv1alpha1.StorageMigration) { sm.Name = "gizmos-by-hand" })
		waitFor(t, mine.Name, time.Minute, "Ready", readyAt("v1beta1"))
		f.switchStorage(t, "v1")
		waitFor(t, mine.Name, time.Minute, "Ready", readyAt("v1"))
		f.assertStored(t, "v1", 300)
		f.assertStoredVersions(t, "v1")
		f.assertOnlyMigration(t, mine.Name)
		if err := env.Client.Delete(t.Context(), mine); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("made after the automatic one", func(t *testing.T) {
		f.switchStorage(t, "v2")
		waitFor(t, f.crdName(), time.Minute, "created", func(*migrationv1alpha1.StorageMigration) bool { return true })
		mine := f.createMigration(t, func(sm *migrationv1alpha1.StorageMigration) { sm.Name = "gizmos-from-git" })
		err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			err := env.Client.Get(ctx, client.ObjectKey{Name: f.crdName()}, &migrationv1alpha1.StorageMigration{})
			return client.IgnoreNotFound(err) == nil && err != nil, client.IgnoreNotFound(err)
		})
		if err != nil {
			t.Fatalf("the automatic StorageMigration was not retired: %v", err)
		}
		waitFor(t, mine.Name, time.Minute, "Ready", readyAt("v2"))
		f.assertStored(t, "v2", 300)
		f.assertStoredVersions(t, "v2")
		f.assertOnlyMigration(t, mine.Name)
	})
}

// TestAutoMigrationTwoSwitches: v1beta1 → v1, and → v2 while the first pass
// runs. One StorageMigration follows both; everything ends at v2.
func TestAutoMigrationTwoSwitches(t *testing.T) {
	f := fixture{group: "twice.auto.restow.dev", kind: "Sprocket", plural: "sprockets", namespaced: true}
	f.install(t, "v1beta1", "v1", "v2")
	f.createObjects(t, 1000, tenNamespaces...)
	f.deleteMigrationsAtEnd(t)
	startManagerWith(t, nil, autoOn)

	f.switchStorage(t, "v1")
	waitFor(t, f.crdName(), time.Minute, "started", func(sm *migrationv1alpha1.StorageMigration) bool {
		return sm.Status.TargetVersion == "v1"
	})
	f.switchStorage(t, "v2")
	sm := waitFor(t, f.crdName(), 2*time.Minute, "Ready", readyAt("v2"))
	f.assertStored(t, "v2", 1000)
	f.assertStoredVersions(t, "v2")
	f.assertOnlyMigration(t, sm.Name)
}

// TestAutoMigrationBacklogOnStart: the storage version switched before
// restow was installed; on start-up it migrates the backlog.
func TestAutoMigrationBacklogOnStart(t *testing.T) {
	f := fixture{group: "backlog.auto.restow.dev", kind: "Cog", plural: "cogs"}
	f.install(t, "v1beta1", "v1")
	f.createObjects(t, 500)
	f.switchStorage(t, "v1")
	f.deleteMigrationsAtEnd(t)
	f.assertStored(t, "v1beta1", 500)
	// Without the migration, the API server refuses to drop v1beta1.
	err := f.removeVersion(t, "v1beta1")
	if !apierrors.IsInvalid(err) {
		t.Fatalf("removing v1beta1 before the migration: %v, want Invalid", err)
	}
	t.Logf("Before the migration: %v", err)

	startManagerWith(t, nil, autoOn)
	sm := waitFor(t, f.crdName(), time.Minute, "Ready", readyAt("v1"))
	f.assertStored(t, "v1", 500)
	f.assertStoredVersions(t, "v1")
	if sm.Labels[migrationv1alpha1.AutomaticLabel] != "true" {
		t.Errorf("labels = %v, want the automatic label", sm.Labels)
	}
	if err := f.removeVersion(t, "v1beta1"); err != nil {
		t.Fatalf("removing v1beta1 after the migration: %v", err)
	}
}

// removeVersion removes a version from the CRD's spec.versions.
func (f fixture) removeVersion(t *testing.T, version string) error {
	t.Helper()
	return env.UpdateCRD(t.Context(), f.crdName(), func(crd *apiextensionsv1.CustomResourceDefinition) {
		crd.Spec.Versions = slices.DeleteFunc(crd.Spec.Versions, func(v apiextensionsv1.CustomResourceDefinitionVersion) bool { return v.Name == version })
	})
}
