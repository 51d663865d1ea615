package operator_test

// The manager as users run it, a process of its own against the control
// plane: what it keeps out of its status, events and log, its memory over
// large objects, and a backlog of many CRDs at once. Each runs the binary
// that operator.StartProcess builds.

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/operator"
	"github.com/restow/restow/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	// The standard StorageVersionMigration API served, as in controllers'
	// tests and on Kubernetes 1.37: the manager watches it by default.
	testenv.Main(m, testenv.Options{CRDDirectoryPaths: []string{"../../config/crd/bases"}, StorageVersionMigrations: true}, &env)
}

// TestNoContentsLeak: Secrets applied with kubectl carry their whole data in
// the last-applied-configuration annotation, and a webhook's 422 quotes the
// value it refuses. Migrating Secrets with the manager as users run it (a
// process, default log level), where a webhook refuses one Secret with the
// API server's own field error quoting its password, neither value may show
// in the StorageMigration's status, its events, the manager's log or its
// metrics. The refusal itself is named, with the field and the detail
// (without the values withheld, status held the password: tried).
func TestNoContentsLeak(t *testing.T) {
	ctx := t.Context()
	const (
		namespace = "leak"
		secretVal = "s3cr3t-in-last-applied"
		password  = "hunter2-password-value"
		refused   = "secret-03"
	)
	if err := env.EnsureNamespaces(ctx, namespace); err != nil {
		t.Fatal(err)
	}
	label := map[string]string{"restow.dev/leak-test": "yes"}
	for i := range 6 {
		s := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("secret-%02d", i), Namespace: namespace, Labels: label, Annotations: map[string]string{
				corev1.LastAppliedConfigAnnotation: fmt.Sprintf(`{"apiVersion":"v1","kind":"Secret","stringData":{"token":%q}}`, secretVal),
			}},
			StringData: map[string]string{"token": secretVal, "password": password},
		}
		if err := env.Client.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), s) })
	}
	hook := testenv.StartAdmissionWebhook(t, func(_ *admissionv1.AdmissionRequest, obj, _ *unstructured.Unstructured) *admissionv1.AdmissionResponse {
		if obj.GetName() != refused {
			return &admissionv1.AdmissionResponse{Allowed: true}
		}
		invalid := apierrors.NewInvalid(schema.GroupKind{Kind: "Secret"}, refused, field.ErrorList{
			field.Invalid(field.NewPath("data", "password"), password, "must be rotated before it is written again"),
		})
		return &admissionv1.AdmissionResponse{Result: &invalid.ErrStatus}
	})
	hook.Register(t, env, "", "secrets", label, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "secret-05", Namespace: namespace}})

	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	manager := operator.StartProcess(t, operator.ProcessOptions{Kubeconfig: kubeconfig, Args: []string{"--auto-migrate=false", "--stalled-retry-base=1h", "--stalled-retry-max=1h"}})
	sm := &migrationv1alpha1.StorageMigration{
		ObjectMeta: metav1.ObjectMeta{Name: "secrets-leak-test"},
		Spec:       migrationv1alpha1.StorageMigrationSpec{Resource: migrationv1alpha1.GroupResource{Resource: "secrets"}},
	}
	if err := env.Client.Create(ctx, sm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), sm) })
	sm = env.WaitForMigration(t, sm.Name, 2*time.Minute, "Stalled", testenv.HasCondition(migrationv1alpha1.StalledCondition, migrationv1alpha1.ObjectsFailedReason))

	var named bool
	for _, fo := range sm.Status.FailedObjects {
		if fo.Namespace == namespace && fo.Name == refused {
			named = true
			if fo.Reason != "Invalid" || !strings.Contains(fo.Message, "data.password: Invalid value: (value withheld): must be rotated") {
				t.Errorf("failedObjects names %s with reason %q and message %q, want Invalid, the field and the detail", refused, fo.Reason, fo.Message)
			}
		}
	}
	if !named {
		t.Errorf("failedObjects = %+v, want %s/%s named", sm.Status.FailedObjects, namespace, refused)
	}

	var events eventsv1.EventList
	if err := env.Client.List(ctx, &events); err != nil {
		t.Fatal(err)
	}
	var eventText strings.Builder
	for _, e := range events.Items {
		if e.Regarding.Name == sm.Name {
			fmt.Fprintln(&eventText, e.Reason, e.Note)
		}
	}
	metrics, err := manager.MetricsText(ctx)
	if err != nil {
		t.Fatal(err)
	}
	status := fmt.Sprintf("%+v", sm.Status)
	for where, text := range map[string]string{"status": status, "events": eventText.String(), "log": manager.Logs(), "metrics": metrics} {
		for _, secret := range []string{secretVal, password} {
			if strings.Contains(text, secret) {
				t.Errorf("the manager's %s holds %q", where, secret)
			}
		}
	}
	if !strings.Contains(eventText.String(), "ObjectsFailed") {
		t.Errorf("no ObjectsFailed event among:\n%s", eventText.String())
	}
}

