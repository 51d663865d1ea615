//go:build e2e && long

// Package chart prepares a chart-sized CRD upgrade the way the shipped
// prepare hook runs it: ten CRDs of 500 objects each (2,000 with
// RESTOW_E2E_CHART_OBJECTS=2000, as docs/benchmarks.md measures), whose storage
// switch came with the release before, prepared with the hook's own
// settings (--settle-window=2m --timeout=4m) within Helm's default
// timeout of 5 minutes, with restow's operator running at its defaults
// (the manager binary, no flag changed) and without it. Run with `make
// test-e2e`.
package chart

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/e2e/scenario"
	"github.com/restow/restow/internal/cli"
	"github.com/restow/restow/internal/operator"
	"github.com/restow/restow/internal/testenv"
)

const (
	// crds is the chart's number of CRDs.
	crds = 10
	// helmTimeout is `helm upgrade --timeout` by default; the hook's
	// --timeout is below it.
	helmTimeout = 5 * time.Minute
)

// hookArgs are the prepare hook's arguments as shipped
// (config/samples/crd-author/job-prepare.yaml), less the CRD file and the
// cache directory.
var hookArgs = []string{"prepare", "--settle-window=2m", "--timeout=4m"}

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	os.Exit(m.Run())
}

// TestPrepareAChart: release 1 stores v1beta1, release 2 stores v1 and
// serves both, release 3 drops v1beta1, which the API server refuses until
// every object is migrated. prepare, with the hook's settings, prepares
// the ten CRDs side by side, so that their settle windows (2 minutes each:
// nothing restow can trust says when the switch was) overlap. With the
// operator started just before the upgrade (installed after release 2),
// prepare starts once the operator has created its automatic
// StorageMigrations, with passes under way, and follows them: it creates
// none of its own, and meets no AlreadyExists. The release then applies,
// half of its CRDs server-side and half client-side, and every object is
// stored at v1 in etcd and reads as written.
func TestPrepareAChart(t *testing.T) {
	t.Run("restow's operator at its defaults with its StorageMigrations created", func(t *testing.T) {
		cp := testenv.Start(t, testenv.Options{CRDDirectoryPaths: []string{scenario.CRDDirectory}})
		prepareChart(t, cp, "operator", true)
	})
	t.Run("without the operator", func(t *testing.T) {
		cp := testenv.Start(t, testenv.Options{})
		prepareChart(t, cp, "alone", false)
	})
}

