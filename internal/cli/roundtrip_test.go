package cli_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
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
// v1) and back; while lossy is set, it drops spec.note on the way from
// v1alpha1, as a webhook with a bug would, though every version's schema
// declares it.
func renamingWebhook(t *testing.T, lossy *atomic.Bool) *testenv.ConversionWebhook {
	return testenv.StartConversionWebhook(t, func(obj *unstructured.Unstructured, to string) error {
		from := obj.GroupVersionKind().Version
		switch {
		case from == "v1alpha1" && to != "v1alpha1":
			cron, _, _ := unstructured.NestedString(obj.Object, "spec", "cron")
			unstructured.RemoveNestedField(obj.Object, "spec", "cron")
			if err := unstructured.SetNestedField(obj.Object, cron, "spec", "schedule"); err != nil {
				return err
			}
			if lossy.Load() {
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
//	(w3) the check after the switch finds a loss (the webhook starts
//	     dropping spec.note as the storage version switches, as it would
//	     for an object written meanwhile): the storage version is moved
//	     back, nothing is migrated or pruned.
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
		var lossy atomic.Bool
		hook := renamingWebhook(t, &lossy)
		fx, keys, next, release := install(t, "w1.bridge.restow.dev", hook)
		out, _, code := restow(t, "preflight", "-f", release)
		if code != cli.ExitPending || !strings.Contains(out, fx.CRDName()+": needs prepare: the manifest drops v1alpha1, the live storage version") {
			t.Errorf("preflight exited %d, want %d and needs prepare", code, cli.ExitPending)
		}
		before := hook.Conversions.Load()
		out, stderr, code := restow(t, "prepare", "-f", release, "--in-process", "--settle-window", "2s")
		if code != 0 || !strings.Contains(out, fx.CRDName()+": made v1beta1 the live storage version in place of v1alpha1 (as field manager helm") || !strings.Contains(out, fx.CRDName()+": prepared: status.storedVersions lists v1beta1 alone") {
			t.Fatalf("prepare exited %d, want 0, the switch as helm, and prepared", code)
		}
		if !strings.Contains(stderr, "the conversion webhook took every object to v1beta1 and back without loss") {
			t.Errorf("prepare does not say the round trip was made")
		}
		// Two round trips (before and after the switch) of every object,
		// each through the webhook both ways, besides the API server's.
		if n := hook.Conversions.Load() - before; n < 4*releaseObjects {
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
		var lossy atomic.Bool
		lossy.Store(true)
		hook := renamingWebhook(t, &lossy)
		fx, keys, _, release := install(t, "w2.bridge.restow.dev", hook)
		before := crdVersion(t, fx.CRDName())
		out, _, code := restow(t, "preflight", "-f", release)
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
		ctx := t.Context()
		var lossy atomic.Bool
		hook := renamingWebhook(t, &lossy)
		fx, _, _, release := install(t, "w3.bridge.restow.dev", hook)
		switched := make(chan error, 1)
		go func() {
			switched <- wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
				crd := &apiextensionsv1.CustomResourceDefinition{}
				if err := env.Client.Get(ctx, client.ObjectKey{Name: fx.CRDName()}, crd); err != nil {
					return false, err
				}
				if preflight.LiveOf(crd).Storage != "v1beta1" {
					return false, nil
				}
				lossy.Store(true)
				return true, nil
			})
		}()
		out, stderr, code := restow(t, "prepare", "-f", release, "--in-process", "--settle-window", "2s")
		if err := <-switched; err != nil {
			t.Fatalf("prepare never switched the storage version: %v", err)
		}
		said := out + stderr
		if code != cli.ExitBlocked || !strings.Contains(said, "after the switch, 10 objects written at v1alpha1 meanwhile would lose fields at v1beta1") || !strings.Contains(said, "moved the storage version back to v1alpha1, and nothing was pruned") {
			t.Errorf("prepare exited %d, want %d and the storage version moved back:\n%s", code, cli.ExitBlocked, said)
		}
		if got := preflight.LiveOf(fx.CRD(t)).Storage; got != "v1alpha1" {
			t.Errorf("the storage version is %s, want v1alpha1 again", got)
		}
		fx.AssertAllStoredAt(t, "v1alpha1", releaseObjects)
		fx.AssertStoredVersions(t, "v1alpha1", "v1beta1")
	})
}
