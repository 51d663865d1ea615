package cli_test

import (
	"fmt"
	"net/http"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/restow/restow/internal/cli"
	"github.com/restow/restow/internal/operator"
	"github.com/restow/restow/internal/testenv"
)

// releaseObjects is how many objects each CRD of the prepare tests holds.
const releaseObjects = 2000

// rich is an object's spec with fields of every kind, so that a read after
// the apply shows whether any was lost.
func rich(i int) map[string]any {
	return map[string]any{
		"n":       int64(i),
		"label":   fmt.Sprintf("widget-%05d", i),
		"enabled": i%2 == 0,
		"nested":  map[string]any{"list": []any{"a", int64(i % 7)}, "ratio": "0.5"},
	}
}

// crdVersion is the resourceVersion of the live CRD, which moves with any
// write to it, status included.
func crdVersion(t *testing.T, name string) string {
	t.Helper()
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Name: name}, crd); err != nil {
		t.Fatal(err)
	}
	return crd.ResourceVersion
}

// recordWrites records every request but reads and dry runs that
// kubectl-restow sends until the returned function is called, which
// returns them.
func recordWrites(t *testing.T) func() []string {
	var mu sync.Mutex
	var writes []string
	restore := cli.SetWrapTransport(func(rt http.RoundTripper) http.RoundTripper {
		return roundTrip(func(req *http.Request) (*http.Response, error) {
			if req.Method != http.MethodGet && req.URL.Query().Get("dryRun") != "All" {
				mu.Lock()
				writes = append(writes, req.Method+" "+req.URL.Path)
				mu.Unlock()
			}
			return rt.RoundTrip(req)
		})
	})
	t.Cleanup(restore)
	return func() []string {
		restore()
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(writes)
	}
}

// assertLeftAsItIs runs prepare on a release that is blocked and checks
// that it says so, exits ExitBlocked and changes nothing: the CRD's
// resourceVersion is before, and etcd holds every object at version alone,
// the one version status.storedVersions lists.
func assertLeftAsItIs(t *testing.T, fx testenv.Fixture, release, before, version string) {
	t.Helper()
	out, _, code := restow(t, "prepare", "-f", release, "--in-process")
	if code != cli.ExitBlocked || !strings.Contains(out, fx.CRDName()+": blocked, left as it is") {
		t.Errorf("prepare exited %d, want %d and left as it is", code, cli.ExitBlocked)
	}
	if after := crdVersion(t, fx.CRDName()); after != before {
		t.Errorf("the CRD's resourceVersion moved from %s to %s: prepare wrote it", before, after)
	}
	fx.AssertAllStoredAt(t, version, releaseObjects)
	fx.AssertStoredVersions(t, version)
}

// applyAccepted applies the release that keeps version alone, which the API
// server must accept.
func applyAccepted(t *testing.T, name, version string) {
	t.Helper()
	if err := env.UpdateCRD(t.Context(), name, func(crd *apiextensionsv1.CustomResourceDefinition) {
		crd.Spec.Versions = slices.DeleteFunc(crd.Spec.Versions, func(v apiextensionsv1.CustomResourceDefinitionVersion) bool { return v.Name != version })
	}); err != nil {
		t.Fatalf("the release's apply after prepare: %v", err)
	}
}

