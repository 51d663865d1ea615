package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/controllers"
	"github.com/restow/restow/internal/cli"
	"github.com/restow/restow/internal/operator"
	"github.com/restow/restow/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	// StorageVersionMigrations: v1beta1 of storagemigration.k8s.io on
	// 1.35 and 1.36, which serve it only when asked (1.37 serves v1 anyway).
	testenv.Main(m, testenv.Options{CRDDirectoryPaths: []string{"../../config/crd/bases"}, StorageVersionMigrations: true}, &env)
}

// restow runs kubectl-restow with args against the test control plane, as a
// kubectl user would: through a kubeconfig file, with a fresh discovery cache.
func restow(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return restowUntil(t.Context(), t, args...)
}

// restowUntil runs kubectl-restow as restow does, until ctx ends (an
// interrupt, for --watch).
func restowUntil(ctx context.Context, t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return restowOn(ctx, t, env, args...)
}

// restowOn runs kubectl-restow as restow does, against control plane e.
func restowOn(ctx context.Context, t *testing.T, e *testenv.Env, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := e.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	return restowWith(ctx, t, kubeconfig, args...)
}

// restowWith runs kubectl-restow as restow does, with the kubeconfig file
// given.
func restowWith(ctx context.Context, t *testing.T, kubeconfig string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	args = append([]string{"--kubeconfig", kubeconfig, "--cache-dir", filepath.Join(t.TempDir(), "cache")}, args...)
	code = cli.Execute(ctx, args, genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	t.Logf("kubectl restow %s: exit %d\n%s%s", strings.Join(args[4:], " "), code, out.String(), errOut.String())
	return out.String(), errOut.String(), code
}

// widgets is a namespaced test CRD whose storage switched from v1beta1 to
// v1 with n objects stored at v1beta1.
type widgets struct{ group string }

func (w widgets) fx() testenv.Fixture {
	return testenv.Fixture{Env: env, Group: w.group, Kind: "Widget", Plural: "widgets", Namespaced: true}
}

func (w widgets) crdName() string { return w.fx().CRDName() }

func (w widgets) object(name string) *unstructured.Unstructured {
	return w.fx().Object("v1beta1", "default", name, map[string]any{"size": int64(1)})
}

// installSwitched installs the CRD with n objects and switches its storage
// version to v1. Objects named in frozen are denied every update from before
// the switch on, so they stay stored at v1beta1.
func installSwitched(t *testing.T, group string, n int, frozen ...string) widgets {
	t.Helper()
	w := widgets{group: group}
	w.fx().Install(t, "v1beta1", "v1")
	if err := env.CreateObjects(t.Context(), n, func(i int) client.Object { return w.object(fmt.Sprintf("w-%04d", i)) }); err != nil {
		t.Fatal(err)
	}
	for _, name := range frozen {
		allow, err := env.DenyUpdates(t.Context(), w.object(name), "widgets")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = allow(context.Background()) })
	}
	w.fx().SwitchStorage(t, "v1")
	w.assertStored(t, map[string]int{"v1beta1": n})
	return w
}

// assertStored checks in etcd how many objects are stored at each version.
func (w widgets) assertStored(t *testing.T, want map[string]int) {
	t.Helper()
	w.fx().AssertStored(t, want)
}

func (w widgets) assertStoredVersions(t *testing.T, want ...string) {
	t.Helper()
	w.fx().AssertStoredVersions(t, want...)
}

func (w widgets) deleteMigrationsAtEnd(t *testing.T) {
	t.Cleanup(func() {
		var list migrationv1alpha1.StorageMigrationList
		if err := env.Client.List(context.Background(), &list); err != nil {
			t.Error(err)
			return
		}
		for _, sm := range list.Items {
			if sm.Spec.Resource.Group == w.group {
				_ = env.Client.Delete(context.Background(), &sm)
			}
		}
	})
}

type planEntry struct {
	CRD            string   `json:"crd"`
	StorageVersion string   `json:"storageVersion"`
	StoredVersions []string `json:"storedVersions"`
	Objects        *int64   `json:"objects"`
	Migration      *struct {
		Name  string `json:"name"`
		State string `json:"state"`
	} `json:"migration"`
	Estimate  string   `json:"estimate"`
	BlockedBy []string `json:"blockedBy"`
}

