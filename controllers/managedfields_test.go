package controllers_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
)

const managedFieldsObjects = 20

// applyAt server-side applies spec.<field> = value to object i as manager,
// through version, without forcing ownership.
func (f fixture) applyAt(t *testing.T, version, manager string, i int, field string, value int64) error {
	t.Helper()
	u := f.object(version, "mf", fmt.Sprintf("obj-%05d", i), map[string]any{field: value})
	return env.Client.Apply(t.Context(), client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(manager))
}

// applyBoth has alice own spec.a and bob own spec.b on every object.
func (f fixture) applyBoth(t *testing.T, version string, a, b int64) []error {
	t.Helper()
	var errs []error
	for i := range managedFieldsObjects {
		for _, err := range []error{f.applyAt(t, version, "alice", i, "a", a), f.applyAt(t, version, "bob", i, "b", b)} {
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errs
}

// removeVersion drops a version from the CRD, as the next release of an
// operator would; the API server refuses while storedVersions lists it.
func removeVersion(t *testing.T, crdName, version string) {
	t.Helper()
	err := env.UpdateCRD(t.Context(), crdName, func(crd *apiextensionsv1.CustomResourceDefinition) {
		crd.Spec.Versions = slices.DeleteFunc(crd.Spec.Versions, func(v apiextensionsv1.CustomResourceDefinitionVersion) bool { return v.Name == version })
	})
	if err != nil {
		t.Fatalf("removing %s from CRD %s: %v", version, crdName, err)
	}
}

func stopServing(t *testing.T, crdName, version string) {
	t.Helper()
	err := env.UpdateCRD(t.Context(), crdName, func(crd *apiextensionsv1.CustomResourceDefinition) {
		for i := range crd.Spec.Versions {
			if crd.Spec.Versions[i].Name == version {
				crd.Spec.Versions[i].Served = false
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

// storedManagedFields reads an object's managedFields from its raw value in etcd.
func (f fixture) storedManagedFields(t *testing.T, i int) []metav1.ManagedFieldsEntry {
	t.Helper()
	stored, err := env.ReadStored(t.Context(), f.group, f.plural, "mf", fmt.Sprintf("obj-%05d", i))
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	if err := json.Unmarshal(stored.Raw, &raw); err != nil {
		t.Fatal(err)
	}
	return raw.Metadata.ManagedFields
}

// TestManagedFieldsCleanup: objects applied at v1beta1 by two field managers
// carry managedFields naming v1beta1. After the migration and `served:
// false` on v1beta1, restow re-points them; v1beta1 is removed from the CRD;
// both managers still apply at v1 without forcing, each owning its own
// field. A second CRD taken through the same steps by hand (rewrite, prune,
// remove) shows the apply failing without the cleanup.
func TestManagedFieldsCleanup(t *testing.T) {
	ctx := t.Context()
	f := fixture{group: "mf.controllers.restow.dev", kind: "Widget", plural: "widgets", namespaced: true}
	control := fixture{group: "mfcontrol.controllers.restow.dev", kind: "Widget", plural: "widgets", namespaced: true}
	for _, fx := range []fixture{f, control} {
		fx.install(t, "v1beta1", "v1")
		ensureNamespaces(t, "mf")
		if errs := fx.applyBoth(t, "v1beta1", 1, 2); len(errs) > 0 {
			t.Fatal(errs[0])
		}
		fx.switchStorage(t, "v1")
	}

	// The documented manual procedure on the control CRD: rewrite every
	// object, prune storedVersions, stop serving and remove v1beta1.
	for i := range managedFieldsObjects {
		u := control.object("v1", "mf", fmt.Sprintf("obj-%05d", i), nil)
		if err := env.Client.Patch(ctx, u, client.RawPatch(types.MergePatchType, []byte(`{}`))); err != nil {
			t.Fatal(err)
		}
	}
	control.assertStored(t, "v1", managedFieldsObjects)
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: control.crdName()}, crd); err != nil {
		t.Fatal(err)
	}
	crd.Status.StoredVersions = []string{"v1"}
	if err := env.Client.Status().Update(ctx, crd); err != nil {
		t.Fatal(err)
	}
	stopServing(t, control.crdName(), "v1beta1")
	removeVersion(t, control.crdName(), "v1beta1")
	errs := control.applyBoth(t, "v1", 3, 4)
	if len(errs) != 2*managedFieldsObjects || !strings.Contains(errs[0].Error(), "v1beta1") {
		t.Fatalf("without the cleanup, want every apply to fail naming v1beta1; got %d errors, first %v", len(errs), errs)
	}

	// restow's way.
	startManager(t, nil)
	sm := f.createMigration(t, nil)
	waitFor(t, sm.Name, time.Minute, "Ready", readyAt("v1"))
	f.assertStored(t, "v1", managedFieldsObjects)
	f.assertStoredVersions(t, "v1")

	stopServing(t, f.crdName(), "v1beta1")
	waitFor(t, sm.Name, time.Minute, "cleaned up", func(sm *migrationv1alpha1.StorageMigration) bool {
		return readyAt("v1")(sm) && slices.Equal(sm.Status.LastPass.ServedVersions, []string{"v1"})
	})
	for i := range managedFieldsObjects {
		for _, e := range f.storedManagedFields(t, i) {
			if e.APIVersion != f.group+"/v1" {
				t.Fatalf("obj-%05d still has a managedFields entry of %s at %s in etcd", i, e.Manager, e.APIVersion)
			}
		}
	}

	removeVersion(t, f.crdName(), "v1beta1")
	if errs := f.applyBoth(t, "v1", 3, 4); len(errs) > 0 {
		t.Fatalf("after the cleanup, %d applies at v1 failed; first: %v", len(errs), errs[0])
	}
	for i := range managedFieldsObjects {
		owners := map[string]string{}
		for _, e := range f.storedManagedFields(t, i) {
			owners[e.Manager] = e.FieldsV1.GetRawString()
		}
		if !strings.Contains(owners["alice"], `"f:a"`) || strings.Contains(owners["alice"], `"f:b"`) ||
			!strings.Contains(owners["bob"], `"f:b"`) || strings.Contains(owners["bob"], `"f:a"`) {
			t.Fatalf("obj-%05d ownership after the applies: %v; want alice owning spec.a and bob spec.b", i, owners)
		}
	}
}
