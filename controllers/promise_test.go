package controllers_test

// Tests of the one promise: status.storedVersions loses a version only when
// etcd holds no object at it any more. Each closes one path to an early
// prune; each asserts from etcd.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/controllers"
	"github.com/restow/restow/internal/testenv"
)

const (
	// holdFor is how long the admission webhook holds a request.
	holdFor = 3 * time.Second
	// heldSettleWindow outlasts a write held twice (it conflicts once and
	// the API server retries it), as the default window outlasts twice the
	// API server's request timeout.
	heldSettleWindow = 10 * time.Second
	heldLabel        = "restow.dev/held"
)

// TestHeldWriteDuringSwitch: a writer's merge patch without resourceVersion
// begins on the old storage just before the storage switch and is held by a
// slow validating webhook. It commits at v1beta1 after restow rewrote the
// object (writer held), or before restow's own held rewrite, which then
// conflicts (both held). Either way restow must not prune until that write
// has committed and the object is rewritten again.
func TestHeldWriteDuringSwitch(t *testing.T) {
	for _, tt := range []struct {
		name    string
		group   string
		holdAll bool
	}{
		{"writer held", "held.controllers.restow.dev", false},
		{"writer and rewrite held", "heldboth.controllers.restow.dev", true},
	} {
		t.Run(tt.name, func(t *testing.T) { testHeldWrite(t, tt.group, tt.holdAll) })
	}
}