func planOf(t *testing.T, crdName string) *planEntry {
	t.Helper()
	out, _, code := restow(t, "plan", "-o", "json")
	if code != 0 {
		t.Fatalf("plan -o json exited %d", code)
	}
	var plan struct{ Pending []planEntry }
	if err := json.Unmarshal([]byte(out), &plan); err != nil {
		t.Fatalf("plan -o json is not JSON: %v", err)
	}
	for _, e := range plan.Pending {
		if e.CRD == crdName {
			return &e
		}
	}
	return nil
}

// TestPlanDryRunAndRun: plan shows the switched CRD with its object count
// and fails a CI gate; run --dry-run counts and writes nothing; run rewrites
// every object and prunes storedVersions, with no operator installed; then
// plan has nothing left and the gate passes.
func TestPlanDryRunAndRun(t *testing.T) {
	w := installSwitched(t, "plan.cli.restow.dev", 300)

	out, _, code := restow(t, "plan")
	if code != 0 || !strings.Contains(out, w.crdName()) || !strings.Contains(out, "v1beta1,v1") || !strings.Contains(out, "no StorageMigration covers it") {
		t.Errorf("plan: exit %d, want 0 and a row for %s with storedVersions v1beta1,v1 and no StorageMigration", code, w.crdName())
	}
	e := planOf(t, w.crdName())
	if e == nil || e.Objects == nil || *e.Objects != 300 || e.StorageVersion != "v1" || e.Migration != nil || e.Estimate == "" ||
		!slices.ContainsFunc(e.BlockedBy, func(b string) bool { return strings.Contains(b, "status.storedVersions lists v1beta1") }) {
		t.Fatalf("plan entry = %+v, want 300 objects, storage v1, no migration, an estimate, blocked by storedVersions v1beta1", e)
	}
	if _, _, code := restow(t, "plan", "--fail-if-pending"); code != cli.ExitPending {
		t.Errorf("plan --fail-if-pending exited %d while pending, want %d", code, cli.ExitPending)
	}
	out, _, _ = restow(t, "plan", "-o", "yaml")
	var asYAML map[string]any
	if err := yaml.Unmarshal([]byte(out), &asYAML); err != nil || asYAML["pending"] == nil {
		t.Errorf("plan -o yaml: %v, %v", err, asYAML)
	}

	out, _, code = restow(t, "run", w.crdName(), "--dry-run")
	if code != 0 || !strings.Contains(out, "would rewrite 300 objects of "+w.crdName()) || !strings.Contains(out, "from [v1beta1 v1] to [v1]") {
		t.Errorf("run --dry-run: exit %d, want 0 and the count and the pruning it would do", code)
	}
	w.assertStored(t, map[string]int{"v1beta1": 300})
	w.assertStoredVersions(t, "v1beta1", "v1")

	out, errOut, code := restow(t, "run", "widgets", "--concurrency", "8", "--settle-window", "2s")
	if code != 0 {
		t.Fatalf("run exited %d", code)
	}
	if !strings.Contains(errOut, "Settling: waiting until") {
		t.Errorf("run did not say it waits out the settle window: %q", errOut)
	}
	w.assertStored(t, map[string]int{"v1": 300})
	w.assertStoredVersions(t, "v1")
	for _, want := range []string{"300/300 objects (100%)", "300 re-encoded, 0 already stored", "Removed [v1beta1] from status.storedVersions of CRD " + w.crdName()} {
		if !strings.Contains(out, want) {
			t.Errorf("run output lacks %q", want)
		}
	}

	if e := planOf(t, w.crdName()); e != nil {
		t.Errorf("plan still lists %s after run: %+v", w.crdName(), e)
	}
	if _, _, code := restow(t, "plan", "--fail-if-pending"); code != 0 {
		t.Errorf("plan --fail-if-pending exited %d with nothing pending, want 0", code)
	}
}

