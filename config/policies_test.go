package config_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsac "k8s.io/apiextensions-apiserver/pkg/client/applyconfiguration/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/testenv"
)

// policyKinds are the kinds of a sample that hold its ServiceAccount: its
// RBAC and its admission policies.
var policyKinds = []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
	"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}

// applyHolds creates the objects of policyKinds among objs, as they are,
// and deletes them when the test ends.
func applyHolds(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, o := range objs {
		if !slices.Contains(policyKinds, o.GetKind()) {
			continue
		}
		obj := o.DeepCopy()
		if err := env.Client.Create(t.Context(), obj); err != nil {
			t.Fatalf("creating %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := client.IgnoreNotFound(env.Client.Delete(ctx, obj)); err != nil {
				t.Error(err)
			}
		})
	}
}

// clientAs is a client of the test control plane authenticated as the
// ServiceAccount namespace/name.
func clientAs(t *testing.T, namespace, name string) client.Client {
	t.Helper()
	cfg, err := env.ConfigAs(serviceaccount.MakeUsername(namespace, name), serviceaccount.MakeGroupNames(namespace)...)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// storageMigration is a StorageMigration named name of group/resource.
func storageMigration(name, group, resource string) *migrationv1alpha1.StorageMigration {
	return &migrationv1alpha1.StorageMigration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       migrationv1alpha1.StorageMigrationSpec{Resource: migrationv1alpha1.GroupResource{Group: group, Resource: resource}},
	}
}

// assertDeniedByPolicy wants err to be the admission policy's refusal,
// saying want.
func assertDeniedByPolicy(t *testing.T, what string, err error, want string) {
	t.Helper()
	if err == nil || (!apierrors.IsInvalid(err) && !apierrors.IsForbidden(err)) || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: %v, want the admission policy's refusal saying %q", what, err, want)
		return
	}
	t.Logf("%s: denied: %v", what, err)
}

// awaitPolicy waits until the policy is in force: an API server loads a
// new policy within a few seconds. A Secrets StorageMigration created by
// sa before that (nothing reconciles it here) is deleted again.
func awaitPolicy(t *testing.T, sa client.Client, want string) {
	t.Helper()
	testenv.WaitProgress(t, "the admission policy to take hold", 30*time.Second, func(ctx context.Context) (bool, string, error) {
		err := sa.Create(ctx, storageMigration("probe-secrets", "", "secrets"))
		if err == nil {
			return false, "created", client.IgnoreNotFound(env.Client.Delete(ctx, storageMigration("probe-secrets", "", "secrets")))
		}
		return strings.Contains(err.Error(), want), err.Error(), nil
	})
}

// TestHookPoliciesAsShipped applies the RBAC and admission policies of the
// Helm hooks (config/samples/crd-author, rendered with Helm's template
// engine) and of the GitOps prepare Job (config/samples/prepare-job,
// rendered with the kustomize API) as they are, and tries, as each
// ServiceAccount, what the samples must allow and what they must refuse:
// a StorageMigration of crontabs may be created and asked for a new pass,
// not one of Secrets, nor may its resource be changed, nor another one be
// read; the CRD write of the hooks' prepare may move the storage version,
// and dry-run anything, and is refused a new schema, a conversion webhook
// or a new version.
func TestHookPoliciesAsShipped(t *testing.T) {
	ensureRestowCRD(t)
	fx := testenv.Fixture{Env: env, Group: "stable.example.com", Kind: "CronTab", Plural: "crontabs", Namespaced: true}
	fx.Install(t, "v1beta1", "v1")
	// Another StorageMigration, which neither ServiceAccount may read.
	other := storageMigration("gadgets.crd-author.config.restow.dev", "crd-author.config.restow.dev", "gadgets")
	if err := env.Client.Create(t.Context(), other); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), other) })

	t.Run("Helm hooks", func(t *testing.T) {
		const release, namespace = "crontab-operator", "crontab-policies"
		if err := env.EnsureNamespaces(t.Context(), namespace); err != nil {
			t.Fatal(err)
		}
		r, err := templateChart(authorChart(t, "2.0.0", readChartFile(t, "samples/crontabs/crd-storage-v1.yaml"), true), release, namespace, nil)
		if err != nil {
			t.Fatal(err)
		}
		hooks := make([]*unstructured.Unstructured, 0, len(r.Hooks))
		for _, h := range r.Hooks {
			hooks = append(hooks, decodeManifests(t, h.Manifest)...)
		}
		applyHolds(t, hooks)
		sa := clientAs(t, namespace, release+"-restow-run")
		assertStorageMigrationsHeld(t, sa, "this chart's restow hooks may create the StorageMigration of crontabs.stable.example.com only")
		assertCRDWriteHeld(t, fx, sa)
	})
	t.Run("GitOps prepare Job", func(t *testing.T) {
		if err := env.EnsureNamespaces(t.Context(), "restow-prepare"); err != nil {
			t.Fatal(err)
		}
		applyHolds(t, render(t, prepareJobDir+"/flux"))
		sa := clientAs(t, "restow-prepare", "restow-prepare")
		assertStorageMigrationsHeld(t, sa, "the restow-prepare Job may create the StorageMigration of crontabs.stable.example.com only")
	})
}

