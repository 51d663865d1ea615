//go:build e2e

package scenario

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/restow/restow/internal/testenv"
)

// ReleaseChain is a project's CRDs over three of its releases: the first
// stores at old versions, the second switches storage and still serves
// them, the third drops them.
type ReleaseChain struct {
	// dir holds a directory per release tag, each with crds/ and, for the
	// first, samples/.
	Dir string
	// group is the API group of the project's CRDs.
	Group string
	// first, second and third are the release tags in order.
	First, Second, Third string
	// namespace holds the namespaced samples.
	Namespace string
	// copies of each sample are written, so that a pass has work to do.
	Copies int
	// prepared are the CRDs prepare must prepare for the third release.
	Prepared []string
}

// FluxSourceController is Flux's source-controller: Buckets and OCIRepositories
// stored at v1beta2 in v1.3.0, switched to v1 in v1.6.0, v1 alone in
// v1.9.1.
var FluxSourceController = ReleaseChain{
	Dir: "../releases/testdata/fluxcd-source-controller", Group: "source.toolkit.fluxcd.io",
	First: "v1.3.0", Second: "v1.6.0", Third: "v1.9.1",
	Namespace: "flux-system", Copies: 200,
	Prepared: []string{"buckets.source.toolkit.fluxcd.io", "ocirepositories.source.toolkit.fluxcd.io"},
}

// GatewayAPI is Kubernetes' Gateway API (standard channel): GatewayClasses,
// Gateways and HTTPRoutes stored at v1alpha2 in v0.5.1, switched to
// v1beta1 in v0.6.2 (which adds ReferenceGrants at v1alpha2), v1alpha2
// dropped from the three in v1.0.0.
var GatewayAPI = ReleaseChain{
	Dir: "../releases/testdata/gateway-api", Group: "gateway.networking.k8s.io",
	First: "v0.5.1", Second: "v0.6.2", Third: "v1.0.0",
	Namespace: "gateway-conformance", Copies: 50,
	Prepared: []string{
		"gatewayclasses.gateway.networking.k8s.io", "gateways.gateway.networking.k8s.io", "httproutes.gateway.networking.k8s.io",
	},
}

// Object is one of the samples a ReleaseChain wrote.
type Object struct {
	crd        string
	kind       string
	plural     string
	name       string
	namespaced bool
}

// CRDDir is where release tag's CRDs are.
func (c ReleaseChain) CRDDir(tag string) string { return filepath.Join(c.Dir, tag, "crds") }

// CRDs reads release tag's CRDs.
func (c ReleaseChain) CRDs(t *testing.T, tag string) []*apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	entries, err := os.ReadDir(c.CRDDir(tag))
	if err != nil {
		t.Fatal(err)
	}
	out := make([]*apiextensionsv1.CustomResourceDefinition, 0, len(entries))
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join(c.CRDDir(tag), e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.Unmarshal(raw, crd); err != nil {
			t.Fatalf("%s: %v", e.Name(), err)
		}
		out = append(out, crd)
	}
	return out
}

// Storage is the storage version of each CRD in release tag.
func (c ReleaseChain) Storage(t *testing.T, tag string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, crd := range c.CRDs(t, tag) {
		for _, v := range crd.Spec.Versions {
			if v.Storage {
				out[crd.Name] = v.Name
			}
		}
	}
	return out
}