func testHeldWrite(t *testing.T, group string, holdAll bool) {
	ctx := t.Context()
	f := fixture{group: group, kind: "Sprocket", plural: "sprockets", namespaced: true, labels: map[string]string{"restow.dev/test": group}}
	f.install(t, "v1beta1", "v1")
	const total, held = 200, "obj-00042"
	f.createObjects(t, total, "held")
	heldObj := f.object("v1beta1", "held", held, nil)
	if err := env.Client.Patch(ctx, heldObj, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"`+heldLabel+`":"true"}}}`))); err != nil {
		t.Fatal(err)
	}
	var holds atomic.Int64
	hook := testenv.StartAdmissionWebhook(t, func(_ *admissionv1.AdmissionRequest, obj, old *unstructured.Unstructured) *admissionv1.AdmissionResponse {
		// restow's rewrite changes nothing; the writer changes spec.
		if holdAll || !equality.Semantic.DeepEqual(obj.Object["spec"], old.Object["spec"]) {
			holds.Add(1)
			time.Sleep(holdFor)
		}
		return &admissionv1.AdmissionResponse{Allowed: true}
	})
	hook.Register(t, env, f.group, f.plural, map[string]string{heldLabel: "true"}, heldObj)

	f.deleteMigrationsAtEnd(t)
	startManagerWith(t, nil, controllers.Options{AutoMigrate: true, AutoMigrateSelector: labels.SelectorFromSet(f.labels), SettleWindow: heldSettleWindow})
	observer := env.ObservePrunes(t, f.group, f.plural, 50*time.Millisecond)

	written := make(chan error, 1)
	start := time.Now()
	go func() {
		patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"size":2}}`))
		written <- env.Client.Patch(context.Background(), f.object("v1", "held", held, nil), patch)
	}()
	// The write has begun on the old storage when the switch lands.
	time.Sleep(200 * time.Millisecond)
	f.switchStorage(t, "v1")
	var settling *migrationv1alpha1.PassProgress
	sm := waitFor(t, f.crdName(), 2*time.Minute, "Ready", func(sm *migrationv1alpha1.StorageMigration) bool {
		if hasCondition(migrationv1alpha1.ReconcilingCondition, migrationv1alpha1.SettlingReason)(sm) && settling == nil {
			settling = sm.Status.Progress
		}
		return readyAt("v1")(sm)
	})
	if err := <-written; err != nil {
		t.Fatalf("the held write failed: %v", err)
	}
	t.Logf("the webhook held %d requests; Ready %s after the write began; lastPass %+v", holds.Load(), time.Since(start).Round(100*time.Millisecond), sm.Status.LastPass.ObjectCounts)

	observer.AssertNoEarlyPrune(t, true)
	f.assertStored(t, "v1", total)
	f.assertStoredVersions(t, "v1")
	stored, err := env.ReadStored(ctx, f.group, f.plural, "held", held)
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Spec struct {
			Size int64 `json:"size"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(stored.Raw, &body); err != nil || body.Spec.Size != 2 {
		t.Errorf("etcd holds spec.size %d (%v) for the held object, want the writer's 2", body.Spec.Size, err)
	}
	if sm.Status.LastPass.Rechecked < 1 {
		t.Errorf("lastPass.rechecked = %d, want the held object rewritten again", sm.Status.LastPass.Rechecked)
	}
	if settling == nil || settling.SettleUntil == nil || settling.Phase != migrationv1alpha1.PassSettling {
		t.Errorf("status.progress while Reconciling/Settling = %+v, want phase Settling and settleUntil", settling)
	}
}

// TestUnconfirmedNotFoundOrConflictFails: an admission webhook answers 404
// for one object and 409 for another, both still stored at v1beta1. Neither
// is "gone" or "changed by others": both fail, nothing is pruned.
func TestUnconfirmedNotFoundOrConflictFails(t *testing.T) {
	ctx := t.Context()
	f := fixture{group: "liar.controllers.restow.dev", kind: "Cog", plural: "cogs", namespaced: true}
	f.install(t, "v1beta1", "v1")
	const total = 100
	f.createObjects(t, total, "liar")
	answers := map[string]int32{"obj-00003": 404, "obj-00005": 409}
	for name := range answers {
		if err := env.Client.Patch(ctx, f.object("v1beta1", "liar", name, nil), client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"restow.dev/liar":"true"}}}`))); err != nil {
			t.Fatal(err)
		}
	}
	hook := testenv.StartAdmissionWebhook(t, func(_ *admissionv1.AdmissionRequest, obj, _ *unstructured.Unstructured) *admissionv1.AdmissionResponse {
		code := answers[obj.GetName()]
		reason := map[int32]metav1.StatusReason{404: metav1.StatusReasonNotFound, 409: metav1.StatusReasonConflict}[code]
		return &admissionv1.AdmissionResponse{Allowed: false, Result: &metav1.Status{Code: code, Reason: reason, Message: "the webhook says so"}}
	})
	hook.Register(t, env, f.group, f.plural, map[string]string{"restow.dev/liar": "true"}, f.object("v1beta1", "liar", "obj-00003", nil))
	f.switchStorage(t, "v1")

	startManager(t, nil)
	sm := f.createMigration(t, nil)
	sm = waitFor(t, sm.Name, time.Minute, "Stalled", hasCondition(migrationv1alpha1.StalledCondition, migrationv1alpha1.ObjectsFailedReason))
	got := map[string]string{}
	for _, fo := range sm.Status.FailedObjects {
		got[fo.Name] = fo.Reason
	}
	if want := map[string]string{"obj-00003": "NotFound", "obj-00005": "Conflict"}; !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("failedObjects = %+v, want %v", sm.Status.FailedObjects, want)
	}
	f.fx().AssertStored(t, map[string]int{"v1": total - 2, "v1beta1": 2})
	f.assertStoredVersions(t, "v1beta1", "v1")
}