// TestPrepare (e): several CRDs, of which one is blocked, prepared with the
// operator running. prepare hands each that needs it to the operator, which
// migrates every object (checked in etcd) and prunes; their applies are
// then accepted and every object reads with every field. The blocked one is
// left as it is, CRD and etcd alike, and the exit code says not all could be
// prepared.
func TestPrepare(t *testing.T) {
	needing := make([]testenv.Fixture, 0, 2)
	keys := map[string][]client.ObjectKey{}
	for _, name := range []string{"one", "two"} {
		fx := testenv.Fixture{Env: env, Group: name + ".prepare.restow.dev", Kind: "Widget", Plural: "widgets", Namespaced: true}
		fx.Install(t, "v1alpha1", "v1")
		keys[fx.CRDName()] = fx.CreateObjects(t, "v1alpha1", releaseObjects, rich, "prepare-"+name)
		fx.SwitchStorage(t, "v1")
		widgets{group: fx.Group}.deleteMigrationsAtEnd(t)
		needing = append(needing, fx)
	}
	skipped := testenv.Fixture{Env: env, Group: "skipped.prepare.restow.dev", Kind: "Widget", Plural: "widgets", Namespaced: true}
	skipped.Install(t, "v1alpha1", "v1beta1")
	skipped.CreateObjects(t, "v1alpha1", releaseObjects, rich, "prepare-skipped")
	dir := t.TempDir()
	for _, fx := range needing {
		writeRelease(t, filepath.Join(dir, fx.Group+".yaml"), fx.CRDName(), "v1")
	}
	// The blocked CRD first: prepare goes on past it.
	writeRelease(t, filepath.Join(dir, "0-skipped.yaml"), skipped.CRDName(), "v1")
	skippedBefore := crdVersion(t, skipped.CRDName())

	out, _, code := restow(t, "prepare", "-f", dir, "--dry-run")
	for _, fx := range needing {
		if !strings.Contains(out, fx.CRDName()+": would migrate every object to v1 and prune [v1alpha1] from status.storedVersions (dry run: nothing changed)") {
			t.Errorf("prepare --dry-run does not say what it would do to %s", fx.CRDName())
		}
		fx.AssertStored(t, map[string]int{"v1alpha1": releaseObjects})
	}
	if code != cli.ExitBlocked {
		t.Errorf("prepare --dry-run exited %d, want %d", code, cli.ExitBlocked)
	}

	// The operator as users run it: the manager binary at its defaults,
	// which migrates both by itself.
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	operator.StartProcess(t, operator.ProcessOptions{Kubeconfig: kubeconfig})
	out, _, code = restow(t, "prepare", "-f", dir, "--timeout", "5m")
	if !strings.Contains(out, skipped.CRDName()+": blocked, left as it is") {
		t.Errorf("prepare's output does not say %s is blocked", skipped.CRDName())
	}
	// The operator's settle window (2 minutes) outlasts prepare's start:
	// prepare hands each migration to it, or follows the one it began.
	for _, fx := range needing {
		for _, want := range []string{
			fx.CRDName() + ": the restow operator migrates it",
			fx.CRDName() + ": prepared: status.storedVersions lists v1 alone; the apply passes (server-side dry run: accepted)",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("prepare's output lacks %q", want)
			}
		}
	}
	if code != cli.ExitBlocked {
		t.Errorf("prepare with a blocked CRD exited %d, want %d", code, cli.ExitBlocked)
	}
	for _, fx := range needing {
		fx.AssertAllStoredAt(t, "v1", releaseObjects)
		fx.AssertStoredVersions(t, "v1")
		applyAccepted(t, fx.CRDName(), "v1")
		assertReadsAt(t, fx, keys[fx.CRDName()], rich, "v1")
	}
	if after := crdVersion(t, skipped.CRDName()); after != skippedBefore {
		t.Errorf("the blocked CRD's resourceVersion moved from %s to %s", skippedBefore, after)
	}
	skipped.AssertStoredVersions(t, "v1alpha1")
	skipped.AssertAllStoredAt(t, "v1alpha1", releaseObjects)
}

// assertReadsAt lists fx's objects at each version and checks that every
// one has the spec it was created with, plus spec.extra where set.
func assertReadsAt(t *testing.T, fx testenv.Fixture, keys []client.ObjectKey, spec func(int) map[string]any, versions ...string) {
	t.Helper()
	for _, version := range versions {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(fx.GVK(version))
		if err := env.Client.List(t.Context(), list); err != nil {
			t.Fatalf("listing %s at %s: %v", fx.CRDName(), version, err)
		}
		got := map[client.ObjectKey]any{}
		for _, o := range list.Items {
			got[client.ObjectKeyFromObject(&o)] = o.Object["spec"]
		}
		if len(got) != len(keys) {
			t.Errorf("%s lists %d objects at %s, want %d", fx.CRDName(), len(got), version, len(keys))
		}
		for i, k := range keys {
			if !reflect.DeepEqual(got[k], spec(i)) {
				t.Errorf("%s %s at %s: spec %v, want %v", fx.CRDName(), k, version, got[k], spec(i))
				break
			}
		}
	}
}