// TestRunViaStatusWithoutStatusSubresource: --via-status on a CRD version
// without /status would see 404 for every object: run refuses, exits 2 and
// rewrites and prunes nothing.
func TestRunViaStatusWithoutStatusSubresource(t *testing.T) {
	w := widgets{group: "nostatus.cli.restow.dev"}
	fx := w.fx()
	fx.Mutate = func(crd *apiextensionsv1.CustomResourceDefinition) {
		for i := range crd.Spec.Versions {
			crd.Spec.Versions[i].Subresources = nil
		}
	}
	fx.Install(t, "v1beta1", "v1")
	if err := env.CreateObjects(t.Context(), 20, func(i int) client.Object { return w.object(fmt.Sprintf("w-%04d", i)) }); err != nil {
		t.Fatal(err)
	}
	fx.SwitchStorage(t, "v1")

	_, errOut, code := restow(t, "run", w.crdName(), "--via-status", "--settle-window", "1s")
	if code != cli.ExitPending || !strings.Contains(errOut, "subresources.status") || !strings.Contains(errOut, "nothing was pruned") {
		t.Errorf("run --via-status exited %d (%q), want %d naming the missing subresource", code, errOut, cli.ExitPending)
	}
	w.assertStored(t, map[string]int{"v1beta1": 20})
	w.assertStoredVersions(t, "v1beta1", "v1")
}

// TestRunReportsFailedObjects: an object that admission refuses is named,
// the exit code says so, and nothing is pruned.
func TestRunReportsFailedObjects(t *testing.T) {
	w := installSwitched(t, "failed.cli.restow.dev", 50, "w-0007")

	out, errOut, code := restow(t, "run", w.crdName(), "--settle-window", "1s")
	if code != cli.ExitPending {
		t.Fatalf("run exited %d with a denied object, want %d", code, cli.ExitPending)
	}
	if !strings.Contains(out, "w-0007") || !strings.Contains(out, testenv.FrozenMessage) || !strings.Contains(errOut, "nothing was pruned") {
		t.Errorf("run output does not name w-0007 and the policy's message, or does not say nothing was pruned")
	}
	w.assertStored(t, map[string]int{"v1": 49, "v1beta1": 1})
	w.assertStoredVersions(t, "v1beta1", "v1")
}

