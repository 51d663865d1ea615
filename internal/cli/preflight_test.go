package cli_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/restow/restow/internal/cli"
	"github.com/restow/restow/internal/preflight"
	"github.com/restow/restow/internal/testenv"
)

// TestPreflight holds the manifests of a release against the live CRDs:
// one that drops a stored version but keeps the live storage version
// (needs prepare, and a real apply is refused with the API server's own
// words), one that changes nothing stored (ok), a skipped release that
// drops the live storage version too (blocked), and a CRD the cluster does
// not have (new). Several at once exit with the weightiest; the ok one
// alone exits 0, and preflight sends nothing but reads and dry runs.
func TestPreflight(t *testing.T) {
	drops := testenv.Fixture{Env: env, Group: "drops.preflight.restow.dev", Kind: "Widget", Plural: "widgets", Namespaced: true}
	drops.Install(t, "v1alpha1", "v1")
	drops.CreateObjects(t, "v1alpha1", 20, plain, "preflight")
	drops.SwitchStorage(t, "v1")
	same := testenv.Fixture{Env: env, Group: "same.preflight.restow.dev", Kind: "Widget", Plural: "widgets", Namespaced: true}
	same.Install(t, "v1beta1", "v1")
	skipped := testenv.Fixture{Env: env, Group: "skipped.preflight.restow.dev", Kind: "Widget", Plural: "widgets", Namespaced: true}
	skipped.Install(t, "v1alpha1", "v1beta1")
	skipped.CreateObjects(t, "v1alpha1", 5, plain, "preflight")

	dir := t.TempDir()
	// The next release of each: v1 alone; the same versions; v1 alone,
	// skipping v1beta1; and one the cluster has not seen.
	writeRelease(t, filepath.Join(dir, "drops.yaml"), drops.CRDName(), "v1")
	writeRelease(t, filepath.Join(dir, "same.yaml"), same.CRDName(), "v1beta1", "v1")
	writeRelease(t, filepath.Join(dir, "skipped.yaml"), skipped.CRDName(), "v1")
	newCRD := apiextensionsv1.CustomResourceDefinition{TypeMeta: metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"}}
	newCRD.Name = "gadgets.new.preflight.restow.dev"
	newCRD.Spec.Group, newCRD.Spec.Scope = "new.preflight.restow.dev", apiextensionsv1.NamespaceScoped
	newCRD.Spec.Names = apiextensionsv1.CustomResourceDefinitionNames{Plural: "gadgets", Kind: "Gadget"}
	newCRD.Spec.Versions = []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true, Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object"}}}}
	writeYAML(t, filepath.Join(dir, "sub", "new.yaml"), &newCRD, "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: not-a-crd\n")

	// The apply a user would make is refused, in the API server's words.
	applyRelease(t, drops.CRDName(), "v1", "status.storedVersions[0]: Invalid value: \"v1alpha1\": missing from spec.versions")

	stdout, stderr, code := restow(t, "preflight", "-f", dir, "-R")
	for _, want := range []string{
		drops.CRDName() + ": needs prepare: the manifest drops v1alpha1, which status.storedVersions still lists: kubectl restow prepare migrates every object to v1, the live storage version, and prunes status.storedVersions to [v1]; the apply then passes",
		same.CRDName() + ": ok: the manifest keeps every version status.storedVersions lists (v1beta1)",
		skipped.CRDName() + ": blocked: the manifest drops v1alpha1, the live storage version, as a skipped release or a downgrade does",
		"and no version the live CRD serves is in the manifest to carry the objects across",
		"gadgets.new.preflight.restow.dev: new: no such CRD in the cluster: the apply creates it",
		"server-side dry run: refused: CustomResourceDefinition.apiextensions.k8s.io \"" + drops.CRDName() + "\" is invalid: status.storedVersions[0]: Invalid value: \"v1alpha1\": missing from spec.versions",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("preflight -f %s -R lacks %q", dir, want)
		}
	}
	if code != cli.ExitBlocked || !strings.Contains(stderr, "blocked") {
		t.Errorf("preflight with a blocked CRD exited %d, want %d", code, cli.ExitBlocked)
	}
	// Without -R the subdirectory's new CRD is not read; -o json for a
	// script; needs prepare alone exits 2.
	out, _, code := restow(t, "preflight", "-f", filepath.Join(dir, "drops.yaml"), "-f", filepath.Join(dir, "same.yaml"), "-o", "json")
	var parsed struct{ CRDs []preflight.Verdict }
	if err := json.Unmarshal([]byte(out), &parsed); err != nil || len(parsed.CRDs) != 2 || parsed.CRDs[0].State != preflight.NeedsPrepare || !slices.Equal(parsed.CRDs[0].Drops, []string{"v1alpha1"}) {
		t.Errorf("preflight -o json: %v\n%s", err, out)
	}
	if code != cli.ExitPending {
		t.Errorf("preflight with a CRD that needs prepare exited %d, want %d", code, cli.ExitPending)
	}
	if _, _, code := restow(t, "preflight", "--keep", drops.CRDName()+"=v1", "--keep", skipped.CRDName()+"=v1alpha1,v1beta1,v1"); code != cli.ExitPending {
		t.Errorf("--keep: exit %d, want %d", code, cli.ExitPending)
	}
	// What needs prepare says: the migration, then the apply passes, and
	// every object is stored at v1 in etcd.
	if _, _, code := restow(t, "run", drops.CRDName(), "--settle-window", "1s"); code != 0 {
		t.Fatalf("run exited %d", code)
	}
	drops.AssertAllStoredAt(t, "v1", 20)
	if out, _, code := restow(t, "preflight", "-f", filepath.Join(dir, "drops.yaml")); code != 0 || !strings.Contains(out, "server-side dry run: accepted") {
		t.Errorf("after the migration, preflight exited %d, want 0", code)
	}

	// The ok manifest alone: exit 0, and nothing sent but reads and the
	// dry run.
	recorded := recordWrites(t)
	if out, _, code := restow(t, "preflight", "-f", filepath.Join(dir, "same.yaml")); code != 0 || !strings.Contains(out, "server-side dry run: accepted") {
		t.Errorf("preflight of a release that changes nothing stored exited %d, want 0 and an accepted dry run", code)
	}
	if writes := recorded(); len(writes) > 0 {
		t.Errorf("preflight sent %v: want reads and dry runs only", writes)
	}
}