// ApplyRelease applies release tag's CRDs server-side, as `kubectl apply
// --server-side` and Flux's own install do, or client-side (an update of
// the whole spec), and waits until each is established.
func (c ReleaseChain) ApplyRelease(t *testing.T, cp *testenv.Env, tag string, serverSide bool) error {
	t.Helper()
	releaseCRDs := c.CRDs(t, tag)
	errs := make([]error, 0, len(releaseCRDs))
	for _, crd := range releaseCRDs {
		var err error
		if serverSide {
			u := &unstructured.Unstructured{}
			raw, _ := yaml.Marshal(crd)
			if err := yaml.Unmarshal(raw, &u.Object); err != nil {
				t.Fatal(err)
			}
			unstructured.RemoveNestedField(u.Object, "status")
			unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
			err = cp.Client.Apply(t.Context(), client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("flux"), client.ForceOwnership)
		} else {
			live := &apiextensionsv1.CustomResourceDefinition{}
			if err = cp.Client.Get(t.Context(), client.ObjectKey{Name: crd.Name}, live); apierrors.IsNotFound(err) {
				err = cp.Client.Create(t.Context(), crd.DeepCopy(), client.FieldOwner("kubectl-client-side-apply"))
			} else if err == nil {
				live.Spec = crd.Spec
				err = cp.Client.Update(t.Context(), live, client.FieldOwner("kubectl-client-side-apply"))
			}
		}
		if err == nil {
			err = cp.WaitForCRD(t.Context(), crd.Name)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Samples reads the project's example objects of the first release, every
// document of every file under its samples/, less those of kinds it has no
// CRD for (the examples' Namespaces).
func (c ReleaseChain) Samples(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	err := filepath.WalkDir(filepath.Join(c.Dir, c.First, "samples"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for doc := range strings.SplitSeq(string(raw), "\n---") {
			sample := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(doc), &sample.Object); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			if strings.HasPrefix(sample.GetAPIVersion(), c.Group+"/") {
				out = append(out, sample)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Installed applies the first release of the chain and writes its samples.
func (c ReleaseChain) Installed(t *testing.T, cp *testenv.Env) []Object {
	t.Helper()
	if err := c.ApplyRelease(t, cp, c.First, true); err != nil {
		t.Fatal(err)
	}
	return c.WriteSamples(t, cp)
}

// WriteSamples writes c.Copies of each sample of the first release, the
// namespaced ones in c.Namespace.
func (c ReleaseChain) WriteSamples(t *testing.T, cp *testenv.Env) []Object {
	t.Helper()
	if err := cp.EnsureNamespaces(t.Context(), c.Namespace); err != nil {
		t.Fatal(err)
	}
	byKind := map[string]*apiextensionsv1.CustomResourceDefinition{}
	for _, crd := range c.CRDs(t, c.First) {
		byKind[crd.Spec.Names.Kind] = crd
	}
	samples := c.Samples(t)
	objects := make([]Object, 0, c.Copies*len(samples))
	for n, sample := range samples {
		crd := byKind[sample.GetKind()]
		namespaced := crd.Spec.Scope == apiextensionsv1.NamespaceScoped
		name := func(i int) string { return fmt.Sprintf("%s-%02d-%03d", sample.GetName(), n, i) }
		err := cp.CreateObjects(t.Context(), c.Copies, func(i int) client.Object {
			o := sample.DeepCopy()
			o.SetNamespace("")
			if namespaced {
				o.SetNamespace(c.Namespace)
			}
			o.SetName(name(i))
			return o
		})
		if err != nil {
			t.Fatalf("writing the sample %s %s: %v", sample.GetKind(), sample.GetName(), err)
		}
		for i := range c.Copies {
			objects = append(objects, Object{crd: crd.Name, kind: crd.Spec.Names.Kind, plural: crd.Spec.Names.Plural, name: name(i), namespaced: namespaced})
		}
	}
	if len(objects) == 0 {
		t.Fatal("no Object written")
	}
	return objects
}

// Upgrade applies the second release of the chain, which switches the
// storage version and which the API server must accept.
func (c ReleaseChain) Upgrade(t *testing.T, cp *testenv.Env, serverSide bool) {
	t.Helper()
	if err := c.ApplyRelease(t, cp, c.Second, serverSide); err != nil {
		t.Fatalf("%s: %v", c.Second, err)
	}
}

// ReadKey names an object read at a version.
type ReadKey struct{ crd, name, version string }

// ReadAll reads every object at every version its CRD serves now.
func (c ReleaseChain) ReadAll(t *testing.T, cp *testenv.Env, objects []Object) map[ReadKey]any {
	t.Helper()
	read := map[ReadKey]any{}
	for _, crd := range c.CRDsLive(t, cp) {
		for _, v := range crd.Spec.Versions {
			if !v.Served {
				continue
			}
			list := &unstructured.UnstructuredList{}
			list.SetAPIVersion(crd.Spec.Group + "/" + v.Name)
			list.SetKind(crd.Spec.Names.ListKind)
			var opts []client.ListOption
			if crd.Spec.Scope == apiextensionsv1.NamespaceScoped {
				opts = append(opts, client.InNamespace(c.Namespace))
			}
			if err := cp.Client.List(t.Context(), list, opts...); err != nil {
				t.Fatalf("listing %s at %s: %v", crd.Name, v.Name, err)
			}
			for _, o := range list.Items {
				read[ReadKey{crd.Name, o.GetName(), v.Name}] = o.Object["spec"]
			}
		}
	}
	if n := len(objects); n == 0 {
		t.Fatal("no Object written")
	}
	return read
}

// AssertReadsAsBefore reads every object at every version served now and
// compares each read with the one at the same version before; every
// object must be read at least once at a version served before and after.
func (c ReleaseChain) AssertReadsAsBefore(t *testing.T, cp *testenv.Env, objects []Object, before map[ReadKey]any) {
	t.Helper()
	after := c.ReadAll(t, cp, objects)
	type id struct{ crd, name string }
	compared := map[id]bool{}
	for k, spec := range after {
		was, ok := before[k]
		if !ok {
			continue
		}
		compared[id{k.crd, k.name}] = true
		if !equality.Semantic.DeepEqual(was, spec) {
			t.Errorf("%s %s reads at %s as %v, was %v", k.crd, k.name, k.version, spec, was)
		}
	}
	for _, o := range objects {
		if !compared[id{o.crd, o.name}] {
			t.Errorf("%s %s was not read as before at any version served before and after", o.crd, o.name)
		}
	}
}

// AssertStored reads every object from etcd: each must be stored at its
// CRD's storage version in the second release, and status.storedVersions
// of its CRD list that version alone.
func (c ReleaseChain) AssertStored(t *testing.T, cp *testenv.Env, objects []Object) {
	t.Helper()
	storage := c.Storage(t, c.Second)
	counts := map[string]int{}
	fixtures := map[string]testenv.Fixture{}
	for _, o := range objects {
		counts[o.crd]++
		fixtures[o.crd] = testenv.Fixture{Env: cp, Group: c.Group, Kind: o.kind, Plural: o.plural, Namespaced: o.namespaced}
	}
	for name, fx := range fixtures {
		fx.AssertAllStoredAt(t, storage[name], counts[name])
		fx.AssertStoredVersions(t, storage[name])
	}
}

// CRDsLive reads the project's CRDs as they are.
func (c ReleaseChain) CRDsLive(t *testing.T, cp *testenv.Env) []apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	var list apiextensionsv1.CustomResourceDefinitionList
	if err := cp.Client.List(t.Context(), &list); err != nil {
		t.Fatal(err)
	}
	return slices.DeleteFunc(list.Items, func(crd apiextensionsv1.CustomResourceDefinition) bool {
		return crd.Spec.Group != c.Group
	})
}

// CRDRevisions are the CRDs' resourceVersions.
func (c ReleaseChain) CRDRevisions(t *testing.T, cp *testenv.Env) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, crd := range c.CRDsLive(t, cp) {
		out[crd.Name] = crd.ResourceVersion
	}
	return out
}

// AwaitMigrated waits until every CRD's status.storedVersions lists its
// storage version in the second release alone, as the operator's
// migrations leave it.
func (c ReleaseChain) AwaitMigrated(t *testing.T, cp *testenv.Env) {
	t.Helper()
	storage := c.Storage(t, c.Second)
	testenv.WaitProgress(t, "the operator's migrations", 3*time.Minute, func(ctx context.Context) (bool, string, error) {
		var pending []string
		for _, crd := range c.CRDsLive(t, cp) {
			if !slices.Equal(crd.Status.StoredVersions, []string{storage[crd.Name]}) {
				pending = append(pending, fmt.Sprintf("%s %v", crd.Name, crd.Status.StoredVersions))
			}
		}
		return len(pending) == 0, strings.Join(pending, "; "), nil
	})
}
