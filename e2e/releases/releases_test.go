//go:build e2e

// Package releases upgrades a real project's CRDs across its own releases,
// as its users do: Flux's source-controller, whose five CRDs (conversion
// None) moved their storage version to v1 over several releases and then
// dropped v1beta1 and v1beta2 (testdata/fluxcd-source-controller, taken
// from the project's repository at each release tag, with the project's
// own example objects; testdata/README.md says where from). Run with `make
// test-e2e`.
package releases

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/restow/restow/e2e/scenario"
	"github.com/restow/restow/internal/cli"
	"github.com/restow/restow/internal/operator"
	"github.com/restow/restow/internal/testenv"
)

const (
	chain = "testdata/fluxcd-source-controller"
	// first and second are the releases every case applies first.
	first, second = "v1.3.0", "v1.6.0"
	// namespace holds the samples, where Flux keeps its own objects.
	namespace = "flux-system"
	// copies of each sample are written, so that a pass has work to do.
	copies = 200
)

// hookArgs are the prepare hook's settings as shipped
// (config/samples/crd-author/job-prepare.yaml).
var hookArgs = []string{"--settle-window=2m", "--timeout=4m"}

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	os.Exit(m.Run())
}

// TestFluxSourceControllerReleases: v1.3.0 stores Buckets and
// OCIRepositories at v1beta2 (Buckets serve v1beta1 too), v1.6.0 switches them to
// v1, v1.9.1 serves v1 alone. Applied one after another, v1.9.1 is refused
// while status.storedVersions lists v1beta2; kubectl restow prepare, with
// the hook's settings, prepares it, and every object reads as before. A
// rollback from v1.6.0 to v1.3.0 drops v1, the live storage version: its
// bridge, v1beta2, is judged against v1.3.0's own schema of it, which
// lacks fields the live schemas allow, and prepare blocks it. With
// restow's operator at its defaults from v1.3.0 on, v1.9.1 needs no
// preparing.
func TestFluxSourceControllerReleases(t *testing.T) {
	// Each case has a control plane of its own and mostly waits out a
	// settle window: they run side by side.
	t.Run("v1.3.0 to v1.6.0 to v1.9.1 without restow", func(t *testing.T) {
		t.Parallel()
		cp := testenv.Start(t, testenv.Options{})
		installed(t, cp)
		upgrade(t, cp, true)
		err := applyRelease(t, cp, "v1.9.1", true)
		if err == nil || !strings.Contains(err.Error(), "missing from spec.versions") {
			t.Fatalf("v1.9.1 applied: %v, want the API server's refusal", err)
		}
		t.Logf("v1.9.1 without restow: %v", err)
	})
	t.Run("v1.3.0 to v1.6.0 to v1.9.1 with prepare", func(t *testing.T) {
		t.Parallel()
		cp := testenv.Start(t, testenv.Options{})
		objects := installed(t, cp)
		upgrade(t, cp, false)
		before := readAll(t, cp, objects)
		out, code, took := restow(t, cp, append([]string{"prepare", "-f", crdDir("v1.9.1")}, hookArgs...)...)
		if code != 0 || took >= 4*time.Minute {
			t.Fatalf("prepare exited %d after %s, want 0 within the hook's --timeout", code, took)
		}
		for _, want := range []string{"buckets.source.toolkit.fluxcd.io: prepared", "ocirepositories.source.toolkit.fluxcd.io: prepared"} {
			if !strings.Contains(out, want) {
				t.Errorf("prepare's output lacks %q", want)
			}
		}
		if err := applyRelease(t, cp, "v1.9.1", true); err != nil {
			t.Fatalf("v1.9.1 after prepare, server-side: %v", err)
		}
		if err := applyRelease(t, cp, "v1.9.1", false); err != nil {
			t.Fatalf("v1.9.1 after prepare, client-side: %v", err)
		}
		assertStoredAt(t, cp, objects, "v1")
		assertReadsAsBefore(t, cp, objects, before)
	})
	t.Run("a rollback from v1.6.0 to v1.3.0", func(t *testing.T) {
		t.Parallel()
		cp := testenv.Start(t, testenv.Options{})
		objects := installed(t, cp)
		upgrade(t, cp, false)
		if out, code, _ := restow(t, cp, append([]string{"prepare", "-f", crdDir("v1.9.1")}, hookArgs...)...); code != 0 {
			t.Fatalf("prepare for v1.9.1 exited %d:\n%s", code, out)
		}
		err := applyRelease(t, cp, "v1.3.0", true)
		if err == nil || !strings.Contains(err.Error(), "missing from spec.versions") {
			t.Fatalf("the rollback to v1.3.0 applied: %v, want the API server's refusal", err)
		}
		t.Logf("the rollback without restow: %v", err)
		rollback(t, cp, objects)
	})
	t.Run("restow's operator at its defaults from v1.3.0 on", func(t *testing.T) {
		t.Parallel()
		cp := testenv.Start(t, testenv.Options{CRDDirectoryPaths: []string{scenario.CRDDirectory}})
		kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
		if err := cp.WriteKubeconfig(kubeconfig); err != nil {
			t.Fatal(err)
		}
		operator.StartProcess(t, operator.ProcessOptions{Kubeconfig: kubeconfig})
		objects := installed(t, cp)
		upgrade(t, cp, true)
		awaitStoredVersions(t, cp, "v1")
		out, code, _ := restow(t, cp, "preflight", "-f", crdDir("v1.9.1"))
		if code != 0 || strings.Contains(out, "needs prepare") {
			t.Errorf("preflight of v1.9.1 exited %d, want 0: the operator migrated every CRD by itself\n%s", code, out)
		}
		if err := applyRelease(t, cp, "v1.9.1", true); err != nil {
			t.Fatalf("v1.9.1 with the operator: %v", err)
		}
		assertStoredAt(t, cp, objects, "v1")
	})
}