// TestViaStatusWithoutStatusSubresource: rewriting through /status a CRD
// version that has none would answer 404 for every object. It stalls at
// once, naming what to change, and rewrites and prunes nothing.
func TestViaStatusWithoutStatusSubresource(t *testing.T) {
	f := fixture{group: "nostatus.controllers.restow.dev", kind: "Gear", plural: "gears", namespaced: true,
		mutate: func(crd *apiextensionsv1.CustomResourceDefinition) {
			for i := range crd.Spec.Versions {
				crd.Spec.Versions[i].Subresources = nil
			}
		}}
	f.install(t, "v1beta1", "v1")
	f.createObjects(t, 50, "nostatus")
	f.switchStorage(t, "v1")

	startManager(t, nil)
	sm := f.createMigration(t, func(sm *migrationv1alpha1.StorageMigration) { sm.Spec.RewriteViaStatus = ptr.To(true) })
	sm = waitFor(t, sm.Name, time.Minute, "Stalled", hasCondition(migrationv1alpha1.StalledCondition, migrationv1alpha1.UnsupportedReason))
	if msg := readyMessage(sm); !strings.Contains(msg, "subresources.status") {
		t.Errorf("Ready message = %q, want it to say what to change", msg)
	}
	f.assertStored(t, "v1beta1", 50)
	f.assertStoredVersions(t, "v1beta1", "v1")
}

func readyMessage(sm *migrationv1alpha1.StorageMigration) string {
	for _, c := range sm.Status.Conditions {
		if c.Type == migrationv1alpha1.ReadyCondition {
			return c.Message
		}
	}
	return ""
}

