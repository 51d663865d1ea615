package testenv

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Fixture is a test CRD whose storage version a test switches, with its
// objects and the one proof that counts: the versions etcd holds them at.
// Every test package (controllers, cli, config, e2e, bench) uses it.
type Fixture struct {
	Env                 *Env
	Group, Kind, Plural string
	Namespaced          bool
	// Conversion, when set, is the CRD's spec.conversion.
	Conversion *apiextensionsv1.CustomResourceConversion
	// Labels and Annotations go on the CRD.
	Labels, Annotations map[string]string
	// Mutate, when set, changes the CRD before it is installed.
	Mutate func(*apiextensionsv1.CustomResourceDefinition)
}

// CRDName is the CRD's name, plural.group.
func (f Fixture) CRDName() string { return f.Plural + "." + f.Group }

// Install creates the CRD with open schemas, serving versions, the first
// one the storage version, and deletes it (with its objects) when the test ends.
func (f Fixture) Install(tb testing.TB, versions ...string) {
	tb.Helper()
	scope := apiextensionsv1.ClusterScoped
	if f.Namespaced {
		scope = apiextensionsv1.NamespaceScoped
	}
	vs := make([]CRDVersion, 0, len(versions))
	for i, v := range versions {
		vs = append(vs, CRDVersion{Name: v, Served: true, Storage: i == 0})
	}
	crd := NewCRD(f.Group, f.Kind, f.Plural, scope, vs...)
	crd.Spec.Conversion = f.Conversion
	crd.Labels, crd.Annotations = f.Labels, f.Annotations
	if f.Mutate != nil {
		f.Mutate(crd)
	}
	f.Env.InstallCRDForTest(tb, crd)
}

// GVK is the fixture's kind at version.
func (f Fixture) GVK(version string) schema.GroupVersionKind {
	return schema.GroupVersionKind{Group: f.Group, Version: version, Kind: f.Kind}
}

// Object is an object of the fixture at version, with spec (nil: none).
func (f Fixture) Object(version, namespace, name string, spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{}}
	if spec != nil {
		u.Object["spec"] = spec
	}
	u.SetGroupVersionKind(f.GVK(version))
	u.SetNamespace(namespace)
	u.SetName(name)
	return u
}

// SwitchStorage makes version the CRD's storage version and waits until the
// API server stores new writes at it.
func (f Fixture) SwitchStorage(tb testing.TB, version string) {
	tb.Helper()
	if err := f.Env.SetStorageVersion(tb.Context(), f.CRDName(), version); err != nil {
		tb.Fatal(err)
	}
}

// StoredCounts reads every object of the fixture from etcd and counts them
// by the version (without the group) they are stored at.
func (f Fixture) StoredCounts(ctx context.Context) (map[string]int, error) {
	counts, err := f.Env.StoredVersions(ctx, f.Group, f.Plural)
	if err != nil {
		return nil, err
	}
	out := make(map[string]int, len(counts))
	for apiVersion, n := range counts {
		out[strings.TrimPrefix(apiVersion, f.Group+"/")] = n
	}
	return out, nil
}

// AssertStored checks in etcd how many objects are stored at each version:
// exactly want, no more versions.
func (f Fixture) AssertStored(tb testing.TB, want map[string]int) {
	tb.Helper()
	got, err := f.StoredCounts(tb.Context())
	if err != nil {
		tb.Fatal(err)
	}
	if !maps.Equal(got, want) {
		tb.Fatalf("etcd holds %v of %s, want %v", got, f.CRDName(), want)
	}
}

// AssertAllStoredAt checks in etcd that all n objects are stored at version.
func (f Fixture) AssertAllStoredAt(tb testing.TB, version string, n int) {
	tb.Helper()
	f.AssertStored(tb, map[string]int{version: n})
}

// CRD reads the CRD.
func (f Fixture) CRD(tb testing.TB) *apiextensionsv1.CustomResourceDefinition {
	tb.Helper()
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := f.Env.Client.Get(tb.Context(), client.ObjectKey{Name: f.CRDName()}, crd); err != nil {
		tb.Fatal(err)
	}
	return crd
}

// StoredVersions reads the CRD's status.storedVersions.
func (f Fixture) StoredVersions(tb testing.TB) []string {
	tb.Helper()
	return f.CRD(tb).Status.StoredVersions
}

// AssertStoredVersions checks the CRD's status.storedVersions.
func (f Fixture) AssertStoredVersions(tb testing.TB, want ...string) {
	tb.Helper()
	if got := f.StoredVersions(tb); !slices.Equal(got, want) {
		tb.Fatalf("status.storedVersions of %s = %v, want %v", f.CRDName(), got, want)
	}
}

// CreateObjects creates n objects named obj-00000 on at version, spread over
// namespaces (ignored when cluster-scoped), each with spec from spec(i), and
// returns their keys in order.
func (f Fixture) CreateObjects(tb testing.TB, version string, n int, spec func(i int) map[string]any, namespaces ...string) []client.ObjectKey {
	tb.Helper()
	if !f.Namespaced || len(namespaces) == 0 {
		namespaces = []string{""}
	}
	if err := f.Env.EnsureNamespaces(tb.Context(), namespaces...); err != nil {
		tb.Fatal(err)
	}
	keys := make([]client.ObjectKey, n)
	for i := range n {
		keys[i] = client.ObjectKey{Namespace: namespaces[i%len(namespaces)], Name: fmt.Sprintf("obj-%05d", i)}
	}
	err := f.Env.CreateObjects(tb.Context(), n, func(i int) client.Object {
		return f.Object(version, keys[i].Namespace, keys[i].Name, spec(i))
	})
	if err != nil {
		tb.Fatal(err)
	}
	return keys
}

// DescribeSchema sets the description of version's schema: a change of
// the CRD's spec (its generation moves) that leaves its storage version as
// it is, as a webhook's caBundle injection or a GitOps re-apply does. It
// returns the CRD's new generation.
func (f Fixture) DescribeSchema(ctx context.Context, version, description string) (int64, error) {
	var generation int64
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := f.Env.Client.Get(ctx, client.ObjectKey{Name: f.CRDName()}, crd); err != nil {
			return err
		}
		i := slices.IndexFunc(crd.Spec.Versions, func(v apiextensionsv1.CustomResourceDefinitionVersion) bool { return v.Name == version })
		if i < 0 || crd.Spec.Versions[i].Schema == nil || crd.Spec.Versions[i].Schema.OpenAPIV3Schema == nil {
			return fmt.Errorf("CRD %s has no schema for %s", f.CRDName(), version)
		}
		crd.Spec.Versions[i].Schema.OpenAPIV3Schema.Description = description
		if err := f.Env.Client.Update(ctx, crd); err != nil {
			return err
		}
		generation = crd.Generation
		return nil
	})
	return generation, err
}