// rollback prepares the rollback to v1.3.0. Its bridge for Buckets and
// OCIRepositories would be v1beta2, and v1.3.0's own schema of v1beta2
// lacks fields that v1.6.0's schemas allow (spec.proxySecretRef among
// them): no sample sets one, so only the comparison of the schemas sees
// that an object written with one would lose it. prepare blocks both,
// naming the field, and changes nothing; the rollback stays refused.
func rollback(t *testing.T, cp *testenv.Env, objects []object) {
	revisions := crdRevisions(t, cp)
	out, code, took := restow(t, cp, append([]string{"prepare", "-f", crdDir("v1.3.0")}, hookArgs...)...)
	t.Logf("prepare for the rollback: exit %d after %s", code, took.Round(time.Millisecond))
	if code != cli.ExitBlocked {
		t.Fatalf("prepare for the rollback exited %d, want %d", code, cli.ExitBlocked)
	}
	for _, want := range []string{
		"ocirepositories.source.toolkit.fluxcd.io: blocked, left as it is",
		"buckets.source.toolkit.fluxcd.io: blocked, left as it is",
		"spec.proxySecretRef",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("prepare's output lacks %q", want)
		}
	}
	for name, rv := range crdRevisions(t, cp) {
		if rv != revisions[name] {
			t.Errorf("prepare wrote %s: resourceVersion %s, then %s", name, revisions[name], rv)
		}
	}
	if err := applyRelease(t, cp, "v1.3.0", true); err == nil {
		t.Errorf("the rollback applied though prepare blocked it")
	}
	assertStoredAt(t, cp, objects, "v1")
}

// object is one of the samples written.
type object struct {
	crd    string
	group  string
	kind   string
	plural string
	name   string
}

// crdDir is where release tag's CRDs are.
func crdDir(tag string) string { return filepath.Join(chain, tag, "crds") }

// crds reads release tag's CRDs.
func crds(t *testing.T, tag string) []*apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	entries, err := os.ReadDir(crdDir(tag))
	if err != nil {
		t.Fatal(err)
	}
	out := make([]*apiextensionsv1.CustomResourceDefinition, 0, len(entries))
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join(crdDir(tag), e.Name()))
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