func prepareChart(t *testing.T, cp *testenv.Env, name string, withOperator bool) {
	perCRD := objectsPerCRD(t)
	began := time.Now()
	fixtures, keys := releaseTwoApplied(t, cp, name, perCRD)
	t.Logf("releases 1 and 2 with %d objects: %s", crds*perCRD, time.Since(began).Round(time.Second))
	// Not t.TempDir: -f splits on a comma, which a test's name may hold.
	release, err := os.MkdirTemp("", "release-3-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(release) })
	for _, fx := range fixtures {
		writeReleaseThree(t, fx, release)
		if err := applyReleaseThree(t, cp, fx, false); err == nil || !strings.Contains(err.Error(), "missing from spec.versions") {
			t.Fatalf("release 3 of %s applied before prepare: %v, want the API server's refusal", fx.CRDName(), err)
		}
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	if withOperator {
		// Installed after release 2, with no flag changed: it finds the
		// ten CRDs' storedVersions listing two versions and migrates each.
		// Release 3 comes right after: prepare starts once the operator
		// has created its StorageMigrations, and must follow them.
		operator.StartProcess(t, operator.ProcessOptions{Kubeconfig: kubeconfig})
		awaitAutomaticMigrations(t, cp, len(fixtures))
	}
	args := append(append([]string{}, hookArgs...), "-f", release, "--kubeconfig="+kubeconfig, "--cache-dir="+filepath.Join(t.TempDir(), "cache"))
	var out bytes.Buffer
	began = time.Now()
	code := cli.Execute(t.Context(), args, genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &out})
	took := time.Since(began)
	t.Logf("prepare exited %d after %s: kubectl restow %s\n%s", code, took.Round(time.Millisecond), strings.Join(args, " "), out.String())
	if code != 0 || took >= helmTimeout {
		t.Fatalf("prepare exited %d after %s, want 0 within Helm's %s", code, took, helmTimeout)
	}
	// With the operator, whose settle windows outlast prepare's start,
	// prepare follows each of its migrations.
	for _, fx := range fixtures {
		if !strings.Contains(out.String(), fx.CRDName()+": prepared") {
			t.Errorf("prepare does not say %s is prepared", fx.CRDName())
		}
		if withOperator && !strings.Contains(out.String(), fx.CRDName()+": the restow operator migrates it") {
			t.Errorf("prepare does not hand %s to the operator", fx.CRDName())
		}
	}
	if strings.Contains(out.String(), "AlreadyExists") || strings.Contains(out.String(), "already exists") ||
		withOperator && strings.Contains(out.String(), "Created StorageMigration") {
		t.Errorf("prepare did not adopt the operator's StorageMigrations")
	}
	for i, fx := range fixtures {
		if err := applyReleaseThree(t, cp, fx, i%2 == 0); err != nil {
			t.Fatalf("release 3 of %s after prepare: %v", fx.CRDName(), err)
		}
	}
	for i, fx := range fixtures {
		fx.AssertAllStoredAt(t, "v1", perCRD)
		fx.AssertStoredVersions(t, "v1")
		assertReadsAsWritten(t, cp, fx, keys[i])
	}
}

// awaitAutomaticMigrations waits until the operator has created its
// automatic StorageMigration for each of n CRDs, and says how many of them
// had a pass under way or done.
func awaitAutomaticMigrations(t *testing.T, cp *testenv.Env, n int) {
	t.Helper()
	testenv.WaitProgress(t, "the operator's automatic StorageMigrations", time.Minute, func(ctx context.Context) (bool, string, error) {
		var sms migrationv1alpha1.StorageMigrationList
		if err := cp.Client.List(ctx, &sms, client.MatchingLabels{migrationv1alpha1.AutomaticLabel: "true"}); err != nil {
			return false, "", err
		}
		started := 0
		for _, sm := range sms.Items {
			if sm.Status.Progress != nil || sm.Status.LastPass != nil {
				started++
			}
		}
		if len(sms.Items) == n {
			t.Logf("the operator created %d StorageMigrations; %d with a pass under way or done", n, started)
		}
		return len(sms.Items) == n, fmt.Sprintf("%d of %d", len(sms.Items), n), nil
	})
}

// releaseTwoApplied installs release 1 of the chart (v1beta1 stored) with
// perCRD objects of each CRD, then release 2 (v1 stored, both served).
func releaseTwoApplied(t *testing.T, cp *testenv.Env, name string, perCRD int) ([]testenv.Fixture, [][]client.ObjectKey) {
	fixtures := make([]testenv.Fixture, crds)
	keys := make([][]client.ObjectKey, crds)
	for i := range fixtures {
		fixtures[i] = testenv.Fixture{Env: cp, Group: name + ".chart.restow.dev", Kind: fmt.Sprintf("Gadget%d", i), Plural: fmt.Sprintf("gadgets%d", i), Namespaced: true}
		fixtures[i].Install(t, "v1beta1", "v1")
		keys[i] = fixtures[i].CreateObjects(t, "v1beta1", perCRD, spec, "chart-a", "chart-b")
	}
	for _, fx := range fixtures {
		fx.SwitchStorage(t, "v1")
	}
	return fixtures, keys
}

// objectsPerCRD is RESTOW_E2E_CHART_OBJECTS, by default 500: in the suite,
// beside other e2e packages on two cores, 2,000 per CRD (the size
// docs/benchmarks.md measures, alone) made the passes outlast the hook's
// --timeout.
func objectsPerCRD(t *testing.T) int {
	return scenario.CountFromEnv(t, "RESTOW_E2E_CHART_OBJECTS", 500, 1)
}

// spec is object i's spec.
func spec(i int) map[string]any {
	return map[string]any{"n": int64(i), "image": fmt.Sprintf("registry.example.com/app:%d", i%7), "labels": map[string]any{"tier": "web"}}
}

// releaseThree is release 3 of fx's CRD: the live one with v1 alone.
func releaseThree(t *testing.T, fx testenv.Fixture) *apiextensionsv1.CustomResourceDefinition {
	live := fx.CRD(t)
	crd := &apiextensionsv1.CustomResourceDefinition{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"},
		ObjectMeta: metav1.ObjectMeta{Name: live.Name},
		Spec:       *live.Spec.DeepCopy(),
	}
	crd.Spec.Versions = crd.Spec.Versions[:0]
	for _, v := range live.Spec.Versions {
		if v.Name == "v1" {
			crd.Spec.Versions = append(crd.Spec.Versions, v)
		}
	}
	return crd
}

func writeReleaseThree(t *testing.T, fx testenv.Fixture, dir string) {
	raw, err := yaml.Marshal(releaseThree(t, fx))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, fx.Plural+".yaml"), raw, 0o600); err != nil {
		t.Fatal(err)
	}
}

// applyReleaseThree applies release 3 of fx's CRD server-side, as Helm 4
// does, or client-side (an update of the whole spec).
func applyReleaseThree(t *testing.T, cp *testenv.Env, fx testenv.Fixture, serverSide bool) error {
	crd := releaseThree(t, fx)
	if serverSide {
		u := &unstructured.Unstructured{}
		raw, err := yaml.Marshal(crd)
		if err != nil {
			return err
		}
		if err := yaml.Unmarshal(raw, &u.Object); err != nil {
			return err
		}
		return cp.Client.Apply(t.Context(), client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("helm"), client.ForceOwnership)
	}
	live := fx.CRD(t)
	live.Spec = crd.Spec
	return cp.Client.Update(t.Context(), live, client.FieldOwner("kubectl-client-side-apply"))
}

// assertReadsAsWritten reads every object of fx at v1, the one version
// release 3 serves, and compares its spec with what was written.
func assertReadsAsWritten(t *testing.T, cp *testenv.Env, fx testenv.Fixture, keys []client.ObjectKey) {
	t.Helper()
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(fx.GVK("v1").GroupVersion().WithKind(fx.Kind + "List"))
	if err := cp.Client.List(t.Context(), list); err != nil {
		t.Fatal(err)
	}
	byName := map[client.ObjectKey]map[string]any{}
	for _, o := range list.Items {
		byName[client.ObjectKeyFromObject(&o)], _ = o.Object["spec"].(map[string]any)
	}
	for i, k := range keys {
		if got, want := byName[k], spec(i); !equality.Semantic.DeepEqual(got, want) {
			t.Errorf("%s %s reads %v at v1, want %v", fx.CRDName(), k, got, want)
			return
		}
	}
}
