package testenv_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/restow/restow/internal/controlplane"
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

// TestSeveralAPIServersOneLagging proves the HA test ground: three API
// servers on one etcd, each with an identity Lease of its own, and one that
// sees a CRD's storage switch late. A write of an unchanged object to that
// server while it lags is answered "unchanged" and leaves the object at the
// old version in etcd, which is what makes an answer from it no proof; once
// its lag is over it stores at the new version like the others.
func TestSeveralAPIServersOneLagging(t *testing.T) {
	ha := testenv.Start(t, testenv.Options{APIServers: 3, LaggingAPIServer: true, APIServerArgs: map[string]string{"goaway-chance": "0.02"}})
	ctx := testenv.Context(t, 3*time.Minute)
	leases := &coordinationv1.LeaseList{}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		err := ha.Client.List(ctx, leases, client.InNamespace(metav1.NamespaceSystem), client.MatchingLabels{"apiserver.kubernetes.io/identity": "kube-apiserver"})
		return err == nil && len(leases.Items) == 3, nil
	})
	if err != nil {
		t.Fatalf("want an identity Lease for each of 3 API servers, have %d: %v", len(leases.Items), err)
	}

	fx := testenv.Fixture{Env: ha, Group: "lag.testenv.restow.dev", Kind: "Widget", Plural: "widgets", Namespaced: true}
	fx.Install(t, "v1beta1", "v1")
	keys := fx.CreateObjects(t, "v1beta1", 2, func(int) map[string]any { return map[string]any{"size": 1} }, "default")
	lagging, err := client.New(ha.ServerConfig(2), client.Options{Scheme: ha.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	const lag = 6 * time.Second
	ha.SetWatchLag(lag)
	switched := time.Now()
	fx.SwitchStorage(t, "v1")

	// The lagging server still encodes at v1beta1: the rewrite is a no-op.
	rewrite := func(c client.Client, key client.ObjectKey) (before, after string) {
		t.Helper()
		obj := &unstructured.Unstructured{}
		obj.SetGroupVersionKind(fx.GVK("v1"))
		if err := c.Get(ctx, key, obj); err != nil {
			t.Fatal(err)
		}
		before = obj.GetResourceVersion()
		if err := c.Update(ctx, obj); err != nil {
			t.Fatal(err)
		}
		return before, obj.GetResourceVersion()
	}
	before, after := rewrite(lagging, keys[0])
	if time.Since(switched) >= lag {
		t.Fatalf("the rewrite through the lagging server took until %s after the switch, past its lag of %s", time.Since(switched), lag)
	}
	if before != after {
		t.Errorf("the lagging server wrote the unchanged object (resourceVersion %s to %s); want it answered unchanged", before, after)
	}
	fx.AssertStored(t, map[string]int{"v1beta1": 2})

	// Once the lag is over, the same server stores at v1.
	ha.SetWatchLag(0)
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		rewrite(lagging, keys[1])
		counts, err := fx.StoredCounts(ctx)
		return err == nil && counts["v1"] == 1, err
	})
	if err != nil {
		t.Fatalf("the lagging server never stored at v1 after its lag: %v", err)
	}
	fx.AssertStored(t, map[string]int{"v1beta1": 1, "v1": 1})
}