// TestResumeAcrossCRDChange: the manager stops mid-pass; while it is down
// the storage version goes v1 -> v2 -> v1 with writes at each. The saved
// continue token would skip the pages already done, whose objects now sit
// at v2: the pass must start over.
func TestResumeAcrossCRDChange(t *testing.T) {
	ctx := t.Context()
	f := fixture{group: "away.controllers.restow.dev", kind: "Widget", plural: "widgets", namespaced: true}
	f.install(t, "v1beta1", "v1", "v2")
	const total = 2000
	f.createObjects(t, total, "a-0", "a-1")
	f.switchStorage(t, "v1")

	stop := startManager(t, nil)
	sm := f.createMigration(t, func(sm *migrationv1alpha1.StorageMigration) {
		sm.Spec.Concurrency = ptr.To[int32](1)
		sm.Spec.PageSize = ptr.To[int32](100)
	})
	waitFor(t, sm.Name, time.Minute, "part-way", func(sm *migrationv1alpha1.StorageMigration) bool {
		return sm.Status.Progress != nil && sm.Status.Progress.ContinueToken != "" && sm.Status.Progress.Migrated >= 500
	})
	stop()

	write := func(version string, from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			u := f.object(version, []string{"a-0", "a-1"}[i%2], fmt.Sprintf("obj-%05d", i), nil)
			if err := env.Client.Patch(ctx, u, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"size":7}}`))); err != nil {
				t.Fatal(err)
			}
		}
	}
	f.switchStorage(t, "v2")
	write("v2", 0, 200) // in the pages the first manager had done
	f.switchStorage(t, "v1")
	write("v1", 200, 220)
	if counts, err := f.fx().StoredCounts(ctx); err != nil || counts["v2"] != 200 {
		t.Fatalf("etcd holds %v (%v) before the restart, want 200 objects at v2", counts, err)
	}

	observer := env.ObservePrunes(t, f.group, f.plural, 100*time.Millisecond)
	startManager(t, nil)
	sm = waitFor(t, sm.Name, 2*time.Minute, "Ready", readyAt("v1"))
	observer.AssertNoEarlyPrune(t, true)
	f.assertStored(t, "v1", total)
	f.assertStoredVersions(t, "v1")
	last := sm.Status.LastPass
	if last.Listed != total || last.Migrated+last.AlreadyStored+last.Skipped != total || last.Failed != 0 {
		t.Errorf("lastPass = %+v, want a pass over all %d objects from the start", last.ObjectCounts, total)
	}
}

// TestOneUnconvertibleObjectDoesNotBlockTheRest: the conversion webhook
// refuses two objects, one on the first page and one on a later page, so
// every list page holding them fails through the storage version. Every
// other object is rewritten, both are named, nothing is pruned; once the
// webhook converts them, the migration heals and prunes.
func TestOneUnconvertibleObjectDoesNotBlockTheRest(t *testing.T) {
	hook := testenv.StartConversionWebhook(t, func(*unstructured.Unstructured, string) error { return nil })
	f := fixture{group: "refused.controllers.restow.dev", kind: "Knob", plural: "knobs", namespaced: true, conversion: hook.Conversion()}
	f.install(t, "v1beta1", "v1")
	const total = 2000
	f.createObjects(t, total, "refused")
	refused := []string{"obj-00000", "obj-01700"}
	hook.Refuse(true, refused...)
	f.switchStorage(t, "v1")

	startManager(t, nil)
	sm := f.createMigration(t, nil)
	// The refused objects are found by bisecting their pages, list after
	// list, while the status shows no count move: the webhook's conversions
	// are the work then.
	conversions := func() string { return fmt.Sprintf("%d conversions", hook.Conversions.Load()) }
	sm = waitFor(t, sm.Name, time.Minute, "Stalled", hasCondition(migrationv1alpha1.StalledCondition, migrationv1alpha1.ObjectsFailedReason), conversions)
	names := make([]string, 0, len(sm.Status.FailedObjects))
	for _, fo := range sm.Status.FailedObjects {
		names = append(names, fo.Name)
	}
	slices.Sort(names)
	if !slices.Equal(names, refused) {
		t.Errorf("failedObjects = %+v, want %v", sm.Status.FailedObjects, refused)
	}
	f.fx().AssertStored(t, map[string]int{"v1": total - 2, "v1beta1": 2})
	f.assertStoredVersions(t, "v1beta1", "v1")

	hook.Refuse(false, refused...)
	waitFor(t, sm.Name, time.Minute, "Ready", readyAt("v1"))
	f.assertStored(t, "v1", total)
	f.assertStoredVersions(t, "v1")
}

// TestUnservedStorageVersionStalls: a storage version with served: false has
// no storageVersionHash in discovery, so the switch cannot be confirmed. The
// migration stalls saying what to change, instead of waiting silently, and
// migrates once the version is served.
func TestUnservedStorageVersionStalls(t *testing.T) {
	ctx := t.Context()
	f := fixture{group: "unserved.controllers.restow.dev", kind: "Lever", plural: "levers", namespaced: true}
	f.install(t, "v1beta1", "v1")
	f.createObjects(t, 20, "unserved")
	crd := f.crd(t)
	for i := range crd.Spec.Versions {
		v := &crd.Spec.Versions[i]
		v.Storage = v.Name == "v1"
		v.Served = v.Name != "v1"
	}
	if err := env.Client.Update(ctx, crd); err != nil {
		t.Fatalf("the API server refused an unserved storage version: %v", err)
	}

	startManager(t, nil)
	sm := f.createMigration(t, nil)
	sm = waitFor(t, sm.Name, time.Minute, "Stalled", hasCondition(migrationv1alpha1.StalledCondition, migrationv1alpha1.UnsupportedReason))
	if msg := readyMessage(sm); !strings.Contains(msg, "not served") || !strings.Contains(msg, "served: true") {
		t.Errorf("Ready message = %q, want it to say the storage version must be served", msg)
	}
	f.assertStored(t, "v1beta1", 20)

	if err := env.UpdateCRD(ctx, f.crdName(), func(crd *apiextensionsv1.CustomResourceDefinition) {
		for i := range crd.Spec.Versions {
			crd.Spec.Versions[i].Served = true
		}
	}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, sm.Name, time.Minute, "Ready", readyAt("v1"))
	f.assertStored(t, "v1", 20)
	f.assertStoredVersions(t, "v1")
}

// TestStorageSwitchMidPassWithoutPruning: with pruning off, a storage switch
// during a pass still ends in a pass at the new target, not Ready at the old.
func TestStorageSwitchMidPassWithoutPruning(t *testing.T) {
	f := fixture{group: "noprune.controllers.restow.dev", kind: "Whatsit", plural: "whatsits", namespaced: true}
	f.install(t, "v1beta1", "v1", "v2")
	const total = 1500
	f.createObjects(t, total, "np-0")
	f.switchStorage(t, "v1")

	startManager(t, nil)
	sm := f.slowPassUnderWay(t, func(sm *migrationv1alpha1.StorageMigration) { sm.Spec.PruneStoredVersions = ptr.To(false) })
	f.switchStorage(t, "v2")
	waitFor(t, sm.Name, 2*time.Minute, "Ready at v2", readyAt("v2"))
	f.assertStored(t, "v2", total)
	if got := f.storedVersions(t); len(got) != 3 {
		t.Errorf("status.storedVersions = %v, want all three kept (pruning is off)", got)
	}
}

// TestSpecChangeMidPassIsActedOn: a spec change during a pass restarts it
// with the new knobs, and the migration ends Ready for the new generation:
// observedGeneration catches up, so kstatus reads Current, not InProgress.
func TestSpecChangeMidPassIsActedOn(t *testing.T) {
	ctx := t.Context()
	f := fixture{group: "respec.controllers.restow.dev", kind: "Dial", plural: "dials", namespaced: true}
	f.install(t, "v1beta1", "v1")
	const total = 1000
	f.createObjects(t, total, "respec")
	f.switchStorage(t, "v1")

	startManager(t, nil)
	sm := f.slowPassUnderWay(t, nil)
	if err := env.Client.Patch(ctx, sm, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"concurrency":8}}`))); err != nil {
		t.Fatal(err)
	}
	sm = waitFor(t, sm.Name, 2*time.Minute, "Ready", readyAt("v1"))
	if sm.Generation != 2 || sm.Status.ObservedGeneration != 2 {
		t.Errorf("generation %d, observedGeneration %d; want both 2", sm.Generation, sm.Status.ObservedGeneration)
	}
	assertHealth(t, sm, kstatus.CurrentStatus)
	f.assertStored(t, "v1", total)
	f.assertStoredVersions(t, "v1")
}