// TestMigrateWait: with the operator running, migrate --wait creates the
// StorageMigration and follows it to Ready; a second migrate requests a new
// pass of the same StorageMigration and waits for that one.
func TestMigrateWait(t *testing.T) {
	w := installSwitched(t, "migrate.cli.restow.dev", 400)
	w.deleteMigrationsAtEnd(t)
	operator.Start(t, env.Config, env.Scheme, controllers.Options{})

	out, _, code := restow(t, "migrate", w.crdName(), "--wait", "--timeout", "2m")
	if code != 0 {
		t.Fatalf("migrate --wait exited %d", code)
	}
	if !strings.Contains(out, "Created StorageMigration "+w.crdName()) || !strings.Contains(out, "400 objects stored at v1") {
		t.Errorf("migrate output lacks the creation or the summary")
	}
	w.assertStored(t, map[string]int{"v1": 400})
	w.assertStoredVersions(t, "v1")

	sm := &migrationv1alpha1.StorageMigration{}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Name: w.crdName()}, sm); err != nil {
		t.Fatal(err)
	}
	firstPass := sm.Status.LastPass.CompletionTime
	time.Sleep(time.Second) // completion times have a resolution of a second

	// status --watch sees the second pass from a watch: a header, then a
	// line per change, InProgress while the pass runs and Current after.
	watchCtx, stopWatch := context.WithCancel(t.Context())
	watched := make(chan string)
	go func() {
		out, _, code := restowUntil(watchCtx, t, "status", w.crdName(), "--watch")
		if code != 0 {
			t.Errorf("status --watch exited %d after an interrupt, want 0", code)
		}
		watched <- out
	}()
	time.Sleep(time.Second)
	out, _, code = restow(t, "migrate", "widgets."+w.group, "--wait", "--timeout", "2m")
	if code != 0 || !strings.Contains(out, "Requested a new pass of StorageMigration "+w.crdName()) {
		t.Fatalf("second migrate --wait exited %d, want 0 and a new pass of the existing StorageMigration", code)
	}
	time.Sleep(500 * time.Millisecond)
	stopWatch()
	watchOut := <-watched
	if strings.Count(watchOut, "NAME") != 1 || !strings.Contains(watchOut, "InProgress") || strings.Count(watchOut, "Current") < 2 {
		t.Errorf("status --watch printed %q; want one header, the Current state before, InProgress during the pass and Current after", watchOut)
	}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Name: w.crdName()}, sm); err != nil {
		t.Fatal(err)
	}
	if !firstPass.Before(&sm.Status.LastPass.CompletionTime) || sm.Status.LastHandledReRunToken == "" {
		t.Errorf("after the second migrate, lastPass completed at %v (first at %v), token %q: want a new pass", sm.Status.LastPass.CompletionTime, firstPass, sm.Status.LastHandledReRunToken)
	}

	out, _, code = restow(t, "status")
	if code != 0 || !strings.Contains(out, w.crdName()) || !strings.Contains(out, "Current") || !strings.Contains(out, "400/400") || !strings.Contains(out, "400 objects, ") {
		t.Errorf("status: exit %d, want a Current row for %s with its progress and last pass", code, w.crdName())
	}
	assertStatusOutputs(t, w.crdName())
	assertPrinterColumns(t, w.crdName())
	out, _, _ = restow(t, "status", "-o", "yaml")
	var list migrationv1alpha1.StorageMigrationList
	if err := yaml.Unmarshal([]byte(out), &list); err != nil || !slices.ContainsFunc(list.Items, func(sm migrationv1alpha1.StorageMigration) bool {
		return sm.Name == w.crdName() && sm.Status.LastPass != nil
	}) {
		t.Errorf("status -o yaml: %v; want the StorageMigration %s with its status", err, w.crdName())
	}
}

