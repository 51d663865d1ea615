package controllers_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/controllers"
	"github.com/restow/restow/internal/migrator"
)

var tenNamespaces = []string{"ns-0", "ns-1", "ns-2", "ns-3", "ns-4", "ns-5", "ns-6", "ns-7", "ns-8", "ns-9"}

// TestNamespacedCRD: 2,000 objects in 10 namespaces at v1beta1; after the
// storage switch a StorageMigration brings every one to v1 in etcd and
// prunes storedVersions to [v1].
func TestNamespacedCRD(t *testing.T) {
	f := fixture{group: "ns.controllers.restow.dev", kind: "Widget", plural: "widgets", namespaced: true}
	f.install(t, "v1beta1", "v1")
	f.createObjects(t, 2000, tenNamespaces...)
	f.assertStored(t, "v1beta1", 2000)
	f.switchStorage(t, "v1")
	f.assertStored(t, "v1beta1", 2000)
	f.assertStoredVersions(t, "v1beta1", "v1")

	startManager(t, nil)
	pace := watchPace(t, f.crdName())
	sm := f.createMigration(t, nil)
	sm = waitFor(t, sm.Name, 2*time.Minute, "Ready", readyAt("v1"))
	assertHealth(t, sm, kstatus.CurrentStatus)

	f.assertStored(t, "v1", 2000)
	f.assertStoredVersions(t, "v1")
	if highest := pace(); highest < 1 || highest > migrator.DefaultConcurrency {
		t.Errorf("restow_pass_concurrency peaked at %v during the pass, want 1 to %d", highest, migrator.DefaultConcurrency)
	}
	if now := metricValue(t, "restow_pass_concurrency", map[string]string{"resource": f.crdName()}); now != 0 {
		t.Errorf("restow_pass_concurrency = %v after the pass, want 0", now)
	}
	last := sm.Status.LastPass
	if last == nil || last.Listed != 2000 || last.Migrated+last.AlreadyStored+last.Skipped != 2000 || last.Failed != 0 || last.TargetVersion != "v1" {
		t.Fatalf("lastPass = %+v, want 2000 listed, all migrated, target v1", last)
	}
	if len(last.PrunedVersions) != 1 || last.PrunedVersions[0] != "v1beta1" {
		t.Errorf("lastPass.prunedVersions = %v, want [v1beta1]", last.PrunedVersions)
	}
	resource := map[string]string{"resource": f.crdName()}
	migrated := metricValue(t, "restow_objects_total", map[string]string{"resource": f.crdName(), "outcome": "migrated"})
	skipped := metricValue(t, "restow_objects_total", map[string]string{"resource": f.crdName(), "outcome": "skipped"})
	if migrated+skipped != 2000 || migrated != float64(last.Migrated) {
		t.Errorf("restow_objects_total: migrated %v, skipped %v; want them to add up to 2000, migrated %d", migrated, skipped, last.Migrated)
	}
	for name, got := range map[string]float64{
		"restow_passes_total":                metricValue(t, "restow_passes_total", map[string]string{"resource": f.crdName(), "result": "succeeded"}),
		"restow_pass_duration_seconds":       metricValue(t, "restow_pass_duration_seconds", resource),
		"restow_storedversions_prunes_total": metricValue(t, "restow_storedversions_prunes_total", resource),
	} {
		if got != 1 {
			t.Errorf("%s = %v, want 1", name, got)
		}
	}
	if sm.Status.Progress != nil || sm.Status.TargetVersion != "v1" {
		t.Errorf("status.progress = %+v, targetVersion = %q; want no progress, target v1", sm.Status.Progress, sm.Status.TargetVersion)
	}
}

// TestClusterScopedCRD: the same proof for a cluster-scoped resource.
func TestClusterScopedCRD(t *testing.T) {
	f := fixture{group: "cluster.controllers.restow.dev", kind: "Gadget", plural: "gadgets"}
	f.install(t, "v1beta1", "v1")
	f.createObjects(t, 500)
	f.switchStorage(t, "v1")
	f.assertStored(t, "v1beta1", 500)

	startManager(t, nil)
	sm := f.createMigration(t, nil)
	waitFor(t, sm.Name, time.Minute, "Ready", readyAt("v1"))
	f.assertStored(t, "v1", 500)
	f.assertStoredVersions(t, "v1")
}

