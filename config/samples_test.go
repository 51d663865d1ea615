package config_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/controllers"
	"github.com/restow/restow/internal/cli"
	"github.com/restow/restow/internal/operator"
	"github.com/restow/restow/internal/storedversions"
	"github.com/restow/restow/internal/testenv"
)

// samplesDir holds the files of docs/try-on-kind.md and of the README's quick start.
const samplesDir = "samples/crontabs"

// TestSamples holds config/samples/crontabs to docs/try-on-kind.md ("Try the operator on
// minutes". Every file decodes strictly with the repository's scheme (the
// CRDs as apiextensions.k8s.io/v1 CustomResourceDefinitions; the CronTabs,
// which no scheme knows, are created with strict field validation against
// the sample CRD's schema), and the README's steps, run on the test control
// plane with restow's operator in-process at the manager's default flags
// but a short settle window, end as the README says: the storage switch
// brings an automatic StorageMigration named after the CRD, removing v1beta1
// is refused until it is Ready and accepted after, and every CronTab is then
// stored at v1 (read from etcd).
func TestSamples(t *testing.T) {
	ctx := t.Context()
	before := decodeCRD(t, "crd-storage-v1beta1.yaml")
	switched := decodeCRD(t, "crd-storage-v1.yaml")
	removed := decodeCRD(t, "crd-v1beta1-removed.yaml")
	for _, c := range []struct {
		crd     *apiextensionsv1.CustomResourceDefinition
		storage string
		served  []string
	}{
		{before, "v1beta1", []string{"v1beta1", "v1"}},
		{switched, "v1", []string{"v1beta1", "v1"}},
		{removed, "v1", []string{"v1"}},
	} {
		if c.crd.Name != before.Name || c.crd.Spec.Group != before.Spec.Group || c.crd.Spec.Names.Plural != before.Spec.Names.Plural {
			t.Errorf("the sample CRDs name %s (%s/%s) and %s (%s/%s): want one CRD", c.crd.Name, c.crd.Spec.Group, c.crd.Spec.Names.Plural,
				before.Name, before.Spec.Group, before.Spec.Names.Plural)
		}
		if got := storedversions.StorageVersion(c.crd); got != c.storage {
			t.Errorf("sample CRD %s: storage version %q, want %q", c.crd.Name, got, c.storage)
		}
		if got := storedversions.ServedVersions(c.crd); !slices.Equal(got, c.served) {
			t.Errorf("sample CRD %s: served versions %v, want %v", c.crd.Name, got, c.served)
		}
	}
	crontabs := decodeObjects(t, "crontabs.yaml")
	for _, o := range crontabs {
		if o.GetAPIVersion() != before.Spec.Group+"/v1beta1" || o.GetKind() != before.Spec.Names.Kind {
			t.Errorf("sample object %s is a %s %s, want a %s at v1beta1", o.GetName(), o.GetAPIVersion(), o.GetKind(), before.Spec.Names.Kind)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	fx := testenv.Fixture{Env: env, Group: before.Spec.Group, Kind: before.Spec.Names.Kind, Plural: before.Spec.Names.Plural, Namespaced: true}
	name := before.Name

	// What an install brings first: restow's CRD.
	restowCRD := find(t, render(t, "crd"), "CustomResourceDefinition")
	apply(t, []*unstructured.Unstructured{restowCRD})
	if err := env.WaitForCRD(ctx, restowCRD.GetName()); err != nil {
		t.Fatal(err)
	}
	// The test control plane runs no garbage collector: the automatic
	// StorageMigration, owned by the CRD, goes by hand. Registered before the
	// operator starts, so it runs after the operator stops.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		deleteMigration(t, name)
		if err := env.DeleteCRD(ctx, name); err != nil {
			t.Error(err)
		}
	})
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}

	// Step 1: the CRD, at v1beta1, and the CronTabs.
	if err := env.Client.Create(ctx, before.DeepCopy()); err != nil {
		t.Fatalf("creating the sample CRD: %v", err)
	}
	if err := env.WaitForCRD(ctx, name); err != nil {
		t.Fatal(err)
	}
	for _, o := range crontabs {
		if err := env.Client.Create(ctx, o.DeepCopy(), client.FieldValidation(metav1.FieldValidationStrict)); err != nil {
			t.Fatalf("creating the sample %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	fx.AssertAllStoredAt(t, "v1beta1", len(crontabs))
	fx.AssertStoredVersions(t, "v1beta1")

	// Step 2: restow runs, with the manager's defaults for CRDs but a
	// settle window long enough for step 3 to see the prune still ahead,
	// and without the built-in resources' trigger, whose StorageMigrations
	// the walkthrough leaves aside. Nothing is pending yet.
	operator.Start(t, env.Config, env.Scheme, controllers.Options{AutoMigrate: true, DeferToStandard: true, SettleWindow: 5 * time.Second})
	if out := restow(t, kubeconfig, "plan"); strings.Contains(out, name) {
		t.Errorf("plan lists %s before the storage switch:\n%s", name, out)
	}

	// Step 3: the switch. Removing v1beta1 is refused while
	// status.storedVersions lists it.
	applyCRD(t, switched)
	fx.AssertStoredVersions(t, "v1beta1", "v1")
	err := updateCRD(ctx, removed)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "missing from spec.versions") {
		t.Fatalf("removing v1beta1 before the migration: %v, want it refused as missing from spec.versions", err)
	}
	t.Logf("removing v1beta1 before the migration: %v", err)

	// Step 4: the automatic StorageMigration, named after the CRD, becomes
	// Ready; each Ready condition on the way is what
	// `kubectl get storagemigration NAME -w` prints.
	sm := waitReadyLogging(t, name)
	if sm.Labels[migrationv1alpha1.AutomaticLabel] != "true" {
		t.Errorf("StorageMigration %s has labels %v: want the automatic one", name, sm.Labels)
	}
	if last := sm.Status.LastPass; last == nil || !slices.Equal(last.PrunedVersions, []string{"v1beta1"}) {
		t.Errorf("StorageMigration %s's last pass %+v: want v1beta1 pruned", name, last)
	}
	restow(t, kubeconfig, "status", name)
	fx.AssertAllStoredAt(t, "v1", len(crontabs))
	fx.AssertStoredVersions(t, "v1")

	// Step 5: nothing pending, and v1beta1 goes.
	if out := restow(t, kubeconfig, "plan"); strings.Contains(out, name) {
		t.Errorf("plan lists %s after the migration:\n%s", name, out)
	}
	applyCRD(t, removed)
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(fx.GVK("v1").GroupVersion().WithKind(fx.Kind + "List"))
	if err := env.Client.List(ctx, list); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != len(crontabs) {
		t.Errorf("%d CronTabs read at v1, want %d", len(list.Items), len(crontabs))
	}
}

// decodeCRD decodes a sample file that holds one CRD, strictly, with the
// repository's scheme.
func decodeCRD(t *testing.T, file string) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	docs := readDocuments(t, file)
	if len(docs) != 1 {
		t.Fatalf("%s holds %d documents, want one CRD", file, len(docs))
	}
	obj, _, err := serializer.NewCodecFactory(env.Scheme, serializer.EnableStrict).UniversalDeserializer().Decode(docs[0], nil, nil)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	crd, ok := obj.(*apiextensionsv1.CustomResourceDefinition)
	if !ok {
		t.Fatalf("%s holds a %T, want an apiextensions.k8s.io/v1 CustomResourceDefinition", file, obj)
	}
	return crd
}

