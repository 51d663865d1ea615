//go:build e2e

package releases

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

// releaseChain is a project's CRDs over three of its releases: the first
// stores at old versions, the second switches storage and still serves
// them, the third drops them.
type releaseChain struct {
	// dir holds a directory per release tag, each with crds/ and, for the
	// first, samples/.
	dir string
	// group is the API group of the project's CRDs.
	group string
	// first, second and third are the release tags in order.
	first, second, third string
	// namespace holds the namespaced samples.
	namespace string
	// copies of each sample are written, so that a pass has work to do.
	copies int
	// prepared are the CRDs prepare must prepare for the third release.
	prepared []string
}

// fluxSource is Flux's source-controller: Buckets and OCIRepositories
// stored at v1beta2 in v1.3.0, switched to v1 in v1.6.0, v1 alone in
// v1.9.1.
var fluxSource = releaseChain{
	dir: "testdata/fluxcd-source-controller", group: "source.toolkit.fluxcd.io",
	first: "v1.3.0", second: "v1.6.0", third: "v1.9.1",
	namespace: "flux-system", copies: 200,
	prepared: []string{"buckets.source.toolkit.fluxcd.io", "ocirepositories.source.toolkit.fluxcd.io"},
}

// gatewayAPI is Kubernetes' Gateway API (standard channel): GatewayClasses,
// Gateways and HTTPRoutes stored at v1alpha2 in v0.5.1, switched to
// v1beta1 in v0.6.2 (which adds ReferenceGrants at v1alpha2), v1alpha2
// dropped from the three in v1.0.0.
var gatewayAPI = releaseChain{
	dir: "testdata/gateway-api", group: "gateway.networking.k8s.io",
	first: "v0.5.1", second: "v0.6.2", third: "v1.0.0",
	namespace: "gateway-conformance", copies: 50,
	prepared: []string{
		"gatewayclasses.gateway.networking.k8s.io", "gateways.gateway.networking.k8s.io", "httproutes.gateway.networking.k8s.io",
	},
}

// object is one of the samples written.
type object struct {
	crd        string
	kind       string
	plural     string
	name       string
	namespaced bool
}

// crdDir is where release tag's CRDs are.
func (c releaseChain) crdDir(tag string) string { return filepath.Join(c.dir, tag, "crds") }

// crds reads release tag's CRDs.
func (c releaseChain) crds(t *testing.T, tag string) []*apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	entries, err := os.ReadDir(c.crdDir(tag))
	if err != nil {
		t.Fatal(err)
	}
	out := make([]*apiextensionsv1.CustomResourceDefinition, 0, len(entries))
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join(c.crdDir(tag), e.Name()))
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

// storage is the storage version of each CRD in release tag.
func (c releaseChain) storage(t *testing.T, tag string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, crd := range c.crds(t, tag) {
		for _, v := range crd.Spec.Versions {
			if v.Storage {
				out[crd.Name] = v.Name
			}
		}
	}
	return out
}

