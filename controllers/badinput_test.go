package controllers_test

// Bad input the API server or a cluster's admission hands back: a webhook's
// sentence where a reason belongs, a status the API server refuses, and
// answers that quote what they refuse. Each must end in a state a user can
// read, never in a loop, and never carry object contents out.

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/operator"
	"github.com/restow/restow/internal/testenv"
)

// passesOf is how many passes of resource have ended, by the manager's metric.
func passesOf(t *testing.T, resource string) float64 {
	t.Helper()
	return metricValue(t, "restow_passes_total", map[string]string{"resource": resource})
}

// assertNoLoop checks that within window, no more than most passes of
// resource end: a migration that cannot record its end must not be started
// again at once, and again.
func assertNoLoop(t *testing.T, resource string, window time.Duration, most float64) {
	t.Helper()
	before := passesOf(t, resource)
	time.Sleep(window)
	if n := passesOf(t, resource) - before; n > most {
		t.Errorf("%v passes of %s ended within %s, want at most %v: the migration loops", n, resource, window, most)
	}
}

// TestWebhookSentenceAsReasonStalls: a validating webhook refuses two
// objects with a 300-character Status.Reason (as webhooks built on older
// controller-runtime and Gatekeeper do), one with 422 and one with 403.
// status.failedObjects holds at most 64 characters of reason, so the
// migration must end Stalled naming both with the reason of the HTTP code,
// its last pass recorded, and no pass started again and again (with the
// reason copied as it came and no fallback for a refused status, it stayed
// Progressing, resuming again and again, and never named them: tried).
func TestWebhookSentenceAsReasonStalls(t *testing.T) {
	f := fixture{group: "sentence.controllers.restow.dev", kind: "Flange", plural: "flanges", namespaced: true}
	f.install(t, "v1beta1", "v1")
	keys := f.createObjects(t, 300, "sentence")
	sentence := metav1.StatusReason(strings.Repeat("this object may not change ", 12)[:300])
	refusals := map[string]int32{"obj-00007": http.StatusUnprocessableEntity, "obj-00011": http.StatusForbidden}
	hook := testenv.StartAdmissionWebhook(t, func(_ *admissionv1.AdmissionRequest, obj, _ *unstructured.Unstructured) *admissionv1.AdmissionResponse {
		if code, ok := refusals[obj.GetName()]; ok {
			return &admissionv1.AdmissionResponse{Result: &metav1.Status{Code: code, Reason: sentence, Message: "refused by the test's policy"}}
		}
		return &admissionv1.AdmissionResponse{Allowed: true}
	})
	hook.Register(t, env, f.group, f.plural, map[string]string{}, f.object("v1beta1", keys[299].Namespace, keys[299].Name, nil))
	f.switchStorage(t, "v1")

	startManager(t, nil)
	sm := f.createMigration(t, nil)
	sm = waitFor(t, sm.Name, time.Minute, "Stalled", hasCondition(migrationv1alpha1.StalledCondition, migrationv1alpha1.ObjectsFailedReason))
	want := map[string]string{"obj-00007": "Invalid", "obj-00011": "Forbidden"}
	if len(sm.Status.FailedObjects) != len(want) {
		t.Errorf("failedObjects = %+v, want %v", sm.Status.FailedObjects, want)
	}
	for _, fo := range sm.Status.FailedObjects {
		if want[fo.Name] != fo.Reason || !strings.Contains(fo.Message, "refused by the test's policy") {
			t.Errorf("failedObjects has %s with reason %q and message %q, want reason %q and the webhook's message", fo.Name, fo.Reason, fo.Message, want[fo.Name])
		}
	}
	if sm.Status.LastPass == nil || sm.Status.LastPass.Failed != 2 {
		t.Errorf("lastPass = %+v, want it recorded with 2 failed", sm.Status.LastPass)
	}
	f.fx().AssertStored(t, map[string]int{"v1": 298, "v1beta1": 2})
	f.assertStoredVersions(t, "v1beta1", "v1")
	// The tests' stalled backoff is 0.5 s doubling to 2 s: 3 retries in 5 s.
	assertNoLoop(t, "flanges."+f.group, 5*time.Second, 4)
}