// applyRelease applies release tag's CRDs server-side, as `kubectl apply
// --server-side` and Flux's own install do, or client-side (an update of
// the whole spec), and waits until each is established.
func applyRelease(t *testing.T, cp *testenv.Env, tag string, serverSide bool) error {
	t.Helper()
	releaseCRDs := crds(t, tag)
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
			if err = cp.Client.Get(t.Context(), client.ObjectKey{Name: crd.Name}, live); err == nil {
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

// installed applies the first release of the chain and writes copies of
// each of its samples.
func installed(t *testing.T, cp *testenv.Env) []object {
	t.Helper()
	const tag = first
	if err := applyRelease(t, cp, tag, true); err != nil {
		t.Fatal(err)
	}
	if err := cp.EnsureNamespaces(t.Context(), namespace); err != nil {
		t.Fatal(err)
	}
	byKind := map[string]*apiextensionsv1.CustomResourceDefinition{}
	for _, crd := range crds(t, tag) {
		byKind[crd.Spec.Names.Kind] = crd
	}
	dir := filepath.Join(chain, tag, "samples")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	objects := make([]object, 0, copies*len(entries))
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		sample := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(raw, &sample.Object); err != nil {
			t.Fatalf("%s: %v", e.Name(), err)
		}
		crd := byKind[sample.GetKind()]
		err = cp.CreateObjects(t.Context(), copies, func(i int) client.Object {
			o := sample.DeepCopy()
			o.SetNamespace(namespace)
			o.SetName(fmt.Sprintf("%s-%03d", o.GetName(), i))
			return o
		})
		if err != nil {
			t.Fatalf("writing the sample %s: %v", e.Name(), err)
		}
		for i := range copies {
			objects = append(objects, object{crd: crd.Name, group: crd.Spec.Group, kind: crd.Spec.Names.Kind, plural: crd.Spec.Names.Plural,
				name: fmt.Sprintf("%s-%03d", sample.GetName(), i)})
		}
	}
	return objects
}

// upgrade applies the second release of the chain, which switches the
// storage version and which the API server must accept.
func upgrade(t *testing.T, cp *testenv.Env, serverSide bool) {
	t.Helper()
	const tag = second
	if err := applyRelease(t, cp, tag, serverSide); err != nil {
		t.Fatalf("%s: %v", tag, err)
	}
}

// restow runs kubectl-restow with args against cp.
func restow(t *testing.T, cp *testenv.Env, args ...string) (string, int, time.Duration) {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	args = append(args, "--kubeconfig="+kubeconfig, "--cache-dir="+filepath.Join(t.TempDir(), "cache"))
	var out bytes.Buffer
	began := time.Now()
	code := cli.Execute(t.Context(), args, genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &out})
	took := time.Since(began)
	t.Logf("kubectl restow %s: exit %d after %s\n%s", strings.Join(args, " "), code, took.Round(time.Millisecond), out.String())
	return out.String(), code, took
}

// key names an object read at a version.
type key struct{ crd, name, version string }

// readAll reads every object at every version its CRD serves now.
func readAll(t *testing.T, cp *testenv.Env, objects []object) map[key]any {
	t.Helper()
	read := map[key]any{}
	for _, crd := range crdsLive(t, cp) {
		for _, v := range crd.Spec.Versions {
			if !v.Served {
				continue
			}
			list := &unstructured.UnstructuredList{}
			list.SetAPIVersion(crd.Spec.Group + "/" + v.Name)
			list.SetKind(crd.Spec.Names.ListKind)
			if err := cp.Client.List(t.Context(), list, client.InNamespace(namespace)); err != nil {
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
func assertReadsAsBefore(t *testing.T, cp *testenv.Env, objects []object, before map[key]any) {
	t.Helper()
	after := readAll(t, cp, objects)
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

// assertStoredAt reads every object from etcd: each must be stored at
// version, and status.storedVersions of every CRD version alone.
func assertStoredAt(t *testing.T, cp *testenv.Env, objects []object, version string) {
	t.Helper()
	counts := map[string]int{}
	fixtures := map[string]testenv.Fixture{}
	for _, o := range objects {
		counts[o.crd]++
		fixtures[o.crd] = testenv.Fixture{Env: cp, Group: o.group, Kind: o.kind, Plural: o.plural, Namespaced: true}
	}
	for name, fx := range fixtures {
		fx.AssertAllStoredAt(t, version, counts[name])
		fx.AssertStoredVersions(t, version)
	}
}

// crdsLive reads source-controller's CRDs as they are.
func crdsLive(t *testing.T, cp *testenv.Env) []apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	var list apiextensionsv1.CustomResourceDefinitionList
	if err := cp.Client.List(t.Context(), &list); err != nil {
		t.Fatal(err)
	}
	return slices.DeleteFunc(list.Items, func(c apiextensionsv1.CustomResourceDefinition) bool {
		return c.Spec.Group != "source.toolkit.fluxcd.io"
	})
}

// crdRevisions are the CRDs' resourceVersions.
func crdRevisions(t *testing.T, cp *testenv.Env) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, c := range crdsLive(t, cp) {
		out[c.Name] = c.ResourceVersion
	}
	return out
}

// awaitStoredVersions waits until every CRD's status.storedVersions lists
// version alone, as the operator's migrations leave it.
func awaitStoredVersions(t *testing.T, cp *testenv.Env, version string) {
	t.Helper()
	testenv.WaitProgress(t, "the operator's migrations", 3*time.Minute, func(ctx context.Context) (bool, string, error) {
		var pending []string
		for _, c := range crdsLive(t, cp) {
			if !slices.Equal(c.Status.StoredVersions, []string{version}) {
				pending = append(pending, fmt.Sprintf("%s %v", c.Name, c.Status.StoredVersions))
			}
		}
		return len(pending) == 0, strings.Join(pending, "; "), nil
	})
}