// applyRelease applies release tag's CRDs server-side, as `kubectl apply
// --server-side` and Flux's own install do, or client-side (an update of
// the whole spec), and waits until each is established.
func (c releaseChain) applyRelease(t *testing.T, cp *testenv.Env, tag string, serverSide bool) error {
	t.Helper()
	releaseCRDs := c.crds(t, tag)
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

// samples reads the project's example objects of the first release, every
// document of every file under its samples/, less those of kinds it has no
// CRD for (the examples' Namespaces).
func (c releaseChain) samples(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	err := filepath.WalkDir(filepath.Join(c.dir, c.first, "samples"), func(path string, d fs.DirEntry, err error) error {
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
			if strings.HasPrefix(sample.GetAPIVersion(), c.group+"/") {
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

// installed applies the first release of the chain and writes c.copies of
// each of its samples, the namespaced ones in c.namespace.
func (c releaseChain) installed(t *testing.T, cp *testenv.Env) []object {
	t.Helper()
	if err := c.applyRelease(t, cp, c.first, true); err != nil {
		t.Fatal(err)
	}
	if err := cp.EnsureNamespaces(t.Context(), c.namespace); err != nil {
		t.Fatal(err)
	}
	byKind := map[string]*apiextensionsv1.CustomResourceDefinition{}
	for _, crd := range c.crds(t, c.first) {
		byKind[crd.Spec.Names.Kind] = crd
	}
	samples := c.samples(t)
	objects := make([]object, 0, c.copies*len(samples))
	for n, sample := range samples {
		crd := byKind[sample.GetKind()]
		namespaced := crd.Spec.Scope == apiextensionsv1.NamespaceScoped
		name := func(i int) string { return fmt.Sprintf("%s-%02d-%03d", sample.GetName(), n, i) }
		err := cp.CreateObjects(t.Context(), c.copies, func(i int) client.Object {
			o := sample.DeepCopy()
			o.SetNamespace("")
			if namespaced {
				o.SetNamespace(c.namespace)
			}
			o.SetName(name(i))
			return o
		})
		if err != nil {
			t.Fatalf("writing the sample %s %s: %v", sample.GetKind(), sample.GetName(), err)
		}
		for i := range c.copies {
			objects = append(objects, object{crd: crd.Name, kind: crd.Spec.Names.Kind, plural: crd.Spec.Names.Plural, name: name(i), namespaced: namespaced})
		}
	}
	if len(objects) == 0 {
		t.Fatal("no object written")
	}
	return objects
}

// upgrade applies the second release of the chain, which switches the
// storage version and which the API server must accept.
func (c releaseChain) upgrade(t *testing.T, cp *testenv.Env, serverSide bool) {
	t.Helper()
	if err := c.applyRelease(t, cp, c.second, serverSide); err != nil {
		t.Fatalf("%s: %v", c.second, err)
	}
}

// key names an object read at a version.
type key struct{ crd, name, version string }

// readAll reads every object at every version its CRD serves now.
func (c releaseChain) readAll(t *testing.T, cp *testenv.Env, objects []object) map[key]any {
	t.Helper()
	read := map[key]any{}
	for _, crd := range c.crdsLive(t, cp) {
		for _, v := range crd.Spec.Versions {
			if !v.Served {
				continue
			}
			list := &unstructured.UnstructuredList{}
			list.SetAPIVersion(crd.Spec.Group + "/" + v.Name)
			list.SetKind(crd.Spec.Names.ListKind)
			var opts []client.ListOption
			if crd.Spec.Scope == apiextensionsv1.NamespaceScoped {
				opts = append(opts, client.InNamespace(c.namespace))
			}
			if err := cp.Client.List(t.Context(), list, opts...); err != nil {
				t.Fatalf("listing %s at %s: %v", crd.Name, v.Name, err)
			}
			for _, o := range list.Items {
				read[key{crd.Name, o.GetName(), v.Name}] = o.Object["spec"]
			}
		}
	}
	if n := len(objects); n == 0 {
		t.Fatal("no object written")
	}
	return read
}

// assertReadsAsBefore reads every object at every version served now and
// compares each read with the one at the same version before; every
// object must be read at least once at a version served before and after.
func (c releaseChain) assertReadsAsBefore(t *testing.T, cp *testenv.Env, objects []object, before map[key]any) {
	t.Helper()
	after := c.readAll(t, cp, objects)
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

// assertStored reads every object from etcd: each must be stored at its
// CRD's storage version in the second release, and status.storedVersions
// of its CRD list that version alone.
func (c releaseChain) assertStored(t *testing.T, cp *testenv.Env, objects []object) {
	t.Helper()
	storage := c.storage(t, c.second)
	counts := map[string]int{}
	fixtures := map[string]testenv.Fixture{}
	for _, o := range objects {
		counts[o.crd]++
		fixtures[o.crd] = testenv.Fixture{Env: cp, Group: c.group, Kind: o.kind, Plural: o.plural, Namespaced: o.namespaced}
	}
	for name, fx := range fixtures {
		fx.AssertAllStoredAt(t, storage[name], counts[name])
		fx.AssertStoredVersions(t, storage[name])
	}
}

// crdsLive reads the project's CRDs as they are.
func (c releaseChain) crdsLive(t *testing.T, cp *testenv.Env) []apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	var list apiextensionsv1.CustomResourceDefinitionList
	if err := cp.Client.List(t.Context(), &list); err != nil {
		t.Fatal(err)
	}
	return slices.DeleteFunc(list.Items, func(crd apiextensionsv1.CustomResourceDefinition) bool {
		return crd.Spec.Group != c.group
	})
}

// crdRevisions are the CRDs' resourceVersions.
func (c releaseChain) crdRevisions(t *testing.T, cp *testenv.Env) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, crd := range c.crdsLive(t, cp) {
		out[crd.Name] = crd.ResourceVersion
	}
	return out
}

// awaitMigrated waits until every CRD's status.storedVersions lists its
// storage version in the second release alone, as the operator's
// migrations leave it.
func (c releaseChain) awaitMigrated(t *testing.T, cp *testenv.Env) {
	t.Helper()
	storage := c.storage(t, c.second)
	testenv.WaitProgress(t, "the operator's migrations", 3*time.Minute, func(ctx context.Context) (bool, string, error) {
		var pending []string
		for _, crd := range c.crdsLive(t, cp) {
			if !slices.Equal(crd.Status.StoredVersions, []string{storage[crd.Name]}) {
				pending = append(pending, fmt.Sprintf("%s %v", crd.Name, crd.Status.StoredVersions))
			}
		}
		return len(pending) == 0, strings.Join(pending, "; "), nil
	})
}
