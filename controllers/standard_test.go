package controllers_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	svmv1 "k8s.io/api/storagemigration/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/controllers"
	"github.com/restow/restow/internal/svm"
	"github.com/restow/restow/internal/testenv"
)

// inTreeUserAgent is the user agent of kube-controller-manager's
// storage-version-migrator controller: the API server names the field
// manager of its writes after the part before the first slash.
const inTreeUserAgent = "kube-controller-manager/v1.37.1 (linux/amd64) kubernetes/3b1c8a2/storage-version-migrator-controller"

// waitForStandard polls a StorageVersionMigration until done says so.
func waitForStandard(t *testing.T, version, name string, timeout time.Duration, what string, done func(*svmv1.StorageVersionMigration) bool) *svmv1.StorageVersionMigration {
	t.Helper()
	var last *svmv1.StorageVersionMigration
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		m, err := env.StandardMigration(ctx, version, name)
		if err != nil {
			return false, err
		}
		last = m
		return done(m), nil
	})
	if err != nil {
		if last == nil {
			t.Fatalf("StorageVersionMigration %s not %s: %v", name, what, err)
		}
		t.Fatalf("StorageVersionMigration %s not %s: %v; status %+v", name, what, err, last.Status)
	}
	return last
}

// statusManagers lists the field managers of a StorageVersionMigration's status.
func statusManagers(m *svmv1.StorageVersionMigration) []string {
	var out []string
	for _, f := range m.ManagedFields {
		if f.Subresource == "status" {
			out = append(out, f.Manager)
		}
	}
	return out
}

// writeAsInTree writes the status of a StorageVersionMigration the way
// kube-controller-manager's in-tree controller does: an update of the status
// subresource, from a client carrying its user agent. No
// kube-controller-manager runs in the test control plane; these writes are
// its footprint on the object, which is all restow can see of it.
func writeAsInTree(t *testing.T, version, name string, mutate func(*svmv1.StorageVersionMigration)) {
	t.Helper()
	env.WriteStandardStatus(t, version, name, inTreeUserAgent, mutate)
}

func condition(t svmv1.MigrationConditionType, reason, message string) metav1.Condition {
	return metav1.Condition{Type: string(t), Status: metav1.ConditionTrue, Reason: reason, Message: message, LastTransitionTime: metav1.Now()}
}

// TestServesStandardStorageVersionMigration: with
// --serve-storage-version-migrations, a StorageVersionMigration shipped
// beside a CRD whose storage version switched is carried to Succeeded by
// restow's engine, every object is re-stored (etcd says so) and the old
// version is pruned from status.storedVersions; restow alone writes its
// status, in the standard shape.
func TestServesStandardStorageVersionMigration(t *testing.T) {
	version := env.StandardVersion(t)
	f := fixture{group: "served.svm.restow.dev", kind: "Gadget", plural: "gadgets", namespaced: true}
	f.install(t, "v1beta1", "v1")
	ensureNamespaces(t, "svm-a", "svm-b")
	f.createObjects(t, 300, "svm-a", "svm-b")
	f.switchStorage(t, "v1")
	f.assertStored(t, "v1beta1", 300)

	startManagerWith(t, nil, controllers.Options{ServeStandard: true, PageSize: 100})
	env.CreateStandardMigration(t, version, "gadgets-to-v1", f.groupResource())

	m := waitForStandard(t, version, "gadgets-to-v1", 2*time.Minute, "Succeeded", func(m *svmv1.StorageVersionMigration) bool {
		return svm.StateOf(m).Final()
	})
	if s := svm.StateOf(m); s != svm.Succeeded {
		t.Fatalf("state %s, want Succeeded; conditions %+v", s, m.Status.Conditions)
	}
	f.assertStored(t, "v1", 300)
	f.assertStoredVersions(t, "v1")

	running := meta.FindStatusCondition(m.Status.Conditions, string(svmv1.MigrationRunning))
	if running == nil || running.Status != metav1.ConditionFalse {
		t.Errorf("Running condition %+v, want False once the migration ended", running)
	}
	if meta.IsStatusConditionTrue(m.Status.Conditions, string(svmv1.MigrationFailed)) {
		t.Errorf("Failed is true beside Succeeded: %+v", m.Status.Conditions)
	}
	if m.Status.ResourceVersion == "" {
		t.Error("status.resourceVersion is empty: it says which objects the migration covers")
	}
	if got := statusManagers(m); !slices.Equal(got, []string{controllers.StatusFieldOwner}) {
		t.Errorf("status field managers %v, want only %s", got, controllers.StatusFieldOwner)
	}
	env.WaitEvent(t, svm.Kind, "gadgets-to-v1", migrationv1alpha1.SucceededReason)
}

