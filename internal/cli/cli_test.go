package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/genericiooptions"
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
	testenv.Main(m, testenv.Options{CRDDirectoryPaths: []string{"../../config/crd/bases"}}, &env)
}

// restow runs kubectl-restow with args against the test control plane, as a
// kubectl user would: through a kubeconfig file, with a fresh discovery cache.
func restow(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	args = append([]string{"--kubeconfig", kubeconfig, "--cache-dir", filepath.Join(dir, "cache")}, args...)
	code = cli.Execute(t.Context(), args, genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
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
	for _, want := range []string{"300/300 objects (100%)", "300 rewritten", "Removed [v1beta1] from status.storedVersions of CRD " + w.crdName()} {
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
	out, _, code = restow(t, "migrate", "widgets."+w.group, "--wait", "--timeout", "2m")
	if code != 0 || !strings.Contains(out, "Requested a new pass of StorageMigration "+w.crdName()) {
		t.Fatalf("second migrate --wait exited %d, want 0 and a new pass of the existing StorageMigration", code)
	}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Name: w.crdName()}, sm); err != nil {
		t.Fatal(err)
	}
	if !firstPass.Before(&sm.Status.LastPass.CompletionTime) || sm.Status.LastHandledReRunToken == "" {
		t.Errorf("after the second migrate, lastPass completed at %v (first at %v), token %q: want a new pass", sm.Status.LastPass.CompletionTime, firstPass, sm.Status.LastHandledReRunToken)
	}

	out, _, code = restow(t, "status")
	if code != 0 || !strings.Contains(out, w.crdName()) || !strings.Contains(out, "Ready") || !strings.Contains(out, "400 objects") {
		t.Errorf("status: exit %d, want a Ready row for %s with its last pass", code, w.crdName())
	}
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

	// No operator yet: nothing answers.
	if _, errOut, code := restow(t, "migrate", w.crdName(), "--wait", "--timeout", "2s"); code != cli.ExitTimeout || !strings.Contains(errOut, "is the restow operator running?") {
		t.Errorf("migrate --wait without an operator exited %d, want %d (timeout)", code, cli.ExitTimeout)
	}

	operator.Start(t, env.Config, env.Scheme, controllers.Options{})
	_, errOut, code := restow(t, "migrate", w.crdName(), "--wait", "--timeout", "2m")
	if code != cli.ExitPending || !strings.Contains(errOut, migrationv1alpha1.ObjectsFailedReason) {
		t.Errorf("migrate --wait with a denied object exited %d, want %d with reason %s", code, cli.ExitPending, migrationv1alpha1.ObjectsFailedReason)
	}
	w.assertStored(t, map[string]int{"v1": 29, "v1beta1": 1})
	w.assertStoredVersions(t, "v1beta1", "v1")

	if _, errOut, code := restow(t, "migrate", "nosuchthings"); code != 1 || !strings.Contains(errOut, `doesn't have a resource "nosuchthings"`) {
		t.Errorf("migrate of an unknown resource exited %d, want 1 with a clear error", code)
	}
}
