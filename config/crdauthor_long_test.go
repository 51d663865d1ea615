//go:build long

package config_test

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/action"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/kube"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/restow/restow/internal/cli"
	"github.com/restow/restow/internal/operator"
	"github.com/restow/restow/internal/testenv"
)

// TestCRDAuthorPrepareHook: release 3.0.0 of a CRD author's chart drops
// v1beta1, which status.storedVersions still lists: release 2.0.0 switched
// the storage to v1, and nothing migrated the 2,000 objects written before.
// Upgraded with Helm's Go API, the release without restow's hooks fails on
// the API server's refusal and changes nothing; the same release with the
// hooks of config/samples/crd-author upgrades: the pre-upgrade prepare hook
// (the chart's CRD handed to it in a ConfigMap), run as shipped, hands the
// migration to restow's operator, which runs as users run it (the manager
// binary at its defaults, installed after release 2.0.0), settle window
// included; within Helm's default timeout every object is stored at v1
// (read in etcd) and reads with every field, and the CRD keeps v1 alone.
func TestCRDAuthorPrepareHook(t *testing.T) {
	ctx := t.Context()
	const name, namespace = "crontab-prepare", "crontab-prepare"
	fx := testenv.Fixture{Env: env, Group: "stable.example.com", Kind: "CronTab", Plural: "crontabs", Namespaced: true}
	crdName := fx.CRDName()
	cfg := authorRelease(t, name, crdName)
	upgrade := func(ch *chart.Chart) error {
		up := action.NewUpgrade(helmConfig(t, namespace))
		// Helm's default --timeout.
		up.Namespace, up.WaitStrategy, up.Timeout = namespace, kube.HookOnlyStrategy, 5*time.Minute
		_, err := up.RunWithContext(ctx, name, ch, nil)
		return err
	}

	// Releases 1.0.0 (storage v1beta1) and 2.0.0 (storage v1), without
	// restow's hooks, and objects written in between.
	if _, err := installAuthor(t, cfg, name, authorChart(t, "1.0.0", readChartFile(t, "samples/crontabs/crd-storage-v1beta1.yaml"), false)); err != nil {
		t.Fatalf("helm install: %v", err)
	}
	const n = 2000
	spec := cronTabSpec
	keys := fx.CreateObjects(t, "v1beta1", n, spec, "crontab-prepare-a", "crontab-prepare-b")
	if err := upgrade(authorChart(t, "2.0.0", readChartFile(t, "samples/crontabs/crd-storage-v1.yaml"), false)); err != nil {
		t.Fatalf("helm upgrade to 2.0.0: %v", err)
	}
	fx.AssertStoredVersions(t, "v1beta1", "v1")
	fx.AssertAllStoredAt(t, "v1beta1", n)

	removed := readChartFile(t, "samples/crontabs/crd-v1beta1-removed.yaml")
	err := upgrade(authorChart(t, "3.0.0", removed, false))
	if err == nil || !strings.Contains(err.Error(), `status.storedVersions[0]: Invalid value: "v1beta1": missing from spec.versions`) {
		t.Fatalf("helm upgrade to 3.0.0 without the hooks: %v, want the API server's refusal", err)
	}
	t.Logf("helm upgrade to 3.0.0 without the hooks: %v", err)
	fx.AssertStoredVersions(t, "v1beta1", "v1")
	fx.AssertAllStoredAt(t, "v1beta1", n)

	// restow's operator beside the chart, with its API, at its defaults:
	// it migrates by itself, and prepare follows its migration.
	ensureRestowCRD(t)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteMigration(t, crdName) })
	operator.StartProcess(t, operator.ProcessOptions{Kubeconfig: kubeconfig})
	began := time.Now()
	runs, err := withHooksAsShipped(t, namespace, func() error { return upgrade(authorChart(t, "3.0.0", removed, true)) })
	t.Logf("helm upgrade to 3.0.0 with the hooks as shipped: %s", time.Since(began).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("helm upgrade to 3.0.0 with the hooks: %v; the hooks ran %+v", err, runs)
	}
	// The operator's settle window (2 minutes) outlasts the hook's start:
	// prepare hands the migration to it, or follows the one it began.
	prep := runs[name+"-restow-prepare"]
	for _, want := range []string{
		crdName + ": the restow operator migrates it",
		crdName + ": prepared: status.storedVersions lists v1 alone; the apply passes",
	} {
		if !strings.Contains(prep.out, want) {
			t.Errorf("the prepare hook's output lacks %q", want)
		}
	}
	if strings.Contains(prep.out, "already exists") {
		t.Errorf("the prepare hook met a StorageMigration it did not adopt:\n%s", prep.out)
	}
	if prep.code != 0 || runs[name+"-restow-run"].code != 0 {
		t.Errorf("the hooks exited %d (prepare) and %d (run), want 0", prep.code, runs[name+"-restow-run"].code)
	}
	fx.AssertAllStoredAt(t, "v1", n)
	fx.AssertStoredVersions(t, "v1")
	crd := fx.CRD(t)
	if len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Name != "v1" {
		t.Errorf("after the upgrade the CRD has versions %+v, want v1 alone", crd.Spec.Versions)
	}
	assertSpecs(t, fx, "v1", keys, spec)
	assertGone(t, hookObjects(name, namespace)...)
}

