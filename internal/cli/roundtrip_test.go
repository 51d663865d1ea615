//go:build long

package cli_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/restow/restow/internal/cli"
	"github.com/restow/restow/internal/preflight"
	"github.com/restow/restow/internal/testenv"
)

// renamedSchema declares spec.n and spec.note, and the schedule under the
// name field: cron at v1alpha1, schedule at the later versions.
func renamedSchema(field string) *apiextensionsv1.JSONSchemaProps {
	return &apiextensionsv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
		"spec": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
			field:  {Type: "string"},
			"n":    {Type: "integer"},
			"note": {Type: "string"},
		}},
	}}
}

// scheduled is an object's spec at v1alpha1; the first ten carry a note.
func scheduled(i int) map[string]any {
	spec := map[string]any{"cron": fmt.Sprintf("*/%d * * * *", i%59+1), "n": int64(i)}
	if i < 10 {
		spec["note"] = "kept by every version"
	}
	return spec
}

// rescheduled is scheduled at v1beta1 and v1, where cron is schedule.
func rescheduled(i int) map[string]any {
	spec := scheduled(i)
	spec["schedule"] = spec["cron"]
	delete(spec, "cron")
	return spec
}

// renamingWebhook converts spec.cron (v1alpha1) to spec.schedule (v1beta1,
// v1) and back; while lossy says so, it drops spec.note on the way from
// v1alpha1, as a webhook with a bug would, though every version's schema
// declares it.
func renamingWebhook(t *testing.T, lossy func() bool) *testenv.ConversionWebhook {
	return testenv.StartConversionWebhook(t, func(obj *unstructured.Unstructured, to string) error {
		from := obj.GroupVersionKind().Version
		switch {
		case from == "v1alpha1" && to != "v1alpha1":
			cron, _, _ := unstructured.NestedString(obj.Object, "spec", "cron")
			unstructured.RemoveNestedField(obj.Object, "spec", "cron")
			if err := unstructured.SetNestedField(obj.Object, cron, "spec", "schedule"); err != nil {
				return err
			}
			if _, noted, _ := unstructured.NestedString(obj.Object, "spec", "note"); noted && lossy() {
				unstructured.RemoveNestedField(obj.Object, "spec", "note")
			}
		case from != "v1alpha1" && to == "v1alpha1":
			schedule, _, _ := unstructured.NestedString(obj.Object, "spec", "schedule")
			unstructured.RemoveNestedField(obj.Object, "spec", "schedule")
			return unstructured.SetNestedField(obj.Object, schedule, "spec", "cron")
		}
		return nil
	})
}

// renamedCRD is a release of a CRD converted by hook: versions in order,
// the last one the storage version, each served.
func renamedCRD(group string, hook *testenv.ConversionWebhook, versions ...string) *apiextensionsv1.CustomResourceDefinition {
	vs := make([]testenv.CRDVersion, 0, len(versions))
	for i, v := range versions {
		field := "schedule"
		if v == "v1alpha1" {
			field = "cron"
		}
		vs = append(vs, testenv.CRDVersion{Name: v, Served: true, Storage: i == len(versions)-1, Schema: renamedSchema(field)})
	}
	crd := testenv.NewCRD(group, "Gadget", "gadgets", apiextensionsv1.NamespaceScoped, vs...)
	crd.APIVersion, crd.Kind = apiextensionsv1.SchemeGroupVersion.String(), "CustomResourceDefinition"
	crd.Spec.Conversion = hook.Conversion()
	return crd
}