// TestRefusedStatusStalls: whatever makes the API server refuse the status
// a pass writes, here a ValidatingAdmissionPolicy that refuses any
// status.lastPass on this StorageMigration, the migration ends Stalled with
// StatusRefused and the API server's answer, and is retried with backoff,
// not at once (without the fallback, it stayed Progressing, resuming again
// and again, and never said why: tried).
func TestRefusedStatusStalls(t *testing.T) {
	ctx := t.Context()
	f := fixture{group: "refusedstatus.controllers.restow.dev", kind: "Sprocket", plural: "sprockets", namespaced: true}
	f.install(t, "v1beta1", "v1")
	f.createObjects(t, 50, "refusedstatus")
	f.switchStorage(t, "v1")

	const message = "status.lastPass is refused by the test"
	probe := &migrationv1alpha1.StorageMigration{
		ObjectMeta: metav1.ObjectMeta{Name: "probe." + f.group},
		Spec:       migrationv1alpha1.StorageMigrationSpec{Resource: migrationv1alpha1.GroupResource{Group: "probe.invalid", Resource: "nothing"}},
	}
	if err := env.Client.Create(ctx, probe); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), probe) })
	refuseLastPass(t, []string{probe.Name, f.crdName()}, message, probe)

	startManager(t, nil)
	sm := f.createMigration(t, nil)
	sm = waitFor(t, sm.Name, time.Minute, "Stalled", hasCondition(migrationv1alpha1.StalledCondition, migrationv1alpha1.StatusRefusedReason))
	if msg := readyMessage(sm); !strings.Contains(msg, message) {
		t.Errorf("Ready message = %q, want the policy's message", msg)
	}
	assertNoLoop(t, f.crdName(), 5*time.Second, 4)
}

// refuseLastPass puts in force a ValidatingAdmissionPolicy that refuses any
// status.lastPass on the StorageMigrations named, and returns once it
// refuses one on probe (one of them).
func refuseLastPass(t *testing.T, names []string, message string, probe *migrationv1alpha1.StorageMigration) {
	t.Helper()
	ctx := t.Context()
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = fmt.Sprintf("'%s'", n)
	}
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "refuse-lastpass-" + probe.Name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{migrationv1alpha1.GroupVersion.Group}, APIVersions: []string{"*"},
						Resources: []string{"storagemigrations/status"}},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{{
				Expression: fmt.Sprintf("!(object.metadata.name in [%s]) || !has(object.status) || !has(object.status.lastPass)", strings.Join(quoted, ", ")),
				Message:    message,
			}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: policy.Name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName: policy.Name, ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
	for _, o := range []client.Object{policy, binding} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), o) })
	}
	now := metav1.Now()
	patch := fmt.Appendf(nil, `{"status":{"lastPass":{"startTime":%q,"completionTime":%q,"targetVersion":"v1"}}}`, now.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := env.Client.Status().Patch(ctx, probe, client.RawPatch(types.MergePatchType, patch))
		if err == nil {
			// Taken before the policy: take it back, and try again.
			return false, env.Client.Status().Patch(ctx, probe, client.RawPatch(types.MergePatchType, []byte(`{"status":{"lastPass":null}}`)))
		}
		return apierrors.IsInvalid(err) || apierrors.IsForbidden(err), nil
	})
	if err != nil {
		t.Fatalf("the policy never refused a status.lastPass: %v", err)
	}
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
	ensureNamespaces(t, namespace)
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
	sm = waitFor(t, sm.Name, 2*time.Minute, "Stalled", hasCondition(migrationv1alpha1.StalledCondition, migrationv1alpha1.ObjectsFailedReason))

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
	f := fixture{group: "large.controllers.restow.dev", kind: "Boulder", plural: "boulders", namespaced: true}
	f.install(t, "v1beta1", "v1")
	blob := strings.Repeat("x", 300<<10)
	f.fx().CreateObjects(t, "v1beta1", small+large, func(i int) map[string]any {
		if i < small {
			return map[string]any{"n": int64(i)}
		}
		return map[string]any{"n": int64(i), "blob": blob}
	}, "large")
	f.switchStorage(t, "v1")

	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	manager := operator.StartProcess(t, operator.ProcessOptions{Kubeconfig: kubeconfig, Args: []string{"--auto-migrate=false", "--settle-window=2s"}})
	sm := f.createMigration(t, nil)
	waitFor(t, sm.Name, 5*time.Minute, "Ready", readyAt("v1"))
	peak, err := manager.PeakRSS()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("manager peak RSS %.1f MiB migrating %d small and %d objects of 300 KiB", float64(peak)/(1<<20), small, large)
	if peak >= limit {
		t.Errorf("manager peak RSS %.1f MiB, at or over the chart's limit of 256 MiB", float64(peak)/(1<<20))
	}
	f.assertStored(t, "v1", small+large)
	f.assertStoredVersions(t, "v1")
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
	ensureNamespaces(t, "backlog")
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
	most := 0.0
	testenv.WaitProgress(t, fmt.Sprintf("%d migrations to be Ready", crds), time.Minute, func(ctx context.Context) (bool, string, error) {
		// The metrics endpoint may not answer yet.
		if running, err := manager.Metric(ctx, "restow_passes_running", nil); err == nil {
			most = max(most, running)
		}
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