// TestCRDAuthorBridgeHooks drives the hooks of config/samples/crd-author
// through the two releases the API server refuses although a version both
// sides serve could carry the objects: a skipped release (1.0.0, storing
// v1beta1 and serving v1, straight to 3.0.0, which keeps v1 alone) and a
// rollback past a storage switch (2.0.0 stored v1 and was migrated; 1.0.0
// of this chart keeps v1beta1 alone). Each, with Helm's Go API and 2,000
// objects read in etcd, fails without the hooks and changes nothing, and
// passes with them: the pre-upgrade or pre-rollback prepare hook makes the
// bridge the storage version (with the prepare-only role), restow's
// operator migrates, and every object reads with every field.
func TestCRDAuthorBridgeHooks(t *testing.T) {
	ctx := t.Context()
	const n = 2000
	fx := testenv.Fixture{Env: env, Group: "stable.example.com", Kind: "CronTab", Plural: "crontabs", Namespaced: true}
	crdName := fx.CRDName()
	spec := cronTabSpec
	// restow's operator as users run it: the manager binary at its
	// defaults, which also migrates by itself.
	ensureRestowCRD(t)
	operatorConfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(operatorConfig); err != nil {
		t.Fatal(err)
	}
	operator.StartProcess(t, operator.ProcessOptions{Kubeconfig: operatorConfig})
	v1beta1Only := withoutVersion(t, readChartFile(t, "samples/crontabs/crd-storage-v1beta1.yaml"), "v1")

	// release runs one release from install to the end: install first,
	// write the objects, then each step; it uninstalls and deletes the CRD.
	type step func(name string, cfg *action.Configuration, hooks bool) (map[string]hookRun, error)
	release := func(t *testing.T, name string, hooks bool, first []byte, steps ...step) (map[string]hookRun, []client.ObjectKey, error) {
		cfg := authorRelease(t, name, crdName)
		// Before the uninstall: prepare's StorageMigration, which the test
		// control plane's missing garbage collector would leave.
		t.Cleanup(func() { deleteMigration(t, crdName) })
		if _, err := installAuthor(t, cfg, name, authorChart(t, "1.0.0", first, hooks)); err != nil {
			t.Fatalf("helm install: %v", err)
		}
		keys := fx.CreateObjects(t, "v1beta1", n, spec, name)
		var runs map[string]hookRun
		var err error
		for _, s := range steps {
			if runs, err = s(name, cfg, hooks); err != nil {
				break
			}
		}
		return runs, keys, err
	}
	upgradeTo := func(version string, crd []byte) step {
		return func(name string, cfg *action.Configuration, hooks bool) (map[string]hookRun, error) {
			return withJobStandIn(t, name, nil, func() error {
				up := action.NewUpgrade(cfg)
				// Helm's default --timeout: the operator's settle window
				// (2 minutes) runs within it.
				up.Namespace, up.WaitStrategy, up.Timeout = name, kube.HookOnlyStrategy, 5*time.Minute
				_, err := up.RunWithContext(ctx, name, authorChart(t, version, crd, hooks), nil)
				return err
			})
		}
	}
	// upgradeAndRun upgrades, then migrates as a user without the hooks
	// does: kubectl restow run.
	upgradeAndRun := func(version string, crd []byte) step {
		return func(name string, cfg *action.Configuration, hooks bool) (map[string]hookRun, error) {
			runs, err := upgradeTo(version, crd)(name, cfg, hooks)
			if err != nil {
				return runs, err
			}
			kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
			if err := env.WriteKubeconfig(kubeconfig); err != nil {
				return runs, err
			}
			var out bytes.Buffer
			args := []string{"--kubeconfig", kubeconfig, "run", crdName, "--settle-window=1s"}
			if code := cli.Execute(ctx, args, genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &out}); code != 0 {
				return runs, fmt.Errorf("kubectl restow run exited %d:\n%s", code, out.String())
			}
			return runs, nil
		}
	}
	rollbackTo1 := func(name string, cfg *action.Configuration, _ bool) (map[string]hookRun, error) {
		return withJobStandIn(t, name, nil, func() error {
			rb := action.NewRollback(cfg)
			rb.Version, rb.WaitStrategy, rb.Timeout = 1, kube.HookOnlyStrategy, 5*time.Minute
			return rb.Run(name)
		})
	}
	refused := `missing from spec.versions`
	removed := readChartFile(t, "samples/crontabs/crd-v1beta1-removed.yaml")
	switched := readChartFile(t, "samples/crontabs/crd-storage-v1.yaml")
	serving := readChartFile(t, "samples/crontabs/crd-storage-v1beta1.yaml")

	t.Run("a skipped release, without the hooks", func(t *testing.T) {
		_, _, err := release(t, "skip-bare", false, serving, upgradeTo("3.0.0", removed))
		if err == nil || !strings.Contains(err.Error(), refused) {
			t.Fatalf("helm upgrade 1.0.0 to 3.0.0 without the hooks: %v, want the API server's refusal", err)
		}
		t.Logf("helm upgrade without the hooks: %v", err)
		fx.AssertStoredVersions(t, "v1beta1")
		fx.AssertAllStoredAt(t, "v1beta1", n)
	})
	t.Run("a skipped release, with the hooks", func(t *testing.T) {
		runs, keys, err := release(t, "skip-hooks", true, serving, upgradeTo("3.0.0", removed))
		prep := runs["skip-hooks-restow-prepare"]
		if err != nil || prep.code != 0 || !strings.Contains(prep.out, crdName+": made v1 the live storage version in place of v1beta1") {
			t.Fatalf("helm upgrade 1.0.0 to 3.0.0 with the hooks: %v; the prepare hook exited %d", err, prep.code)
		}
		fx.AssertAllStoredAt(t, "v1", n)
		fx.AssertStoredVersions(t, "v1")
		assertSpecs(t, fx, "v1", keys, spec)
	})
	t.Run("a rollback past a storage switch, without the hooks", func(t *testing.T) {
		_, _, err := release(t, "back-bare", false, v1beta1Only, upgradeAndRun("2.0.0", switched), rollbackTo1)
		if err == nil || !strings.Contains(err.Error(), refused) {
			t.Fatalf("helm rollback to 1.0.0 without the hooks: %v, want the API server's refusal", err)
		}
		t.Logf("helm rollback without the hooks: %v", err)
		fx.AssertStoredVersions(t, "v1")
		fx.AssertAllStoredAt(t, "v1", n)
	})
	t.Run("a rollback past a storage switch, with the hooks", func(t *testing.T) {
		runs, keys, err := release(t, "back-hooks", true, v1beta1Only, upgradeTo("2.0.0", switched), rollbackTo1)
		prep := runs["back-hooks-restow-prepare"]
		if err != nil || prep.code != 0 || !strings.Contains(prep.out, crdName+": made v1beta1 the live storage version in place of v1") {
			t.Fatalf("helm rollback to 1.0.0 with the hooks: %v; the prepare hook exited %d", err, prep.code)
		}
		fx.AssertAllStoredAt(t, "v1beta1", n)
		fx.AssertStoredVersions(t, "v1beta1")
		assertSpecs(t, fx, "v1beta1", keys, spec)
		if crd := fx.CRD(t); len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Name != "v1beta1" {
			t.Errorf("after the rollback the CRD has versions %+v, want v1beta1 alone", crd.Spec.Versions)
		}
	})
}
