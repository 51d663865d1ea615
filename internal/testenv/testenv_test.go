package testenv_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/restow/restow/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	testenv.Main(m, testenv.Options{}, &env)
}

// TestRewriteReencodesAtNewStorageVersion proves the ground the project
// stands on: switching a CRD's storage version leaves existing objects at the
// old version in etcd until they are written again, a write re-encodes them
// at the new version, and status.storedVersions keeps the old version.
func TestRewriteReencodesAtNewStorageVersion(t *testing.T) {
	ctx := testenv.Context(t, 2*time.Minute)
	const group, plural = "proof.testenv.restow.dev", "widgets"
	crd := testenv.NewCRD(group, "Widget", plural, apiextensionsv1.NamespaceScoped,
		testenv.CRDVersion{Name: "v1beta1", Served: true, Storage: true},
		testenv.CRDVersion{Name: "v1", Served: true},
	)
	env.InstallCRDForTest(t, crd)

	widget := &unstructured.Unstructured{}
	widget.SetGroupVersionKind(schema.GroupVersionKind{Group: group, Version: "v1beta1", Kind: "Widget"})
	widget.SetNamespace("default")
	widget.SetName("w1")
	widget.Object["spec"] = map[string]any{"size": int64(3)}
	if err := env.Client.Create(ctx, widget); err != nil {
		t.Fatal(err)
	}
	assertStoredAt(t, group, plural, "default", "w1", group+"/v1beta1")

	if err := env.SetStorageVersion(ctx, crd.Name, "v1"); err != nil {
		t.Fatal(err)
	}
	// Switching the storage version rewrites nothing.
	assertStoredAt(t, group, plural, "default", "w1", group+"/v1beta1")

	// Read through the new version and write back unchanged: the API server
	// re-encodes the object at the storage version.
	current := &unstructured.Unstructured{}
	current.SetGroupVersionKind(schema.GroupVersionKind{Group: group, Version: "v1", Kind: "Widget"})
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "w1"}, current); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Update(ctx, current); err != nil {
		t.Fatal(err)
	}
	stored := assertStoredAt(t, group, plural, "default", "w1", group+"/v1")
	if spec, _, _ := unstructured.NestedInt64(current.Object, "spec", "size"); spec != 3 {
		t.Errorf("spec.size = %d after the rewrite, want 3", spec)
	}
	if len(stored.Raw) == 0 {
		t.Error("etcd returned an empty value")
	}

	live := &apiextensionsv1.CustomResourceDefinition{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: crd.Name}, live); err != nil {
		t.Fatal(err)
	}
	if want := []string{"v1beta1", "v1"}; !slices.Equal(live.Status.StoredVersions, want) {
		t.Errorf("status.storedVersions = %v, want %v", live.Status.StoredVersions, want)
	}

	counts, err := env.StoredVersions(ctx, group, plural)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{group + "/v1": 1}; len(counts) != 1 || counts[group+"/v1"] != 1 {
		t.Errorf("StoredVersions = %v, want %v", counts, want)
	}
}

// TestReadStoredDecodesProtobuf checks the reader on a built-in type, which
// the API server stores as protobuf rather than JSON.
func TestReadStoredDecodesProtobuf(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "proof"}}
	if err := env.Client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), cm) })
	stored, err := env.ReadStored(ctx, "", "configmaps", "default", "proof")
	if err != nil {
		t.Fatal(err)
	}
	if stored.APIVersion != "v1" || stored.Kind != "ConfigMap" {
		t.Errorf("stored as %s %s, want v1 ConfigMap", stored.APIVersion, stored.Kind)
	}
	if _, err := env.ReadStored(ctx, "", "configmaps", "default", "absent"); err == nil {
		t.Error("reading an absent key: want an error")
	}
}

func assertStoredAt(t *testing.T, group, resource, namespace, name, wantAPIVersion string) testenv.StoredObject {
	t.Helper()
	stored, err := env.ReadStored(t.Context(), group, resource, namespace, name)
	if err != nil {
		t.Fatal(err)
	}
	if stored.APIVersion != wantAPIVersion {
		t.Fatalf("etcd holds %s/%s at %s, want %s", namespace, name, stored.APIVersion, wantAPIVersion)
	}
	return stored
}

// TestKubeconfigsAtOnce writes kubeconfigs from several goroutines at once,
// as the plugin's tests do for a watch beside a run: envtest's certificate
// authority is not safe for concurrent use, so the control plane serializes
// it (under -race, this test fails without that), and every kubeconfig must
// still authenticate.
func TestKubeconfigsAtOnce(t *testing.T) {
	dir := t.TempDir()
	paths := make([]string, 8)
	var wg sync.WaitGroup
	for i := range paths {
		paths[i] = filepath.Join(dir, fmt.Sprintf("kubeconfig-%d", i))
		wg.Go(func() {
			if err := env.WriteKubeconfig(paths[i]); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for _, path := range paths {
		cfg, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			t.Fatal(err)
		}
		dc, err := discovery.NewDiscoveryClientForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := dc.ServerVersion(); err != nil {
			t.Errorf("%s: %v", path, err)
		}
	}
}