// TestWatchLagStaysAtItsDelay proves that the lagging API server lags by the
// delay that was set, not more, however many events etcd sends it: a write
// load of 4 KiB objects through another server, well above what one window of
// HTTP/2 flow control carries per delay, leaves its watch cache behind by
// about the delay. (A proxy that held back the watch's frames held back their
// flow-control credit too, and its lag grew by about a second a second.)
func TestWatchLagStaysAtItsDelay(t *testing.T) {
	ha := testenv.Start(t, testenv.Options{APIServers: 3, LaggingAPIServer: true})
	ctx := testenv.Context(t, 3*time.Minute)
	fx := testenv.Fixture{Env: ha, Group: "lagload.testenv.restow.dev", Kind: "Widget", Plural: "widgets", Namespaced: true}
	fx.Install(t, "v1")
	keys := fx.CreateObjects(t, "v1", 40, func(int) map[string]any { return map[string]any{"size": 1} }, "default")
	first, err := dynamic.NewForConfig(ha.ServerConfig(0))
	if err != nil {
		t.Fatal(err)
	}
	lagging, err := dynamic.NewForConfig(ha.ServerConfig(2))
	if err != nil {
		t.Fatal(err)
	}
	gvr := schema.GroupVersionResource{Group: fx.Group, Version: "v1", Resource: fx.Plural}

	const delay = 3 * time.Second
	ha.SetWatchLag(delay)
	load, stop := context.WithTimeout(ctx, 20*time.Second)
	defer stop()
	var writes sync.WaitGroup
	payload := strings.Repeat("x", 4096)
	for w := range 4 {
		writes.Go(func() {
			for i := w; load.Err() == nil; i += 4 {
				key := keys[i%len(keys)]
				patch := fmt.Sprintf(`{"metadata":{"annotations":{"load":"%d-%s"}}}`, i, payload)
				_, _ = first.Resource(gvr).Namespace(key.Namespace).Patch(load, key.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
			}
		})
	}

	// The lag at a moment is at least how long ago the first server had
	// passed the resourceVersion that the lagging server's cache is at.
	type seen struct {
		at time.Time
		rv int64
	}
	var history []seen
	var worst time.Duration
	for load.Err() == nil {
		now := time.Now()
		current, err := first.Resource(gvr).List(ctx, metav1.ListOptions{Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		cached, err := lagging.Resource(gvr).List(ctx, metav1.ListOptions{ResourceVersion: "0", Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		rv, _ := strconv.ParseInt(current.GetResourceVersion(), 10, 64)
		history = append(history, seen{now, rv})
		cachedRV, _ := strconv.ParseInt(cached.GetResourceVersion(), 10, 64)
		for _, h := range history {
			if h.rv > cachedRV {
				worst = max(worst, now.Sub(h.at))
				break
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	writes.Wait()
	t.Logf("%d samples; the lagging server's cache was behind by at most %s with a delay of %s", len(history), worst, delay)
	// Slack for a busy 2-core machine: an API server that decodes its
	// events late is behind by more than the delay, but not by a second a
	// second.
	if worst > delay+3*time.Second {
		t.Errorf("the lagging server's watch cache fell %s behind, with a delay of %s: the lag grows with the load", worst, delay)
	}
}

// TestCleanupDeletesWhatTheWebhookRefuses: a test that ends while its
// conversion webhook refuses to convert some objects, or is stopped, leaves
// no CRD behind, and its cleanup does not hang: the API server must convert
// an object stored at an old version to delete it. Without
// DisarmConversion the deletion makes no progress and the cleanup fails
// after DeleteCRD's minute without progress (tried once).
func TestCleanupDeletesWhatTheWebhookRefuses(t *testing.T) {
	for _, tt := range []struct {
		name string
		// fault is how the webhook fails when the test ends.
		fault func(*testenv.ConversionWebhook)
	}{
		{"refusing", func(w *testenv.ConversionWebhook) { w.Refuse(true, "obj-00003") }},
		{"failing", func(w *testenv.ConversionWebhook) { w.SetFailing(true) }},
		{"stopped", func(w *testenv.ConversionWebhook) { w.Stop() }},
	} {
		f := testenv.Fixture{Env: env, Group: tt.name + ".cleanup.testenv.restow.dev", Kind: "Crate", Plural: "crates", Namespaced: true}
		start := time.Now()
		t.Run(tt.name, func(t *testing.T) {
			hook := testenv.StartConversionWebhook(t, func(*unstructured.Unstructured, string) error { return nil })
			f.Conversion = hook.Conversion()
			f.Install(t, "v1beta1", "v1")
			f.CreateObjects(t, "v1beta1", 10, func(int) map[string]any { return map[string]any{"size": int64(1)} }, "cleanup")
			f.SwitchStorage(t, "v1")
			tt.fault(hook)
		})
		err := env.Client.Get(t.Context(), client.ObjectKey{Name: f.CRDName()}, &apiextensionsv1.CustomResourceDefinition{})
		if client.IgnoreNotFound(err) != nil || err == nil {
			t.Errorf("%s: after the test's cleanup, reading its CRD: %v, want NotFound", tt.name, err)
		}
		t.Logf("%s: the test and its cleanup took %s", tt.name, time.Since(start).Round(time.Millisecond))
	}
}

// TestWaitProgressFollowsTheWork: a wait goes on past its stall limit for
// as long as the work moves, and gives up, saying what it saw last, once it
// has not moved for that long.
func TestWaitProgressFollowsTheWork(t *testing.T) {
	const stall = 200 * time.Millisecond
	start := time.Now()
	steps := 0
	err := controlplane.WaitProgress(t.Context(), 10*time.Millisecond, stall, func(context.Context) (bool, string, error) {
		// Moves every 100 ms (half the stall limit), done after 1 s.
		steps = int(time.Since(start) / (100 * time.Millisecond))
		return steps >= 10, strconv.Itoa(steps), nil
	}, nil)
	if err != nil || steps < 10 {
		t.Fatalf("a wait whose work moved gave up after %s at step %d: %v", time.Since(start), steps, err)
	}

	start = time.Now()
	err = controlplane.WaitProgress(t.Context(), 10*time.Millisecond, stall, func(context.Context) (bool, string, error) {
		return false, "3 objects left", nil
	}, nil)
	var stalled *controlplane.StalledError
	if !errors.As(err, &stalled) || stalled.Work != "3 objects left" || !strings.Contains(err.Error(), "3 objects left") {
		t.Fatalf("a wait whose work stood still returned %v, want a StalledError naming what it saw", err)
	}
	if took := time.Since(start); took < stall {
		t.Errorf("a stalled wait gave up after %s, before its stall limit %s", took, stall)
	}
}