// TestLargeObjectsWithinMemoryLimit: the manager, run as users run it,
// migrates 500 objects of 300 KiB (150 MB) that follow 1,130 small ones, so
// its pages of whole objects have grown to the page size (500) by the time
// they reach the large ones. A page is read only as far as the body budget
// allows, and listed smaller when it is larger, so the manager's peak RSS
// stays under the chart's memory limit (256 Mi): 158 MiB in the run that
// added this test; reading the whole page first, as before, it held the
// 150 MB answer and a copy of each object at once, 489 MiB (tried).
func TestLargeObjectsWithinMemoryLimit(t *testing.T) {
	const small, large, limit = 1130, 500, 256 << 20
	f := testenv.Fixture{Env: env, Group: "large.operator.restow.dev", Kind: "Boulder", Plural: "boulders", Namespaced: true}
	f.Install(t, "v1beta1", "v1")
	blob := strings.Repeat("x", 300<<10)
	f.CreateObjects(t, "v1beta1", small+large, func(i int) map[string]any {
		if i < small {
			return map[string]any{"n": int64(i)}
		}
		return map[string]any{"n": int64(i), "blob": blob}
	}, "large")
	f.SwitchStorage(t, "v1")

	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	manager := operator.StartProcess(t, operator.ProcessOptions{Kubeconfig: kubeconfig, Args: []string{"--auto-migrate=false", "--settle-window=2s"}})
	sm := &migrationv1alpha1.StorageMigration{
		ObjectMeta: metav1.ObjectMeta{Name: f.CRDName()},
		Spec:       migrationv1alpha1.StorageMigrationSpec{Resource: migrationv1alpha1.GroupResource{Group: f.Group, Resource: f.Plural}},
	}
	if err := env.Client.Create(t.Context(), sm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), sm) })
	env.WaitForMigration(t, sm.Name, 2*time.Minute, "Ready", testenv.ReadyAt("v1"))
	peak, err := manager.PeakRSS()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("manager peak RSS %.1f MiB migrating %d small and %d objects of 300 KiB", float64(peak)/(1<<20), small, large)
	if peak >= limit {
		t.Errorf("manager peak RSS %.1f MiB, at or over the chart's limit of 256 MiB", float64(peak)/(1<<20))
	}
	f.AssertAllStoredAt(t, "v1", small+large)
	f.AssertStoredVersions(t, "v1")
}