// decodeObjects decodes a sample file of objects of a kind the scheme does
// not know: strict YAML, and the API server checks the rest.
func decodeObjects(t *testing.T, file string) []*unstructured.Unstructured {
	t.Helper()
	docs := readDocuments(t, file)
	out := make([]*unstructured.Unstructured, 0, len(docs))
	for _, doc := range docs {
		_, _, err := serializer.NewCodecFactory(env.Scheme).UniversalDeserializer().Decode(doc, nil, nil)
		if !runtime.IsNotRegisteredError(err) {
			t.Fatalf("%s: %v: want only objects of the sample CRD", file, err)
		}
		u := &unstructured.Unstructured{}
		if err := yaml.UnmarshalStrict(doc, &u.Object); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		out = append(out, u)
	}
	if len(out) == 0 {
		t.Fatalf("%s holds no objects", file)
	}
	return out
}

// readDocuments splits a sample file into its YAML documents, leaving out
// empty ones.
func readDocuments(t *testing.T, file string) [][]byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(samplesDir, file))
	if err != nil {
		t.Fatal(err)
	}
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		var content map[string]any
		if err := yaml.Unmarshal(doc, &content); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if len(content) > 0 {
			docs = append(docs, doc)
		}
	}
}

// updateCRD gives the live CRD the spec of a sample file, as `kubectl
// apply -f` of that file does.
func updateCRD(ctx context.Context, sample *apiextensionsv1.CustomResourceDefinition) error {
	live := &apiextensionsv1.CustomResourceDefinition{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: sample.Name}, live); err != nil {
		return err
	}
	live.Spec = *sample.Spec.DeepCopy()
	return env.Client.Update(ctx, live)
}

// applyCRD applies a sample CRD (updateCRD) and waits until the API server
// serves what it says.
func applyCRD(t *testing.T, sample *apiextensionsv1.CustomResourceDefinition) {
	t.Helper()
	if err := updateCRD(t.Context(), sample); err != nil {
		t.Fatalf("applying the sample CRD with storage version %s: %v", storedversions.StorageVersion(sample), err)
	}
	if err := env.WaitForCRD(t.Context(), sample.Name); err != nil {
		t.Fatal(err)
	}
}

// waitReadyLogging waits until the named StorageMigration is Ready for its
// latest generation, logging each Ready condition it goes through, for as
// long as its status shows progress.
func waitReadyLogging(t *testing.T, name string) *migrationv1alpha1.StorageMigration {
	t.Helper()
	return env.WaitForMigration(t, name, time.Minute, "Ready", func(sm *migrationv1alpha1.StorageMigration) bool {
		c := apimeta.FindStatusCondition(sm.Status.Conditions, migrationv1alpha1.ReadyCondition)
		return c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == sm.Generation
	})
}

// restow runs kubectl-restow against the test control plane, checks that
// it exits 0 and returns what it printed.
func restow(t *testing.T, kubeconfig string, args ...string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	args = append([]string{"--kubeconfig", kubeconfig}, args...)
	code := cli.Execute(t.Context(), args, genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	t.Logf("kubectl restow %s: exit %d\n%s%s", strings.Join(args[2:], " "), code, out.String(), errOut.String())
	if code != 0 {
		t.Fatalf("kubectl restow %s exited %d, want 0", strings.Join(args[2:], " "), code)
	}
	return out.String()
}