type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// writeRelease writes the live CRD name as a release would ship it with
// versions alone (the last one storage).
func writeRelease(t *testing.T, path, name string, versions ...string) {
	t.Helper()
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Name: name}, crd); err != nil {
		t.Fatal(err)
	}
	// Each version as the live CRD has it, or, for one it does not, as its
	// first: a new version of the same schema.
	kept := make([]apiextensionsv1.CustomResourceDefinitionVersion, 0, len(versions))
	for _, name := range versions {
		i := max(0, slices.IndexFunc(crd.Spec.Versions, func(v apiextensionsv1.CustomResourceDefinitionVersion) bool { return v.Name == name }))
		v := *crd.Spec.Versions[i].DeepCopy()
		v.Name, v.Served, v.Storage = name, true, name == versions[len(versions)-1]
		kept = append(kept, v)
	}
	release := &apiextensionsv1.CustomResourceDefinition{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       crd.Spec,
	}
	release.Spec.Versions = kept
	writeYAML(t, path, release, "")
}

func writeYAML(t *testing.T, path string, obj any, more string) {
	t.Helper()
	raw, err := yaml.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if more != "" {
		raw = append(append(raw, "---\n"...), more...)
	}
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
}

// applyRelease updates the live CRD to keep only version, as an apply of
// the release would, and fails unless the API server refuses it saying want.
func applyRelease(t *testing.T, name, version, want string) {
	t.Helper()
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, crd); err != nil {
		t.Fatal(err)
	}
	crd.Spec.Versions = slices.DeleteFunc(crd.Spec.Versions, func(v apiextensionsv1.CustomResourceDefinitionVersion) bool { return v.Name != version })
	crd.Spec.Versions[0].Storage = true
	err := env.Client.Update(t.Context(), crd)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("applying %s with %s alone: %v, want refused with %q", name, version, err, want)
	}
	t.Logf("The apply is refused: %v", err)
}
