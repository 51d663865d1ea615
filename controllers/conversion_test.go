package controllers_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/testenv"
)

// renameSchedule is a real schema change between versions: v1beta1 calls the
// field spec.cronSpec, v1 calls it spec.schedule.
func renameSchedule(obj *unstructured.Unstructured, to string) error {
	from, into := "cronSpec", "schedule"
	switch to {
	case "v1":
	case "v1beta1":
		from, into = into, from
	default:
		return errors.New("no conversion to " + to)
	}
	if v, found, _ := unstructured.NestedString(obj.Object, "spec", from); found {
		unstructured.RemoveNestedField(obj.Object, "spec", from)
		return unstructured.SetNestedField(obj.Object, v, "spec", into)
	}
	return nil
}

// conversionFixture installs a CRD with a conversion webhook, n objects
// written at v1beta1 with spec.cronSpec, and switches storage to v1.
func conversionFixture(t *testing.T, group string, n int) (fixture, []client.ObjectKey, *testenv.ConversionWebhook) {
	t.Helper()
	webhook := testenv.StartConversionWebhook(t, renameSchedule)
	f := fixture{group: group, kind: "CronTab", plural: "crontabs", namespaced: true, conversion: webhook.Conversion()}
	f.install(t, "v1beta1", "v1")
	keys := f.createObjects(t, n, "c-0", "c-1")
	for _, k := range keys {
		patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"cronSpec":"*/5 * * * *"}}`))
		if err := env.Client.Patch(t.Context(), f.object("v1beta1", k.Namespace, k.Name, nil), patch); err != nil {
			t.Fatal(err)
		}
	}
	f.switchStorage(t, "v1")
	f.assertStored(t, "v1beta1", n)
	return f, keys, webhook
}

// assertConverted reads every object's raw bytes from etcd: stored at v1,
// with the field under its v1 name.
func assertConverted(t *testing.T, f fixture, keys []client.ObjectKey) {
	t.Helper()
	f.assertStored(t, "v1", len(keys))
	for _, k := range keys {
		stored, err := env.ReadStored(t.Context(), f.group, f.plural, k.Namespace, k.Name)
		if err != nil {
			t.Fatal(err)
		}
		var raw struct {
			Spec map[string]any `json:"spec"`
		}
		if err := json.Unmarshal(stored.Raw, &raw); err != nil {
			t.Fatal(err)
		}
		if raw.Spec["schedule"] != "*/5 * * * *" || raw.Spec["cronSpec"] != nil {
			t.Fatalf("%v is stored with spec %v, want schedule and no cronSpec", k, raw.Spec)
		}
	}
}

// TestConversionWebhook: a CRD whose versions differ (a renamed field) and a
// conversion webhook over TLS. Every object ends stored at v1 with the
// converted field, and storedVersions is pruned.
func TestConversionWebhook(t *testing.T) {
	f, keys, webhook := conversionFixture(t, "webhook.controllers.restow.dev", 300)
	before := webhook.Conversions.Load()
	startManager(t, nil)
	sm := f.createMigration(t, nil)
	waitFor(t, sm.Name, time.Minute, "Ready", readyAt("v1"))
	assertConverted(t, f, keys)
	f.assertStoredVersions(t, "v1")
	if webhook.Conversions.Load()-before < 300 {
		t.Errorf("the webhook converted %d objects during the migration, want at least 300", webhook.Conversions.Load()-before)
	}
}

// TestConversionWebhookFailingIsTransient: the webhook answers 500 for a
// while. The migration stays Reconciling with reason TransientError (never
// Stalled), prunes nothing, and completes once the webhook recovers.
func TestConversionWebhookFailingIsTransient(t *testing.T) {
	f, keys, webhook := conversionFixture(t, "flaky.controllers.restow.dev", 200)
	webhook.SetFailing(true)
	startManager(t, nil)
	sm := f.createMigration(t, nil)
	sm = waitFor(t, sm.Name, time.Minute, "Reconciling/TransientError", hasCondition(migrationv1alpha1.ReconcilingCondition, migrationv1alpha1.TransientErrorReason))
	t.Logf("while the webhook fails: %s", sm.Status.Conditions[0].Message)

	// Keep it failing across at least one paused pass and its resumption.
	deadline := time.Now().Add(8 * time.Second)
	for time.Now().Before(deadline) {
		if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(sm), sm); err != nil {
			t.Fatal(err)
		}
		if hasCondition(migrationv1alpha1.StalledCondition, migrationv1alpha1.ObjectsFailedReason)(sm) ||
			hasCondition(migrationv1alpha1.StalledCondition, migrationv1alpha1.UnsupportedReason)(sm) {
			t.Fatalf("a failing webhook made the migration Stalled: %+v", sm.Status.Conditions)
		}
		f.assertStoredVersions(t, "v1beta1", "v1")
		time.Sleep(200 * time.Millisecond)
	}
	f.assertStored(t, "v1beta1", 200)

	webhook.SetFailing(false)
	waitFor(t, sm.Name, time.Minute, "Ready", readyAt("v1"))
	assertConverted(t, f, keys)
	f.assertStoredVersions(t, "v1")
}
