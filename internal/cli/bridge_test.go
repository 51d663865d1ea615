//go:build long

package cli_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/restow/restow/internal/cli"
	"github.com/restow/restow/internal/preflight"
	"github.com/restow/restow/internal/testenv"
)

// typedSchema is a schema that declares every field of typed; with extra,
// also spec.extra, a field only that version has.
func typedSchema(extra bool) *apiextensionsv1.JSONSchemaProps {
	spec := apiextensionsv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
		"n":       {Type: "integer"},
		"label":   {Type: "string"},
		"enabled": {Type: "boolean"},
		"nested": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
			"ratio": {Type: "string"},
			"tags":  {Type: "array", Items: &apiextensionsv1.JSONSchemaPropsOrArray{Schema: &apiextensionsv1.JSONSchemaProps{Type: "string"}}},
		}},
	}}
	if extra {
		spec.Properties["extra"] = apiextensionsv1.JSONSchemaProps{Type: "string"}
	}
	return &apiextensionsv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{"spec": spec}}
}

// typed is an object's spec that typedSchema declares.
func typed(i int) map[string]any {
	return map[string]any{
		"n":       int64(i),
		"label":   fmt.Sprintf("gadget-%05d", i),
		"enabled": i%3 == 0,
		"nested":  map[string]any{"ratio": "0.25", "tags": []any{"a", fmt.Sprintf("t%d", i%4)}},
	}
}

// bridgeCRD is a release of a test CRD: versions in order, the last one
// the storage version, each served, with typed schemas; those in extra
// also declare spec.extra.
func bridgeCRD(group string, versions []string, extra ...string) *apiextensionsv1.CustomResourceDefinition {
	vs := make([]testenv.CRDVersion, 0, len(versions))
	for i, v := range versions {
		vs = append(vs, testenv.CRDVersion{Name: v, Served: true, Storage: i == len(versions)-1, Schema: typedSchema(slices.Contains(extra, v))})
	}
	crd := testenv.NewCRD(group, "Gadget", "gadgets", apiextensionsv1.NamespaceScoped, vs...)
	crd.APIVersion, crd.Kind = apiextensionsv1.SchemeGroupVersion.String(), "CustomResourceDefinition"
	return crd
}

// applyAsHelm applies crd with server-side apply as Helm 4 does (field
// manager helm), without forcing: a conflict fails the test through the
// returned error.
func applyAsHelm(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition) error {
	ac, err := applyConfig(crd)
	if err != nil {
		return err
	}
	return env.Client.Apply(ctx, ac, client.FieldOwner("helm"))
}

func applyConfig(crd *apiextensionsv1.CustomResourceDefinition) (runtime.ApplyConfiguration, error) {
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(crd)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: raw}
	unstructured.RemoveNestedField(u.Object, "status")
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	return client.ApplyConfigurationFromUnstructured(u), nil
}

func mustApplyConfig(t *testing.T, crd *apiextensionsv1.CustomResourceDefinition) runtime.ApplyConfiguration {
	ac, err := applyConfig(crd)
	if err != nil {
		t.Error(err)
	}
	return ac
}

// writeManifest writes crd as a release's manifest.
func writeManifest(t *testing.T, dir string, crd *apiextensionsv1.CustomResourceDefinition) string {
	t.Helper()
	path := filepath.Join(dir, crd.Spec.Group+".yaml")
	writeYAML(t, path, crd, "")
	return path
}