// TestMissingResourceStallsThenRecovers: a StorageMigration for a resource
// that does not exist is Stalled with reason Unsupported and recovers by
// itself when the CRD appears; every step is told by an event.
func TestMissingResourceStallsThenRecovers(t *testing.T) {
	f := fixture{group: "late.controllers.restow.dev", kind: "Sprocket", plural: "sprockets"}
	// A window long enough for status to show Settling.
	startManagerWith(t, nil, controllers.Options{SettleWindow: 3 * time.Second})
	sm := f.createMigration(t, nil)
	sm = waitFor(t, sm.Name, 30*time.Second, "Stalled", hasCondition(migrationv1alpha1.StalledCondition, migrationv1alpha1.UnsupportedReason))
	assertHealth(t, sm, kstatus.FailedStatus)
	if c := meta.FindStatusCondition(sm.Status.Conditions, migrationv1alpha1.ReadyCondition); c == nil || c.Status != "False" {
		t.Errorf("Ready = %+v, want False", c)
	}
	// A stall before any pass is told as an event too, once per cause.
	if e := waitEvent(t, sm.Name, migrationv1alpha1.UnsupportedReason); e.Type != "Warning" || !strings.Contains(e.Note, f.crdName()) {
		t.Errorf("event %s %q, want a Warning naming %s", e.Type, e.Note, f.crdName())
	}
	// And by the metric the RestowMigrationStalled alert reads: no pass
	// ended, so restow_passes_total cannot say it.
	stalledGauge := map[string]string{"storagemigration": sm.Name, "resource": f.crdName()}
	if got := metricValue(t, "restow_migration_stalled", stalledGauge); got != 1 {
		t.Errorf("restow_migration_stalled = %v while Stalled before any pass, want 1", got)
	}

	f.install(t, "v1beta1", "v1")
	f.createObjects(t, 20)
	f.switchStorage(t, "v1")
	waitFor(t, sm.Name, time.Minute, "Ready", readyAt("v1"))
	f.assertStored(t, "v1", 20)
	f.assertStoredVersions(t, "v1")
	if got := metricValue(t, "restow_migration_stalled", stalledGauge); got != 0 {
		t.Errorf("restow_migration_stalled = %v once Ready, want 0", got)
	}

	// Each transition has its event, in order: the stall first; at the end
	// the pass at v1, the settle window (told by the change of the Ready
	// reason), the success and the prune. (Between them, depending on when
	// the CRD became established, a wait and a pass at v1beta1.)
	end := []string{"PassStarted", migrationv1alpha1.SettlingReason, migrationv1alpha1.SucceededReason, "Pruned"}
	got := waitEventReasons(t, sm.Name, end...)
	if len(got) < 5 || got[0] != migrationv1alpha1.UnsupportedReason || !slices.Equal(got[len(got)-4:], end) {
		t.Errorf("events of %s: %v, want %s first and %v last", sm.Name, got, migrationv1alpha1.UnsupportedReason, end)
	}
	// kubectl events -n default --for storagemigration/NAME finds them: it
	// lists core/v1 events with this field selector (k8s.io/kubectl's events
	// command).
	var core corev1.EventList
	if err := env.Client.List(t.Context(), &core, client.InNamespace(metav1.NamespaceDefault), client.MatchingFieldsSelector{Selector: fields.AndSelectors(
		fields.OneTermEqualSelector("involvedObject.kind", "StorageMigration"),
		fields.OneTermEqualSelector("involvedObject.apiVersion", migrationv1alpha1.GroupVersion.String()),
		fields.OneTermEqualSelector("involvedObject.name", sm.Name))}); err != nil {
		t.Fatal(err)
	}
	if len(core.Items) != len(got) {
		t.Errorf("kubectl events' selector found %d events of %s, want %d", len(core.Items), sm.Name, len(got))
	}
}

// TestSettlingToldWhenNoLookSawIt: a run whose settle window passed while
// no reconcile looked (here a window shorter than the pass, and no look
// between the run's start and its end) still says it settled: its events
// end Settling, Succeeded, Pruned, as when status showed the window.
func TestSettlingToldWhenNoLookSawIt(t *testing.T) {
	f := fixture{group: "unseen.controllers.restow.dev", kind: "Widget", plural: "widgets"}
	f.install(t, "v1beta1", "v1")
	f.createObjects(t, 20)
	f.switchStorage(t, "v1")
	startManagerWith(t, nil, controllers.Options{SettleWindow: time.Millisecond, StatusInterval: time.Hour})
	sm := f.createMigration(t, nil)
	waitFor(t, sm.Name, time.Minute, "Ready", readyAt("v1"))
	f.assertStored(t, "v1", 20)
	f.assertStoredVersions(t, "v1")
	end := []string{"PassStarted", migrationv1alpha1.SettlingReason, migrationv1alpha1.SucceededReason, "Pruned"}
	if got := waitEventReasons(t, sm.Name, end...); !slices.Equal(got[len(got)-len(end):], end) {
		t.Errorf("events of %s: %v, want %v last", sm.Name, got, end)
	}
}