// assertStorageMigrationsHeld tries, as sa, the StorageMigration requests
// prepare makes and those the policy and RBAC must refuse.
func assertStorageMigrationsHeld(t *testing.T, sa client.Client, want string) {
	t.Helper()
	ctx := t.Context()
	awaitPolicy(t, sa, want)
	err := sa.Create(ctx, storageMigration("secrets", "", "secrets"))
	assertDeniedByPolicy(t, "creating a StorageMigration of Secrets", err, want)

	own := storageMigration("crontabs.stable.example.com", "stable.example.com", "crontabs")
	if err := sa.Create(ctx, own); err != nil {
		t.Fatalf("creating the StorageMigration of crontabs, as prepare does: %v", err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), own) })
	newPass := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"`+migrationv1alpha1.ReRunAnnotation+`":"now"}}}`))
	if err := sa.Patch(ctx, own, newPass); err != nil {
		t.Errorf("asking the StorageMigration of crontabs for a new pass, as prepare does: %v", err)
	}
	if err := sa.Get(ctx, client.ObjectKeyFromObject(own), own); err != nil {
		t.Errorf("reading the StorageMigration of crontabs: %v", err)
	}
	// Once created, a StorageMigration's resource is immutable (the CRD's
	// own validation), so the policies hold create alone.
	toSecrets := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"resource":{"group":"","resource":"secrets"}}}`))
	if err := sa.Patch(ctx, own, toSecrets); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "immutable") {
		t.Errorf("changing the StorageMigration of crontabs to Secrets: %v, want refused: spec.resource is immutable", err)
	}

	viaStatus := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"rewriteViaStatus":true}}`))
	assertDeniedByPolicy(t, "rewriting via status, past the CRD's admission", sa.Patch(ctx, own, viaStatus), "not change its spec")

	theirs := &migrationv1alpha1.StorageMigration{}
	if err := sa.Get(ctx, client.ObjectKey{Name: "gadgets.crd-author.config.restow.dev"}, theirs); !apierrors.IsForbidden(err) {
		t.Errorf("reading another resource's StorageMigration: %v, want Forbidden", err)
	}
	if err := sa.Patch(ctx, storageMigration("gadgets.crd-author.config.restow.dev", "", ""), newPass); !apierrors.IsForbidden(err) {
		t.Errorf("asking another resource's StorageMigration for a pass: %v, want Forbidden", err)
	}
}

// assertCRDWriteHeld tries, as sa, CRD writes: what prepare writes (a
// dry run of the release's CRD, the storage version moved) passes; a new
// schema, a conversion webhook or a new version is refused.
func assertCRDWriteHeld(t *testing.T, fx testenv.Fixture, sa client.Client) {
	t.Helper()
	ctx := t.Context()
	const want = "this chart's restow hooks may move the storage version only"
	update := func(dryRun bool, change func(*apiextensionsv1.CustomResourceDefinitionSpec)) error {
		crd := fx.CRD(t)
		change(&crd.Spec)
		var opts []client.UpdateOption
		if dryRun {
			opts = append(opts, client.DryRunAll)
		}
		return sa.Update(ctx, crd, opts...)
	}
	newSchema := func(s *apiextensionsv1.CustomResourceDefinitionSpec) {
		s.Versions[1].Schema.OpenAPIV3Schema.Description = "a schema the hooks did not check"
	}
	webhook := func(s *apiextensionsv1.CustomResourceDefinitionSpec) {
		url := "https://127.0.0.1:1/convert"
		s.Conversion = &apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.WebhookConverter, Webhook: &apiextensionsv1.WebhookConversion{
			ClientConfig: &apiextensionsv1.WebhookClientConfig{URL: &url}, ConversionReviewVersions: []string{"v1"},
		}}
	}
	newVersion := func(s *apiextensionsv1.CustomResourceDefinitionSpec) {
		v := s.Versions[1].DeepCopy()
		v.Name, v.Storage = "v2", false
		s.Versions = append(s.Versions, *v)
	}
	testenv.WaitProgress(t, "the CRD policy to take hold", 30*time.Second, func(ctx context.Context) (bool, string, error) {
		err := update(false, newVersion)
		if err == nil {
			// Not in force yet: the version added is taken away again,
			// as the test's own administrator.
			crd := fx.CRD(t)
			crd.Spec.Versions = crd.Spec.Versions[:2]
			return false, "added", env.Client.Update(ctx, crd)
		}
		return strings.Contains(err.Error(), want), err.Error(), nil
	})
	if err := update(true, newSchema); err != nil {
		t.Errorf("a dry run of a CRD with another schema, as prepare's check makes: %v", err)
	}
	assertDeniedByPolicy(t, "a new schema", update(false, newSchema), want)
	assertDeniedByPolicy(t, "a conversion webhook", update(false, webhook), want)
	assertDeniedByPolicy(t, "a new version", update(false, newVersion), want)
	metadata := func(change func(*apiextensionsv1.CustomResourceDefinition)) error {
		crd := fx.CRD(t)
		change(crd)
		return sa.Update(ctx, crd)
	}
	assertDeniedByPolicy(t, "an owner, which the garbage collector would follow", metadata(func(crd *apiextensionsv1.CustomResourceDefinition) {
		crd.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "gone", UID: "8d3e2c4a-0000-4000-8000-000000000000"}}
	}), want)
	assertDeniedByPolicy(t, "a label", metadata(func(crd *apiextensionsv1.CustomResourceDefinition) {
		crd.Labels = map[string]string{"migration.restow.dev/auto-migrate": "false"}
	}), want)
	assertDeniedByPolicy(t, "another short name", update(false, func(s *apiextensionsv1.CustomResourceDefinitionSpec) {
		s.Names.ShortNames = append(s.Names.ShortNames, "ct")
	}), want)
	assertDeniedByPolicy(t, "no status subresource", update(false, func(s *apiextensionsv1.CustomResourceDefinitionSpec) {
		s.Versions[1].Subresources = nil
	}), want)
	moveStorage := func(s *apiextensionsv1.CustomResourceDefinitionSpec) {
		s.Versions[0].Storage, s.Versions[1].Storage = false, true
	}
	if err := update(false, moveStorage); err != nil {
		t.Errorf("moving the storage version to v1, as prepare's bridge does: %v", err)
	}
	if got := fx.CRD(t); !got.Spec.Versions[1].Storage {
		t.Errorf("the storage version did not move: %+v", got.Spec.Versions)
	}
	assertApplyBridgeAllowed(t, fx, sa)
}

// assertApplyBridgeAllowed: where a server-side apply owns spec.versions
// (Helm 4, Flux, kubectl --server-side), prepare moves the storage version
// by applying that manager's own fields again with the flags moved; the
// policy allows that write too.
func assertApplyBridgeAllowed(t *testing.T, fx testenv.Fixture, sa client.Client) {
	t.Helper()
	ctx := t.Context()
	const owner = "helm"
	crd := fx.CRD(t)
	crd.ManagedFields, crd.ResourceVersion = nil, ""
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(crd)
	if err != nil {
		t.Fatal(err)
	}
	applied := &unstructured.Unstructured{Object: u}
	applied.SetAPIVersion("apiextensions.k8s.io/v1")
	applied.SetKind("CustomResourceDefinition")
	unstructured.RemoveNestedField(applied.Object, "status")
	unstructured.RemoveNestedField(applied.Object, "metadata", "creationTimestamp")
	if err := env.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(applied), client.FieldOwner(owner), client.ForceOwnership); err != nil {
		t.Fatalf("applying the CRD as %s: %v", owner, err)
	}
	live := fx.CRD(t)
	ac, err := apiextensionsac.ExtractCustomResourceDefinition(live, owner)
	if err != nil {
		t.Fatal(err)
	}
	for i := range ac.Spec.Versions {
		ac.Spec.Versions[i].Storage = ptr.To(*ac.Spec.Versions[i].Name == "v1beta1")
	}
	ac.WithResourceVersion(live.ResourceVersion)
	if err := sa.Apply(ctx, ac, client.FieldOwner(owner), client.ForceOwnership); err != nil {
		t.Errorf("moving the storage version back to v1beta1 as field manager %s, as prepare's bridge does: %v", owner, err)
	}
	if got := fx.CRD(t); !got.Spec.Versions[0].Storage {
		t.Errorf("the storage version did not move: %+v", got.Spec.Versions)
	}
}