// TestBridgeThroughWebhook: a skipped release of a CRD whose conversion
// webhook (over TLS) renames a field between versions, 2,000 objects, etcd
// read before and after. The API server's reads at two versions cannot be
// compared field by field, so prepare proves a round trip through the
// webhook keeps every field, with the API server's own conversion code.
//
//	(w1) the webhook keeps every field: prepare bridges to v1beta1 (the
//	     one version both serve), the release
//	     applies server-side as "helm" without a conflict, and every
//	     object reads with every field at v1beta1 and v1;
//	(w2) the webhook drops spec.note, set on 10 objects, though every
//	     schema declares it: preflight blocked, naming the 10 objects and
//	     the field, never its value; prepare changes nothing;
//	(w1) also: without --trust-conversion-webhook, blocked, nothing
//	     changed: objects written during the switch are the webhook's;
//	(w3) the check after the switch finds a loss (the webhook drops
//	     spec.note once the storage version is the bridge, as it would
//	     for an object written meanwhile): the storage version is moved
//	     back, nothing is migrated or pruned;
//	(w4) objects left at a dropped version after a switch (an
//	     interrupted prepare), the webhook lossy: prepare blocks before
//	     migrating, nothing changed;
//	(w5) the webhook out of reach: preflight says needs prepare, not
//	     checked from here; prepare fails, nothing changed;
//	(w6) prepare --ahead, the release keeping every stored version, the
//	     webhook lossy: nothing migrated, a warning says why.
func TestBridgeThroughWebhook(t *testing.T) {
	dir := t.TempDir()
	// install applies release N-1 (v1alpha1 stored, v1beta1 served) as
	// helm and writes the objects; it returns the skipped release N+1
	// (v1beta1 and v1, v1 stored) and its manifest.
	install := func(t *testing.T, group string, hook *testenv.ConversionWebhook) (testenv.Fixture, []client.ObjectKey, *apiextensionsv1.CustomResourceDefinition, string) {
		ctx := t.Context()
		fx := testenv.Fixture{Env: env, Group: group, Kind: "Gadget", Plural: "gadgets", Namespaced: true}
		if err := applyAsHelm(ctx, renamedCRD(group, hook, "v1beta1", "v1alpha1")); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.DeleteCRD(context.Background(), fx.CRDName()) })
		if err := env.WaitForCRD(ctx, fx.CRDName()); err != nil {
			t.Fatal(err)
		}
		keys := fx.CreateObjects(t, "v1alpha1", releaseObjects, scheduled, strings.Split(group, ".")[0]+"-webhook")
		next := renamedCRD(group, hook, "v1beta1", "v1")
		if err := applyAsHelm(ctx, next); err == nil || !strings.Contains(err.Error(), `status.storedVersions[0]: Invalid value: "v1alpha1": missing from spec.versions`) {
			t.Fatalf("the skipped release applied: %v, want the API server's refusal", err)
		}
		return fx, keys, next, writeManifest(t, dir, next)
	}

	t.Run("w1: the webhook keeps every field", func(t *testing.T) {
		hook := renamingWebhook(t, func() bool { return false })
		fx, keys, next, release := install(t, "w1.bridge.restow.dev", hook)
		before := crdVersion(t, fx.CRDName())
		// Without --trust-conversion-webhook: blocked, nothing changed.
		out, _, code := restow(t, "preflight", "-f", release)
		if code != cli.ExitBlocked || !strings.Contains(out, "a round trip through it to v1beta1 and back kept every field of every object stored now") || !strings.Contains(out, "--trust-conversion-webhook") {
			t.Errorf("preflight exited %d, want %d and blocked until the webhook is trusted", code, cli.ExitBlocked)
		}
		assertLeftAsItIs(t, fx, release, before, "v1alpha1")
		out, _, code = restow(t, "preflight", "-f", release, "--trust-conversion-webhook")
		if code != cli.ExitPending || !strings.Contains(out, fx.CRDName()+": needs prepare: the manifest drops v1alpha1, the live storage version") {
			t.Errorf("preflight --trust-conversion-webhook exited %d, want %d and needs prepare", code, cli.ExitPending)
		}
		converted := hook.Conversions.Load()
		out, stderr, code := restow(t, "prepare", "-f", release, "--trust-conversion-webhook", "--in-process", "--settle-window", "2s")
		if code != 0 || !strings.Contains(out, fx.CRDName()+": made v1beta1 the live storage version in place of v1alpha1 (as field manager helm") || !strings.Contains(out, fx.CRDName()+": prepared: status.storedVersions lists v1beta1 alone") {
			t.Fatalf("prepare exited %d, want 0, the switch as helm, and prepared", code)
		}
		if !strings.Contains(stderr, "the conversion webhook took every object stored now to v1beta1 and back without loss") {
			t.Errorf("prepare does not say the round trip was made")
		}
		// Two round trips (before and after the switch) of every object,
		// each through the webhook both ways, besides the API server's.
		if n := hook.Conversions.Load() - converted; n < 4*releaseObjects {
			t.Errorf("the webhook converted %d objects during prepare, want at least %d: no round trip", n, 4*releaseObjects)
		}
		fx.AssertAllStoredAt(t, "v1beta1", releaseObjects)
		fx.AssertStoredVersions(t, "v1beta1")
		if err := applyAsHelm(t.Context(), next); err != nil {
			t.Fatalf("the release after prepare: %v", err)
		}
		assertReadsAt(t, fx, keys, rescheduled, "v1beta1", "v1")
	})

	t.Run("w2: the webhook drops a field", func(t *testing.T) {
		hook := renamingWebhook(t, func() bool { return true })
		fx, keys, _, release := install(t, "w2.bridge.restow.dev", hook)
		before := crdVersion(t, fx.CRDName())
		out, _, code := restow(t, "preflight", "-f", release, "--trust-conversion-webhook")
		if code != cli.ExitBlocked || !strings.Contains(out, "10 objects would lose fields or be refused at v1beta1") || strings.Contains(out, "kept by every version") {
			t.Errorf("preflight exited %d, want %d, the 10 objects named and no value:\n%s", code, cli.ExitBlocked, out)
		}
		for _, k := range keys[:10] {
			if want := k.Namespace + "/" + k.Name + " (spec.note)"; !strings.Contains(out, want) {
				t.Errorf("preflight does not name %q", want)
			}
		}
		assertLeftAsItIs(t, fx, release, before, "v1alpha1")
	})

	t.Run("w3: the check after the switch finds a loss", func(t *testing.T) {
		// The webhook drops spec.note once the live storage version is
		// v1beta1: the check before the switch passes, the one after it
		// does not, as for objects written at v1alpha1 in between.
		var fx testenv.Fixture
		var ready atomic.Bool
		hook := renamingWebhook(t, func() bool {
			if !ready.Load() {
				return false
			}
			crd := &apiextensionsv1.CustomResourceDefinition{}
			return env.Client.Get(context.Background(), client.ObjectKey{Name: fx.CRDName()}, crd) == nil && preflight.LiveOf(crd).Storage == "v1beta1"
		})
		fx, _, _, release := install(t, "w3.bridge.restow.dev", hook)
		ready.Store(true)
		out, stderr, code := restow(t, "prepare", "-f", release, "--trust-conversion-webhook", "--in-process", "--settle-window", "2s")
		said := out + stderr
		if code != cli.ExitBlocked || !strings.Contains(out, fx.CRDName()+": made v1beta1 the live storage version") ||
			!strings.Contains(said, "after the switch, 10 objects written at v1alpha1 meanwhile would lose fields at v1beta1") || !strings.Contains(said, "moved the storage version back to v1alpha1, and nothing was pruned") {
			t.Errorf("prepare exited %d, want %d, the switch, and the storage version moved back:\n%s", code, cli.ExitBlocked, said)
		}
		if got := preflight.LiveOf(fx.CRD(t)).Storage; got != "v1alpha1" {
			t.Errorf("the storage version is %s, want v1alpha1 again", got)
		}
		fx.AssertAllStoredAt(t, "v1alpha1", releaseObjects)
		fx.AssertStoredVersions(t, "v1alpha1", "v1beta1")
	})

	t.Run("w6: prepare --ahead through a webhook that drops a field", func(t *testing.T) {
		// The release keeps v1alpha1 and v1beta1, so its apply passes; the
		// objects still stored at v1alpha1 would lose spec.note through
		// the webhook if --ahead migrated them: it leaves them as they are.
		ctx := t.Context()
		const objects = 20
		group := "w6.bridge.restow.dev"
		hook := renamingWebhook(t, func() bool { return true })
		fx := testenv.Fixture{Env: env, Group: group, Kind: "Gadget", Plural: "gadgets", Namespaced: true}
		if err := applyAsHelm(ctx, renamedCRD(group, hook, "v1beta1", "v1alpha1")); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.DeleteCRD(context.Background(), fx.CRDName()) })
		if err := env.WaitForCRD(ctx, fx.CRDName()); err != nil {
			t.Fatal(err)
		}
		fx.CreateObjects(t, "v1alpha1", objects, scheduled, "w6-webhook")
		next := renamedCRD(group, hook, "v1alpha1", "v1beta1")
		if err := applyAsHelm(ctx, next); err != nil {
			t.Fatal(err)
		}
		fx.SwitchStorage(t, "v1beta1")
		release := writeManifest(t, dir, next)
		_, stderr, code := restow(t, "prepare", "-f", release, "--ahead", "--in-process", "--settle-window", "2s")
		if code != 0 || !strings.Contains(stderr, "prepare --ahead leaves it as it is: its conversion webhook would lose fields of 10 objects migrated to v1beta1") {
			t.Errorf("prepare --ahead exited %d, want 0 and the CRD left as it is:\n%s", code, stderr)
		}
		fx.AssertAllStoredAt(t, "v1alpha1", objects)
		fx.AssertStoredVersions(t, "v1alpha1", "v1beta1")
	})

	t.Run("w5: a webhook out of reach", func(t *testing.T) {
		// As a Service's webhook is from outside the cluster: preflight
		// still says what the apply needs, and that it could not check;
		// prepare changes nothing.
		hook := renamingWebhook(t, func() bool { return false })
		fx, _, _, release := install(t, "w5.bridge.restow.dev", hook)
		hook.Stop()
		before := crdVersion(t, fx.CRDName())
		out, _, code := restow(t, "preflight", "-f", release, "--trust-conversion-webhook")
		if code != cli.ExitPending || !strings.Contains(out, fx.CRDName()+": needs prepare") || !strings.Contains(out, "not checked from here: the conversion webhook of CRD "+fx.CRDName()) {
			t.Errorf("preflight exited %d, want %d, needs prepare and not checked from here:\n%s", code, cli.ExitPending, out)
		}
		out, _, code = restow(t, "prepare", "-f", release, "--trust-conversion-webhook", "--in-process")
		if code != 1 || !strings.Contains(out, fx.CRDName()+": not prepared: the conversion webhook of CRD "+fx.CRDName()) || !strings.Contains(out, "nothing was changed") {
			t.Errorf("prepare exited %d, want 1 and not prepared, nothing changed:\n%s", code, out)
		}
		if after := crdVersion(t, fx.CRDName()); after != before {
			t.Errorf("the CRD's resourceVersion moved from %s to %s: prepare wrote it", before, after)
		}
		fx.AssertAllStoredAt(t, "v1alpha1", releaseObjects)
		fx.AssertStoredVersions(t, "v1alpha1")
	})

	t.Run("w4: objects left at a dropped version after a switch, a lossy webhook", func(t *testing.T) {
		// As after a prepare interrupted between the switch and the
		// migration, or a release that switched by itself: the manifest
		// keeps the live storage version, and prepare would migrate
		// through the webhook without a bridge.
		hook := renamingWebhook(t, func() bool { return true })
		fx, _, _, release := install(t, "w4.bridge.restow.dev", hook)
		fx.SwitchStorage(t, "v1beta1")
		before := crdVersion(t, fx.CRDName())
		out, _, code := restow(t, "prepare", "-f", release, "--in-process")
		if code != cli.ExitBlocked || !strings.Contains(out, fx.CRDName()+": blocked, left as it is: its conversion webhook would lose fields of 10 objects migrated to v1beta1, the storage version") {
			t.Errorf("prepare exited %d, want %d and blocked:\n%s", code, cli.ExitBlocked, out)
		}
		if after := crdVersion(t, fx.CRDName()); after != before {
			t.Errorf("the CRD's resourceVersion moved from %s to %s: prepare wrote it", before, after)
		}
		fx.AssertAllStoredAt(t, "v1alpha1", releaseObjects)
		fx.AssertStoredVersions(t, "v1alpha1", "v1beta1")
	})
}