// waitEventReasons waits until a StorageMigration has an event of each of
// the reasons (each is written by a goroutine of its own, so one seen says
// nothing of the others), then lists the reasons of all, oldest first.
func waitEventReasons(t *testing.T, name string, reasons ...string) []string {
	t.Helper()
	for _, reason := range reasons {
		waitEvent(t, name, reason)
	}
	return eventReasons(t, name)
}

// eventReasons lists the reasons of a StorageMigration's events, oldest first.
func eventReasons(t *testing.T, name string) []string {
	t.Helper()
	events := smEvents(t, name)
	reasons := make([]string, 0, len(events))
	for _, e := range events {
		reasons = append(reasons, e.Reason)
		t.Logf("event of %s: %s %s: %s", name, e.Type, e.Reason, e.Note)
	}
	return reasons
}

// smEvents lists a StorageMigration's events, oldest first.
func smEvents(t *testing.T, name string) []eventsv1.Event {
	t.Helper()
	var list eventsv1.EventList
	if err := env.Client.List(t.Context(), &list, client.InNamespace(metav1.NamespaceDefault)); err != nil {
		t.Fatal(err)
	}
	var events []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.Kind == "StorageMigration" && e.Regarding.Name == name {
			events = append(events, e)
		}
	}
	slices.SortFunc(events, func(a, b eventsv1.Event) int { return a.EventTime.Compare(b.EventTime.Time) })
	return events
}

// TestBuiltInResourceReRunOnRequest: a StorageMigration for a built-in
// resource (no CRD, no storedVersions) runs a pass when created and another
// each time the re-run annotation gets a new token, as after rotating an
// encryption key.
func TestBuiltInResourceReRunOnRequest(t *testing.T) {
	ctx := t.Context()
	createConfigMaps(t, "builtin", 30)
	startManager(t, nil)
	sm := &migrationv1alpha1.StorageMigration{
		ObjectMeta: metav1.ObjectMeta{Name: "configmaps"},
		Spec:       migrationv1alpha1.StorageMigrationSpec{Resource: migrationv1alpha1.GroupResource{Resource: "configmaps"}},
	}
	if err := env.Client.Create(ctx, sm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), sm) })
	sm = waitFor(t, sm.Name, time.Minute, "Ready", readyAt("v1"))
	first := sm.Status.LastPass
	if first.Listed < 30 || first.Failed != 0 {
		t.Fatalf("first pass %+v, want at least the 30 ConfigMaps listed", first.ObjectCounts)
	}

	const token = "2026-11-21T12:00:00Z"
	sm.Annotations = map[string]string{migrationv1alpha1.ReRunAnnotation: token}
	if err := env.Client.Update(ctx, sm); err != nil {
		t.Fatal(err)
	}
	// The token is recorded when the pass starts (Reconciling), Ready comes
	// only when it ends; the metric counts the two passes.
	sm = waitFor(t, sm.Name, time.Minute, "re-run", func(sm *migrationv1alpha1.StorageMigration) bool {
		return readyAt("v1")(sm) && sm.Status.LastHandledReRunToken == token
	})
	if got := metricValue(t, "restow_passes_total", map[string]string{"resource": "configmaps", "result": "succeeded"}); got != 2 {
		t.Errorf("restow_passes_total{resource=configmaps,result=succeeded} = %v, want 2 (creation and re-run)", got)
	}
	if sm.Status.LastPass.Listed < 30 {
		t.Errorf("re-run pass listed %d objects, want at least 30", sm.Status.LastPass.Listed)
	}
	assertConfigMapsStoredAtV1(t, "builtin", 30)
}