// TestStandardMigrationOfAnotherControllerIsLeftAlone: a
// StorageVersionMigration whose status another controller writes (here with
// the in-tree controller's user agent) is never written, nor migrated, by
// restow, which says why in a Warning event: two controllers never write one
// status.
func TestStandardMigrationOfAnotherControllerIsLeftAlone(t *testing.T) {
	version := env.StandardVersion(t)
	f := fixture{group: "intree.svm.restow.dev", kind: "Gizmo", plural: "gizmos"}
	f.install(t, "v1beta1", "v1")
	f.createObjects(t, 50)
	f.switchStorage(t, "v1")
	env.CreateStandardMigration(t, version, "gizmos-to-v1", f.groupResource())
	writeAsInTree(t, version, "gizmos-to-v1", func(m *svmv1.StorageVersionMigration) {
		m.Status.Conditions = append(m.Status.Conditions, condition(svmv1.MigrationRunning, "MigrationRunning", "The migration is running"))
	})

	startManagerWith(t, nil, controllers.Options{ServeStandard: true})
	e := env.WaitEvent(t, svm.Kind, "gizmos-to-v1", controllers.ControllerConflictReason)
	if e.Type != "Warning" {
		t.Errorf("event type %s, want Warning", e.Type)
	}
	// restow has seen the object: give it time to act if it were to.
	time.Sleep(2 * time.Second)
	m, err := env.StandardMigration(t.Context(), version, "gizmos-to-v1")
	if err != nil {
		t.Fatal(err)
	}
	if got := statusManagers(m); slices.Contains(got, controllers.StatusFieldOwner) {
		t.Errorf("restow wrote the status of a migration another controller acts on: managers %v, conditions %+v", got, m.Status.Conditions)
	}
	f.assertStored(t, "v1beta1", 50)
	f.assertStoredVersions(t, "v1beta1", "v1")
}

// TestStandardMigrationHoldsBackAutomaticTrigger: a StorageVersionMigration
// shipped beside the CRD keeps restow's automatic trigger away from the
// resource, which the CRD's events say; restow shows the migration in its
// StorageMigrations' status. Once the other controller ends it Failed, with
// old versions still stored, the trigger takes over and migrates.
func TestStandardMigrationHoldsBackAutomaticTrigger(t *testing.T) {
	version := env.StandardVersion(t)
	f := fixture{group: "defer.svm.restow.dev", kind: "Doohickey", plural: "doohickeys"}
	f.deleteMigrationsAtEnd(t)
	f.install(t, "v1beta1", "v1")
	f.createObjects(t, 40)
	env.CreateStandardMigration(t, version, "doohickeys-to-v1", f.groupResource())
	f.switchStorage(t, "v1")

	startManagerWith(t, nil, controllers.Options{AutoMigrate: true, DeferToStandard: true})
	e := env.WaitEvent(t, "CustomResourceDefinition", f.crdName(), "AutomaticMigrationHeldBack")
	if want := "StorageVersionMigration doohickeys-to-v1 (Pending"; !strings.Contains(e.Note, want) {
		t.Errorf("event says %q, want it to name %q", e.Note, want)
	}
	// The trigger has decided: give it time to change its mind if it were to.
	time.Sleep(2 * time.Second)
	if sms := f.migrations(t, t.Context()); len(sms) != 0 {
		t.Fatalf("the trigger created %s while a StorageVersionMigration is to migrate the resource", sms[0].Name)
	}

	writeAsInTree(t, version, "doohickeys-to-v1", func(m *svmv1.StorageVersionMigration) {
		m.Status.Conditions = append(m.Status.Conditions,
			condition(svmv1.MigrationFailed, "StorageVersionMigrationFailed", "migration encountered unhandled error"))
	})
	sm := waitFor(t, f.crdName(), time.Minute, "Ready at v1", readyAt("v1"))
	f.assertStored(t, "v1", 40)
	f.assertStoredVersions(t, "v1")
	want := []migrationv1alpha1.StandardMigration{{Name: "doohickeys-to-v1", State: "Failed"}}
	if !slices.Equal(sm.Status.StorageVersionMigrations, want) {
		t.Errorf("status.storageVersionMigrations = %+v, want %+v", sm.Status.StorageVersionMigrations, want)
	}
	waitEvent(t, sm.Name, "StorageVersionMigration")
}