// TestPruningOffSettlesBeforeReady: with pruning off, a CRD whose
// status.storedVersions still lists the old version can be pruned by hand on
// the migration's word, so the migration is Ready ("stored at") only after
// the settle window and the re-check, and never touches storedVersions.
func TestPruningOffSettlesBeforeReady(t *testing.T) {
	f := fixture{group: "noprune-settle.controllers.restow.dev", kind: "Widget", plural: "widgets", namespaced: true}
	f.install(t, "v1beta1", "v1")
	const total = 50
	f.createObjects(t, total, "nps")
	f.switchStorage(t, "v1")
	switched := time.Now()
	const window = 5 * time.Second
	startManagerWith(t, nil, controllers.Options{SettleWindow: window})
	sm := f.createMigration(t, func(sm *migrationv1alpha1.StorageMigration) { sm.Spec.PruneStoredVersions = ptr.To(false) })
	sm = waitFor(t, sm.Name, time.Minute, "Ready", readyAt("v1"))
	readyTime := time.Now()
	f.assertStored(t, "v1", total)
	f.assertStoredVersions(t, "v1beta1", "v1")
	c := apimeta.FindStatusCondition(sm.Status.Conditions, migrationv1alpha1.ReadyCondition)
	if want := fmt.Sprintf("All %d objects are stored at v1", total); c.Message != want {
		t.Errorf("Ready says %q, want %q", c.Message, want)
	}
	if readyTime.Sub(switched) < window {
		t.Errorf("Ready %s after the switch, within the settle window of %s", readyTime.Sub(switched).Round(time.Millisecond), window)
	}
	if got := eventReasons(t, sm.Name); !slices.Contains(got, migrationv1alpha1.SettlingReason) {
		t.Errorf("events %v: no %s before Ready", got, migrationv1alpha1.SettlingReason)
	}
}