// TestBaselineKeepsFirstSight: a built-in resource's baseline is what the
// API servers published when restow first saw it. When they publish
// another hash by the time the baseline is recorded (an upgrade while it
// waited for passes), the objects are re-stored from it, not taken to be
// stored at the new version.
func TestBaselineKeepsFirstSight(t *testing.T) {
	ctx := t.Context()
	createConfigMaps(t, "first-sight", 20)
	startManager(t, nil)
	const seen = "Rm9yZWln" // a hash the API server does not publish for configmaps
	sm := createConfigMapsBaseline(t, metav1.ObjectMeta{Name: "first-sight", Annotations: map[string]string{migrationv1alpha1.FirstSeenHashAnnotation: seen}})
	sm = waitFor(t, sm.Name, time.Minute, "a pass from the first sight", func(sm *migrationv1alpha1.StorageMigration) bool {
		return readyAt("v1")(sm) && sm.Status.LastPass != nil
	})
	// The pass's own summary replaces the baseline it started from; its
	// event says which that was.
	want := "the storage version moved from storageVersionHash " + seen + ", the baseline, to v1"
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return slices.ContainsFunc(smEvents(t, sm.Name), func(e eventsv1.Event) bool {
			return e.Reason == "PassStarted" && strings.Contains(e.Note, want)
		}), nil
	}); err != nil {
		eventReasons(t, sm.Name)
		t.Fatalf("no PassStarted event saying %q: %v", want, err)
	}
	if sm.Status.LastPass.Listed < 20 || sm.Status.LastPass.Failed != 0 {
		t.Errorf("pass %+v, want at least the 20 ConfigMaps listed and none failed", sm.Status.LastPass.ObjectCounts)
	}
	assertConfigMapsStoredAtV1(t, "first-sight", 20)
}

// TestUnstampedAutomaticBaselineRuns: a StorageMigration the trigger of
// built-in resources made without its stamp of first sight was made while
// it could not read every API server. Where restow reads every server now,
// it records no baseline on trust but runs a pass at once, and the objects
// are stored at the storage version in etcd.
func TestUnstampedAutomaticBaselineRuns(t *testing.T) {
	createConfigMaps(t, "unstamped", 20)
	startManager(t, nil)
	sm := createConfigMapsBaseline(t, metav1.ObjectMeta{Name: "unstamped", Labels: map[string]string{migrationv1alpha1.AutomaticLabel: "true", migrationv1alpha1.BuiltInLabel: "true"}})
	sm = waitFor(t, sm.Name, time.Minute, "a pass in place of an unproven baseline", func(sm *migrationv1alpha1.StorageMigration) bool {
		return readyAt("v1")(sm) && (sm.Status.LastPass != nil || sm.Status.Baseline != nil)
	})
	if sm.Status.LastPass == nil || sm.Status.Baseline != nil {
		t.Fatalf("lastPass %+v, baseline %+v: want a pass and no baseline", sm.Status.LastPass, sm.Status.Baseline)
	}
	if sm.Status.LastPass.Listed < 20 || sm.Status.LastPass.Failed != 0 {
		t.Errorf("pass %+v, want at least the 20 ConfigMaps listed and none failed", sm.Status.LastPass.ObjectCounts)
	}
	assertConfigMapsStoredAtV1(t, "unstamped", 20)
}

// createConfigMapsBaseline creates a StorageMigration of ConfigMaps that
// skips its first pass (spec.firstPass: Skip), as the trigger of built-in
// resources makes them, with meta's name, labels and annotations, and
// deletes it when the test ends.
func createConfigMapsBaseline(t *testing.T, meta metav1.ObjectMeta) *migrationv1alpha1.StorageMigration {
	t.Helper()
	sm := &migrationv1alpha1.StorageMigration{
		ObjectMeta: meta,
		Spec: migrationv1alpha1.StorageMigrationSpec{
			Resource:  migrationv1alpha1.GroupResource{Resource: "configmaps"},
			FirstPass: migrationv1alpha1.FirstPassSkip,
		},
	}
	if err := env.Client.Create(t.Context(), sm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), sm) })
	return sm
}

// createConfigMaps creates n ConfigMaps, cm-00 on, in namespace.
func createConfigMaps(t *testing.T, namespace string, n int) {
	t.Helper()
	ensureNamespaces(t, namespace)
	for i := range n {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: fmt.Sprintf("cm-%02d", i)}, Data: map[string]string{"k": "v"}}
		if err := env.Client.Create(t.Context(), cm); err != nil {
			t.Fatal(err)
		}
	}
}

// assertConfigMapsStoredAtV1 reads createConfigMaps' n ConfigMaps from etcd.
func assertConfigMapsStoredAtV1(t *testing.T, namespace string, n int) {
	t.Helper()
	for i := range n {
		stored, err := env.ReadStored(t.Context(), "", "configmaps", namespace, fmt.Sprintf("cm-%02d", i))
		if err != nil || stored.APIVersion != "v1" {
			t.Fatalf("%s/cm-%02d in etcd: %q, %v", namespace, i, stored.APIVersion, err)
		}
	}
}