// TestDeferToStandardOff: with --defer-to-storage-version-migrations=false
// the trigger migrates beside a pending StorageVersionMigration.
func TestDeferToStandardOff(t *testing.T) {
	version := env.StandardVersion(t)
	f := fixture{group: "nodefer.svm.restow.dev", kind: "Thingamajig", plural: "thingamajigs"}
	f.deleteMigrationsAtEnd(t)
	f.install(t, "v1beta1", "v1")
	f.createObjects(t, 20)
	env.CreateStandardMigration(t, version, "thingamajigs-to-v1", f.groupResource())
	f.switchStorage(t, "v1")

	startManagerWith(t, nil, controllers.Options{AutoMigrate: true})
	sm := waitFor(t, f.crdName(), time.Minute, "Ready at v1", readyAt("v1"))
	f.assertStored(t, "v1", 20)
	want := []migrationv1alpha1.StandardMigration{{Name: "thingamajigs-to-v1", State: "Pending"}}
	if !slices.Equal(sm.Status.StorageVersionMigrations, want) {
		t.Errorf("status.storageVersionMigrations = %+v, want %+v", sm.Status.StorageVersionMigrations, want)
	}
}

// TestServedStandardMigrationFailsNamingTheObject: one object an admission
// policy refuses to rewrite ends a served StorageVersionMigration Failed (a
// final answer, as the API defines it), naming the object, with every other
// object re-stored and nothing pruned.
func TestServedStandardMigrationFailsNamingTheObject(t *testing.T) {
	version := env.StandardVersion(t)
	ctx := t.Context()
	f := fixture{group: "failed.svm.restow.dev", kind: "Widget", plural: "widgets", namespaced: true}
	f.install(t, "v1beta1", "v1")
	f.createObjects(t, 120, "svm-failed")
	const denied = "obj-00042"
	allow, err := env.DenyUpdates(ctx, f.object("v1beta1", "svm-failed", denied, nil), f.plural)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = allow(context.Background()) })
	f.switchStorage(t, "v1")

	startManagerWith(t, nil, controllers.Options{ServeStandard: true})
	env.CreateStandardMigration(t, version, "widgets-to-v1", f.groupResource())
	m := waitForStandard(t, version, "widgets-to-v1", time.Minute, "finished", func(m *svmv1.StorageVersionMigration) bool {
		return svm.StateOf(m).Final()
	})
	if s := svm.StateOf(m); s != svm.Failed {
		t.Fatalf("state %s, want Failed; conditions %+v", s, m.Status.Conditions)
	}
	failed := meta.FindStatusCondition(m.Status.Conditions, string(svmv1.MigrationFailed))
	for _, want := range []string{"1 of 120 objects", "svm-failed/" + denied, testenv.FrozenMessage} {
		if !strings.Contains(failed.Message, want) {
			t.Errorf("Failed message %q does not say %q", failed.Message, want)
		}
	}
	f.fx().AssertStored(t, map[string]int{"v1": 119, "v1beta1": 1})
	f.assertStoredVersions(t, "v1beta1", "v1")
	env.WaitEvent(t, svm.Kind, "widgets-to-v1", migrationv1alpha1.ObjectsFailedReason)
}

func (f fixture) groupResource() schema.GroupResource {
	return schema.GroupResource{Group: f.group, Resource: f.plural}
}

// TestServedStandardMigrationOfAMissingResourceFails: a served
// StorageVersionMigration of a resource the API server does not serve ends
// Failed once its grace is over, with a status the API server accepts: on
// 1.35 that needs a well-formed status.resourceVersion, which restow cannot
// take from a list of a resource that does not exist.
func TestServedStandardMigrationOfAMissingResourceFails(t *testing.T) {
	version := env.StandardVersion(t)
	startManagerWith(t, nil, controllers.Options{ServeStandard: true, UnknownResourceGrace: 2 * time.Second})
	gr := schema.GroupResource{Group: "missing.svm.restow.dev", Resource: "nothings"}
	env.CreateStandardMigration(t, version, "nothings-to-v1", gr)
	m := waitForStandard(t, version, "nothings-to-v1", time.Minute, "finished", func(m *svmv1.StorageVersionMigration) bool {
		return svm.StateOf(m).Final()
	})
	if s := svm.StateOf(m); s != svm.Failed {
		t.Fatalf("state %s, want Failed; conditions %+v", s, m.Status.Conditions)
	}
	if m.Status.ResourceVersion == "" {
		t.Errorf("status.resourceVersion is empty")
	}
	env.WaitEvent(t, svm.Kind, "nothings-to-v1", migrationv1alpha1.UnsupportedReason)
}