// TestMigrateWaitStalledAndTimeout: migrate --wait exits 2 when the
// StorageMigration stalls, and 3 when --timeout passes first.
func TestMigrateWaitStalledAndTimeout(t *testing.T) {
	w := installSwitched(t, "stalled.cli.restow.dev", 30, "w-0003")
	w.deleteMigrationsAtEnd(t)

	// No operator yet: nothing answers, and migrate says so.
	if _, errOut, code := restow(t, "migrate", w.crdName(), "--wait", "--operator-timeout", "2s"); code != cli.ExitNoOperator ||
		!strings.Contains(errOut, "no restow operator answered StorageMigration "+w.crdName()+" within 2s") || !strings.Contains(errOut, "kubectl restow run") ||
		!strings.Contains(errOut, "kubectl get deployments -A -l app.kubernetes.io/name=restow") {
		t.Errorf("migrate --wait without an operator exited %d, want %d saying no operator answered", code, cli.ExitNoOperator)
	}
	if _, errOut, code := restow(t, "migrate", w.crdName(), "--wait", "--timeout", "1s"); code != cli.ExitTimeout || !strings.Contains(errOut, "timed out") {
		t.Errorf("migrate --wait --timeout 1s without an operator exited %d, want %d (the timeout came first)", code, cli.ExitTimeout)
	}

	// Stalled retries a minute apart, so status shows the stalled pass.
	operator.Start(t, env.Config, env.Scheme, controllers.Options{StalledRetryBase: time.Minute, StalledRetryMax: time.Minute})
	_, errOut, code := restow(t, "migrate", w.crdName(), "--wait", "--timeout", "2m")
	if code != cli.ExitPending || !strings.Contains(errOut, migrationv1alpha1.ObjectsFailedReason) {
		t.Errorf("migrate --wait with a denied object exited %d, want %d with reason %s", code, cli.ExitPending, migrationv1alpha1.ObjectsFailedReason)
	}
	w.assertStored(t, map[string]int{"v1": 29, "v1beta1": 1})
	w.assertStoredVersions(t, "v1beta1", "v1")

	// status NAME describes it: the state in kstatus's word, the message
	// and the object that failed. (The annotation's own watch event may
	// start one retry at once; it stalls the same way.)
	var out string
	for range 40 {
		if out, _, code = restow(t, "status", w.crdName()); strings.Contains(out, "Failed objects:") {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	for _, want := range []string{"State:", "Failed", "Reason:", migrationv1alpha1.ObjectsFailedReason, "1 of 30 objects could not be rewritten", "Failed objects:", "w-0003", testenv.FrozenMessage, "30 listed:"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("status %s: exit %d, output lacks %q", w.crdName(), code, want)
		}
	}

	if _, errOut, code := restow(t, "migrate", "nosuchthings"); code != 1 || !strings.Contains(errOut, `doesn't have a resource "nosuchthings"`) {
		t.Errorf("migrate of an unknown resource exited %d, want 1 with a clear error", code)
	}
}

// assertStatusOutputs checks status's output flags on a Ready
// StorageMigration: the description, -o name, jsonpath, wide and
// --no-headers, and a clear error for an unknown format.
func assertStatusOutputs(t *testing.T, name string) {
	t.Helper()
	checks := []struct {
		args []string
		want []string
	}{
		// The last pass, a re-run after the prune, had nothing left to
		// settle for: it says rewritten, not stored.
		{[]string{"status", name}, []string{"State:", "Current", "Message:", "All 400 objects were rewritten to v1", "Progress:", "400/400", "ended", "ago", "400 listed: 0 re-encoded, 400 already stored"}},
		{[]string{"status", name, "-o", "name"}, []string{"storagemigration.migration.restow.dev/" + name}},
		{[]string{"status", name, "-o", "jsonpath={.status.lastPass.targetVersion}"}, []string{"v1"}},
		{[]string{"status", "-o", "wide"}, []string{"TARGET", "REASON", "MESSAGE", "Succeeded", "All 400 objects were rewritten to v1"}},
		{[]string{"status", name, "-o", "wide", "--no-headers"}, []string{name, "Current", "Succeeded"}},
	}
	for _, c := range checks {
		out, _, code := restow(t, c.args...)
		for _, want := range c.want {
			if code != 0 || !strings.Contains(out, want) {
				t.Errorf("%v: exit %d, output lacks %q", c.args, code, want)
			}
		}
	}
	if out, _, _ := restow(t, "status", name, "-o", "name"); strings.TrimSpace(out) != "storagemigration.migration.restow.dev/"+name {
		t.Errorf("status -o name printed %q, want only the name", out)
	}
	if out, _, _ := restow(t, "status", name, "-o", "wide", "--no-headers"); strings.Contains(out, "NAME") {
		t.Errorf("status --no-headers printed a header: %q", out)
	}
	if _, errOut, code := restow(t, "status", "-o", "xml"); code != 1 || !strings.Contains(errOut, "xml") {
		t.Errorf("status -o xml exited %d (%q), want 1 naming the format", code, errOut)
	}
	if _, errOut, code := restow(t, "status", "nosuchmigration"); code != 1 || !strings.Contains(errOut, "not found") {
		t.Errorf("status of a missing StorageMigration exited %d (%q), want 1 and not found", code, errOut)
	}
}

// TestOneNamespace: -n limits plan's count and run's pass to one namespace,
// and a run in one namespace rewrites only it and never prunes; -n with
// --all-namespaces, or on a cluster-scoped resource, is refused.
func TestOneNamespace(t *testing.T) {
	fx := testenv.Fixture{Env: env, Group: "namespace.cli.restow.dev", Kind: "Widget", Plural: "widgets", Namespaced: true}
	fx.Install(t, "v1beta1", "v1")
	// team-a holds objects 0, 3, 6...: 20 of 60; team-b the other 40.
	fx.CreateObjects(t, "v1beta1", 60, func(i int) map[string]any { return map[string]any{"size": int64(i)} }, "team-a", "team-b", "team-b")
	fx.SwitchStorage(t, "v1")

	out, _, code := restow(t, "plan", "-n", "team-a", "-o", "json")
	var plan struct {
		Namespace string
		Pending   []planEntry
	}
	if err := json.Unmarshal([]byte(out), &plan); code != 0 || err != nil {
		t.Fatalf("plan -n team-a -o json: exit %d, %v", code, err)
	}
	i := slices.IndexFunc(plan.Pending, func(e planEntry) bool { return e.CRD == fx.CRDName() })
	if plan.Namespace != "team-a" || i < 0 || plan.Pending[i].Objects == nil || *plan.Pending[i].Objects != 20 {
		t.Errorf("plan -n team-a = %+v, want namespace team-a and 20 objects of %s", plan, fx.CRDName())
	}

	out, errOut, code := restow(t, "run", fx.CRDName(), "-n", "team-a", "--settle-window", "1s")
	if code != 0 || !strings.Contains(out, "Rewriting "+fx.CRDName()+" in namespace team-a") || !strings.Contains(out, "20 objects in") ||
		!strings.Contains(errOut, "will not be pruned") || strings.Contains(out, "Removed") {
		t.Errorf("run -n team-a: exit %d; want 20 objects of team-a rewritten and a note that nothing is pruned", code)
	}
	fx.AssertStored(t, map[string]int{"v1": 20, "v1beta1": 40})
	fx.AssertStoredVersions(t, "v1beta1", "v1")

	if _, errOut, code := restow(t, "run", fx.CRDName(), "-n", "team-a", "-A"); code != 1 || !strings.Contains(errOut, "cannot be used together") {
		t.Errorf("run -n -A exited %d (%q), want 1", code, errOut)
	}
	if _, errOut, code := restow(t, "run", "namespaces", "-n", "team-a", "--dry-run"); code != 1 || !strings.Contains(errOut, "cluster-scoped") {
		t.Errorf("run namespaces -n exited %d (%q), want 1: namespaces are cluster-scoped", code, errOut)
	}

	out, _, code = restow(t, "run", fx.CRDName(), "--all-namespaces", "--settle-window", "1s")
	if code != 0 || !strings.Contains(out, "40 re-encoded, 20 already stored") || !strings.Contains(out, "Removed [v1beta1]") {
		t.Errorf("run -A: exit %d; want the other 40 re-encoded, team-a's 20 already stored, and the prune", code)
	}
	fx.AssertAllStoredAt(t, "v1", 60)
	fx.AssertStoredVersions(t, "v1")
}

// assertPrinterColumns asks the API server for the table kubectl get
// storagemigrations prints: READY, STATUS and AGE by default; RESOURCE,
// GROUP, TARGET, PROGRESS and REASON with -o wide (priority 1).
func assertPrinterColumns(t *testing.T, name string) {
	t.Helper()
	hc, err := rest.HTTPClientFor(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, strings.TrimSuffix(env.Config.Host, "/")+"/apis/migration.restow.dev/v1alpha1/storagemigrations/"+name, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var table metav1.Table
	if err := json.Unmarshal(body, &table); err != nil || len(table.Rows) != 1 {
		t.Fatalf("the table of %s (%s): %s, %v: %s", name, req.URL, resp.Status, err, body)
	}
	var byDefault, wide []string
	cells := map[string]any{}
	for i, c := range table.ColumnDefinitions {
		if c.Priority == 0 {
			byDefault = append(byDefault, c.Name)
		} else {
			wide = append(wide, c.Name)
		}
		cells[c.Name] = table.Rows[0].Cells[i]
	}
	if want := []string{"Name", "Ready", "Status", "Age"}; !slices.Equal(byDefault, want) {
		t.Errorf("kubectl get columns = %v, want %v", byDefault, want)
	}
	if want := []string{"Resource", "Group", "Target", "Progress", "Reason"}; !slices.Equal(wide, want) {
		t.Errorf("kubectl get -o wide adds %v, want %v", wide, want)
	}
	if cells["Ready"] != "True" || cells["Status"] != "All 400 objects were rewritten to v1" || cells["Progress"] != "400/400" || cells["Target"] != "v1" {
		t.Errorf("kubectl get row = %v, want Ready True, the Ready message, progress 400/400 and target v1", cells)
	}
}