// TestBacklogOfManyCRDs: 200 CRDs switched their storage version before the
// manager started, each with 20 objects, and the automatic trigger picks
// them all up at once. No more than --max-concurrent-passes (4) passes list
// and rewrite at a time (restow_passes_running, sampled every 20 ms), every
// CRD ends migrated and pruned, and the manager's peak memory and requests
// per object are stated. In the run that added it: 24 s, 4 passes at most,
// 82.9 MiB, 2.38 requests per object (every request of the manager, for
// resources of 20 objects); with the bound removed, 44 passes at once,
// 144.0 MiB, 2.73 (tried).
func TestBacklogOfManyCRDs(t *testing.T) {
	const crds, perCRD, maxPasses = 200, 20, 4
	ctx := t.Context()
	if err := env.EnsureNamespaces(ctx, "backlog"); err != nil {
		t.Fatal(err)
	}
	names := make([]string, crds)
	groups := make(chan int)
	errs := make(chan error, crds)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range groups {
				errs <- installSwitched(ctx, i, perCRD)
			}
		})
	}
	for i := range crds {
		names[i] = fmt.Sprintf("pebbles.b%03d.backlog.restow.dev", i)
		groups <- i
	}
	close(groups)
	wg.Wait()
	close(errs)
	t.Cleanup(func() {
		var cleanup sync.WaitGroup
		for _, name := range names {
			cleanup.Go(func() {
				_ = env.Client.Delete(context.Background(), &migrationv1alpha1.StorageMigration{ObjectMeta: metav1.ObjectMeta{Name: name}})
				_ = env.DeleteCRD(context.Background(), name)
			})
		}
		cleanup.Wait()
	})
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}

	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	manager := operator.StartProcess(t, operator.ProcessOptions{Kubeconfig: kubeconfig, Args: []string{
		"--auto-migrate-selector=restow.dev/backlog-test=yes", "--settle-window=2s", fmt.Sprintf("--max-concurrent-passes=%d", maxPasses)}})
	sampling, stopSampling := context.WithCancel(ctx)
	sampled := make(chan float64, 1)
	go func() {
		most := 0.0
		_ = wait.PollUntilContextCancel(sampling, 20*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			// The metrics endpoint may not answer yet.
			if running, err := manager.Metric(ctx, "restow_passes_running", nil); err == nil {
				most = max(most, running)
			}
			return false, nil
		})
		sampled <- most
	}()
	testenv.WaitProgress(t, fmt.Sprintf("%d migrations to be Ready", crds), time.Minute, func(ctx context.Context) (bool, string, error) {
		var list migrationv1alpha1.StorageMigrationList
		if err := env.Client.List(ctx, &list); err != nil {
			return false, "", err
		}
		created, ready := 0, 0
		for _, sm := range list.Items {
			if strings.HasSuffix(sm.Name, ".backlog.restow.dev") {
				created++
				if sm.ReadyAt("v1") {
					ready++
				}
			}
		}
		return ready == crds, fmt.Sprintf("%d StorageMigrations created, %d Ready", created, ready), nil
	})
	took := time.Since(start)
	stopSampling()
	most := <-sampled
	peak, err := manager.PeakRSS()
	if err != nil {
		t.Fatal(err)
	}
	requests, err := manager.Metric(ctx, "rest_client_requests_total", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d CRDs of %d objects migrated in %s: at most %v passes at once, peak RSS %.1f MiB, %.0f requests (%.2f per object, all requests of the manager)",
		crds, perCRD, took.Round(time.Second), most, float64(peak)/(1<<20), requests, requests/float64(crds*perCRD))
	if most > maxPasses || most < 2 {
		t.Errorf("at most %v passes listed at once, want between 2 and %d", most, maxPasses)
	}
	for i := range crds {
		counts, err := env.StoredVersions(ctx, fmt.Sprintf("b%03d.backlog.restow.dev", i), "pebbles")
		if err != nil {
			t.Fatal(err)
		}
		if counts[fmt.Sprintf("b%03d.backlog.restow.dev/v1", i)] != perCRD || len(counts) != 1 {
			t.Errorf("etcd holds %v of %s, want %d at v1", counts, names[i], perCRD)
		}
	}
}

// installSwitched installs backlog CRD i with n objects at v1beta1 and
// switches its storage version to v1.
func installSwitched(ctx context.Context, i, n int) error {
	group := fmt.Sprintf("b%03d.backlog.restow.dev", i)
	crd := testenv.NewCRD(group, "Pebble", "pebbles", apiextensionsv1.NamespaceScoped,
		testenv.CRDVersion{Name: "v1beta1", Served: true, Storage: true}, testenv.CRDVersion{Name: "v1", Served: true})
	crd.Labels = map[string]string{"restow.dev/backlog-test": "yes"}
	if err := env.InstallCRD(ctx, crd); err != nil {
		return err
	}
	err := env.CreateObjects(ctx, n, func(j int) client.Object {
		u := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"n": int64(j)}}}
		u.SetAPIVersion(group + "/v1beta1")
		u.SetKind("Pebble")
		u.SetNamespace("backlog")
		u.SetName(fmt.Sprintf("obj-%05d", j))
		return u
	})
	if err != nil {
		return err
	}
	return env.SetStorageVersion(ctx, crd.Name, "v1")
}