// TestBridgeReleases: releases that drop the live storage version, each
// CRD with 2,000 objects and etcd read before and after. prepare makes a
// version both sides serve the storage version, after proving that no
// object loses a field at it, migrates and prunes; or blocks, changing
// nothing.
//
//	(a) a skipped release (v1alpha1 stored, the release keeps v1beta1 and
//	    v1), its CRD applied server-side by "helm": refused, prepare, then
//	    the release applied server-side by "helm" without forcing, every
//	    object read with every field at every served version; (a2) the same
//	    with client-side apply;
//	(b) a downgrade after a storage switch, no field only the newer has;
//	(c) a downgrade where v1 has spec.extra, set on 10 objects: blocked,
//	    naming the field, CRD and etcd as before;
//	(d) a downgrade whose older schema makes v1's map of labels fixed
//	    properties, no object setting another key: blocked by the
//	    schemas' comparison alone, CRD and etcd as before;
//	(e) the storage version flipped back by another client during prepare:
//	    nothing pruned, a message that says who and what to do.
func TestBridgeReleases(t *testing.T) {
	dir := t.TempDir()

	skipped := func(t *testing.T, group, manager string, apply func(*apiextensionsv1.CustomResourceDefinition) error) {
		ctx := t.Context()
		fx := testenv.Fixture{Env: env, Group: group, Kind: "Gadget", Plural: "gadgets", Namespaced: true}
		// Release N-1: v1alpha1 stored, v1beta1 served.
		old := bridgeCRD(group, []string{"v1beta1", "v1alpha1"})
		if err := apply(old); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.DeleteCRD(context.Background(), fx.CRDName()) })
		if err := env.WaitForCRD(ctx, fx.CRDName()); err != nil {
			t.Fatal(err)
		}
		keys := fx.CreateObjects(t, "v1alpha1", releaseObjects, typed, strings.Split(group, ".")[0]+"-bridge")
		// Release N+1, skipped: v1beta1 and v1, v1 stored.
		next := bridgeCRD(group, []string{"v1beta1", "v1"})
		release := writeManifest(t, dir, next)
		if err := apply(next); err == nil || !strings.Contains(err.Error(), `status.storedVersions[0]: Invalid value: "v1alpha1": missing from spec.versions`) {
			t.Fatalf("the skipped release applied: %v, want the API server's refusal", err)
		}
		out, _, code := restow(t, "preflight", "-f", release)
		if code != cli.ExitPending || !strings.Contains(out, fx.CRDName()+": needs prepare: the manifest drops v1alpha1, the live storage version, as a skipped release or a downgrade does (status.storedVersions lists v1alpha1): kubectl restow prepare makes v1beta1 (served by both) the live storage version") {
			t.Errorf("preflight exited %d, want %d and the bridge", code, cli.ExitPending)
		}
		out, _, code = restow(t, "prepare", "-f", release, "--in-process", "--settle-window", "2s")
		if code != 0 || !strings.Contains(out, fx.CRDName()+": made v1beta1 the live storage version in place of v1alpha1 (as field manager "+manager) || !strings.Contains(out, fx.CRDName()+": prepared: status.storedVersions lists v1beta1 alone") {
			t.Fatalf("prepare exited %d, want 0, the switch as %s, and prepared", code, manager)
		}
		fx.AssertAllStoredAt(t, "v1beta1", releaseObjects)
		fx.AssertStoredVersions(t, "v1beta1")
		if err := apply(next); err != nil {
			t.Fatalf("the release after prepare: %v", err)
		}
		assertReadsAt(t, fx, keys, typed, "v1beta1", "v1")
	}
	t.Run("a: a skipped release, applied server-side", func(t *testing.T) {
		skipped(t, "a.bridge.restow.dev", "helm", func(crd *apiextensionsv1.CustomResourceDefinition) error {
			return applyAsHelm(t.Context(), crd)
		})
	})
	t.Run("a2: a skipped release, applied client-side", func(t *testing.T) {
		skipped(t, "a2.bridge.restow.dev", "kubectl-client-side-apply", func(crd *apiextensionsv1.CustomResourceDefinition) error {
			live := &apiextensionsv1.CustomResourceDefinition{}
			err := env.Client.Get(t.Context(), client.ObjectKey{Name: crd.Name}, live)
			if err != nil {
				return env.Client.Create(t.Context(), crd.DeepCopy(), client.FieldOwner("kubectl-client-side-apply"))
			}
			live.Spec = *crd.Spec.DeepCopy()
			return env.Client.Update(t.Context(), live, client.FieldOwner("kubectl-client-side-apply"))
		})
	})

	downgrade := func(t *testing.T, group string, extra bool) (testenv.Fixture, []client.ObjectKey, string) {
		ctx := t.Context()
		fx := testenv.Fixture{Env: env, Group: group, Kind: "Gadget", Plural: "gadgets", Namespaced: true}
		var newer []string
		if extra {
			newer = []string{"v1"}
		}
		// Release N: v1beta1 stored; N+1: v1 stored, migrated and pruned.
		if err := applyAsHelm(ctx, bridgeCRD(group, []string{"v1beta1"})); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.DeleteCRD(context.Background(), fx.CRDName()) })
		if err := env.WaitForCRD(ctx, fx.CRDName()); err != nil {
			t.Fatal(err)
		}
		keys := fx.CreateObjects(t, "v1beta1", releaseObjects, typed, strings.Split(group, ".")[0]+"-bridge")
		if err := applyAsHelm(ctx, bridgeCRD(group, []string{"v1beta1", "v1"}, newer...)); err != nil {
			t.Fatal(err)
		}
		fx.SwitchStorage(t, "v1")
		if _, _, code := restow(t, "run", fx.CRDName(), "--settle-window", "1s"); code != 0 {
			t.Fatalf("run exited %d", code)
		}
		fx.AssertStoredVersions(t, "v1")
		// The rollback to release N: v1beta1 alone.
		return fx, keys, writeManifest(t, dir, bridgeCRD(group, []string{"v1beta1"}))
	}

	t.Run("b: a downgrade, no field only the newer version has", func(t *testing.T) {
		fx, keys, release := downgrade(t, "b.bridge.restow.dev", false)
		// The same rollback given by --keep, as versions without the
		// release's schemas: restow cannot compare them, and bridges
		// nothing.
		before := crdVersion(t, fx.CRDName())
		out, _, code := restow(t, "prepare", "--keep", fx.CRDName()+"=v1beta1", "--in-process", "--settle-window", "2s")
		if code != cli.ExitBlocked || !strings.Contains(out, "--keep gives the versions the release keeps, not its schemas") {
			t.Errorf("prepare --keep of a downgrade exited %d, want %d and why it bridges nothing:\n%s", code, cli.ExitBlocked, out)
		}
		if after := crdVersion(t, fx.CRDName()); after != before {
			t.Errorf("the CRD's resourceVersion moved from %s to %s: prepare --keep wrote it", before, after)
		}
		fx.AssertAllStoredAt(t, "v1", releaseObjects)
		out, _, code = restow(t, "prepare", "-f", release, "--in-process", "--settle-window", "2s")
		if code != 0 || !strings.Contains(out, fx.CRDName()+": prepared: status.storedVersions lists v1beta1 alone") {
			t.Fatalf("prepare exited %d, want 0 and prepared", code)
		}
		fx.AssertAllStoredAt(t, "v1beta1", releaseObjects)
		fx.AssertStoredVersions(t, "v1beta1")
		if err := applyAsHelm(t.Context(), bridgeCRD(fx.Group, []string{"v1beta1"})); err != nil {
			t.Fatalf("the rollback after prepare: %v", err)
		}
		assertReadsAt(t, fx, keys, typed, "v1beta1")
	})

	t.Run("c: a downgrade that would lose a field", func(t *testing.T) {
		ctx := t.Context()
		fx, keys, release := downgrade(t, "c.bridge.restow.dev", true)
		withExtra := make([]string, 0, 10)
		for _, k := range keys[:10] {
			o := fx.Object("v1", k.Namespace, k.Name, nil)
			if err := env.Client.Patch(ctx, o, client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"extra":"only v1 has it"}}`))); err != nil {
				t.Fatal(err)
			}
			withExtra = append(withExtra, k.Namespace+"/"+k.Name+" (spec.extra")
		}
		before := crdVersion(t, fx.CRDName())
		out, _, code := restow(t, "preflight", "-f", release, "-o", "json")
		if code != cli.ExitBlocked {
			t.Errorf("preflight exited %d, want %d", code, cli.ExitBlocked)
		}
		if !strings.Contains(out, "10 objects would lose fields or be refused at v1beta1") || strings.Contains(out, "only v1 has it") {
			t.Errorf("preflight does not name the 10 objects, or shows a value:\n%s", out)
		}
		for _, want := range withExtra {
			if !strings.Contains(out, want) {
				t.Errorf("preflight does not name %q", want)
			}
		}
		assertLeftAsItIs(t, fx, release, before, "v1")
	})

	t.Run("d: a downgrade whose older schema turns a map into fixed properties", func(t *testing.T) {
		// No object sets a key the older schema lacks: the objects' reads
		// and dry runs lose nothing, and only the schemas' comparison sees
		// that one written with another key before the migration ends, or
		// read after the rollback, would lose it.
		ctx := t.Context()
		const objects = 20
		group := "d.bridge.restow.dev"
		fx := testenv.Fixture{Env: env, Group: group, Kind: "Gadget", Plural: "gadgets", Namespaced: true}
		labels := func(open bool) *apiextensionsv1.JSONSchemaProps {
			str := apiextensionsv1.JSONSchemaProps{Type: "string"}
			l := apiextensionsv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{"team": str}}
			if open {
				l = apiextensionsv1.JSONSchemaProps{Type: "object", AdditionalProperties: &apiextensionsv1.JSONSchemaPropsOrBool{Allows: true, Schema: &str}}
			}
			spec := apiextensionsv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{"labels": l}}
			return &apiextensionsv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{"spec": spec}}
		}
		release := func(versions ...string) *apiextensionsv1.CustomResourceDefinition {
			vs := make([]testenv.CRDVersion, 0, len(versions))
			for i, v := range versions {
				vs = append(vs, testenv.CRDVersion{Name: v, Served: true, Storage: i == len(versions)-1, Schema: labels(v == "v1")})
			}
			crd := testenv.NewCRD(group, "Gadget", "gadgets", apiextensionsv1.NamespaceScoped, vs...)
			crd.APIVersion, crd.Kind = apiextensionsv1.SchemeGroupVersion.String(), "CustomResourceDefinition"
			return crd
		}
		if err := applyAsHelm(ctx, release("v1beta1")); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.DeleteCRD(context.Background(), fx.CRDName()) })
		if err := env.WaitForCRD(ctx, fx.CRDName()); err != nil {
			t.Fatal(err)
		}
		fx.CreateObjects(t, "v1beta1", objects, func(int) map[string]any {
			return map[string]any{"labels": map[string]any{"team": "storage"}}
		}, "d-bridge")
		if err := applyAsHelm(ctx, release("v1beta1", "v1")); err != nil {
			t.Fatal(err)
		}
		fx.SwitchStorage(t, "v1")
		if _, _, code := restow(t, "run", fx.CRDName(), "--settle-window", "1s"); code != 0 {
			t.Fatalf("run exited %d", code)
		}
		rollback := writeManifest(t, dir, release("v1beta1"))
		before := crdVersion(t, fx.CRDName())
		out, _, code := restow(t, "preflight", "-f", rollback)
		if code != cli.ExitBlocked || !strings.Contains(out, "no object sets a field v1beta1 lacks now, but the schemas allow fields it does not (v1: spec.labels{})") {
			t.Errorf("preflight exited %d, want %d and the map named:\n%s", code, cli.ExitBlocked, out)
		}
		out, _, code = restow(t, "prepare", "-f", rollback, "--in-process")
		if code != cli.ExitBlocked || !strings.Contains(out, fx.CRDName()+": blocked, left as it is") {
			t.Errorf("prepare exited %d, want %d and left as it is:\n%s", code, cli.ExitBlocked, out)
		}
		if after := crdVersion(t, fx.CRDName()); after != before {
			t.Errorf("the CRD's resourceVersion moved from %s to %s: prepare wrote it", before, after)
		}
		fx.AssertAllStoredAt(t, "v1", objects)
		fx.AssertStoredVersions(t, "v1")
	})

	t.Run("e: the storage version flipped back during prepare", func(t *testing.T) {
		ctx := t.Context()
		fx, _, release := downgrade(t, "e.bridge.restow.dev", false)
		// Another client (a GitOps self-heal) applies release N+1 again as
		// soon as prepare switched the storage version.
		const selfHeal = "gitops-self-heal"
		flipped := make(chan error, 1)
		go func() {
			err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
				crd := &apiextensionsv1.CustomResourceDefinition{}
				if err := env.Client.Get(ctx, client.ObjectKey{Name: fx.CRDName()}, crd); err != nil {
					return false, err
				}
				return preflight.LiveOf(crd).Storage == "v1beta1", nil
			})
			if err == nil {
				crd := bridgeCRD(fx.Group, []string{"v1beta1", "v1"})
				err = env.Client.Apply(ctx, mustApplyConfig(t, crd), client.FieldOwner(selfHeal), client.ForceOwnership)
			}
			flipped <- err
		}()
		out, stderr, code := restow(t, "prepare", "-f", release, "--in-process", "--settle-window", "20s")
		if err := <-flipped; err != nil {
			t.Fatal(err)
		}
		if code == 0 || !strings.Contains(out+stderr, "the storage version of CRD "+fx.CRDName()+" went from v1beta1 to v1 while prepare migrated (spec.versions is now field manager "+selfHeal+"'s)") || !strings.Contains(out+stderr, "nothing was pruned") {
			t.Errorf("prepare exited %d, want a failure saying the storage version went back", code)
		}
		if got := fx.StoredVersions(t); !slices.Contains(got, "v1") || !slices.Contains(got, "v1beta1") {
			t.Errorf("status.storedVersions = %v, want both v1beta1 and v1 kept", got)
		}
	})
}
