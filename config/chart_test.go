package config_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/kube"
	release "helm.sh/helm/v4/pkg/release/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/controllers"
	"github.com/restow/restow/internal/cli"
	"github.com/restow/restow/internal/doccheck"
	"github.com/restow/restow/internal/operator"
)

// chartDir is the Helm chart, charts/restow.
const chartDir = "../charts/restow"

// loadChart loads the chart from its directory, as `helm install ./charts/restow` does.
func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("loading %s: %v", chartDir, err)
	}
	return ch
}

// templateChart renders the chart as `helm template` does, validating
// values against values.schema.json; the error is Helm's.
func templateChart(ch *chart.Chart, name, namespace string, values map[string]any) (*release.Release, error) {
	install := action.NewInstall(action.NewConfiguration())
	install.DryRunStrategy = action.DryRunClient
	install.ReleaseName, install.Namespace = name, namespace
	// As `helm template --kube-version`: the test binary's own default is
	// Kubernetes 1.20, which the chart's kubeVersion refuses.
	kubeVersion, err := serverVersion()
	if err != nil {
		return nil, err
	}
	install.KubeVersion = kubeVersion
	r, err := install.Run(ch, values)
	if err != nil {
		return nil, err
	}
	return r.(*release.Release), nil
}

// serverVersion is the test API server's Kubernetes version.
var serverVersion = sync.OnceValues(func() (*common.KubeVersion, error) {
	disco, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		return nil, err
	}
	info, err := disco.ServerVersion()
	if err != nil {
		return nil, err
	}
	return common.ParseKubeVersion(info.GitVersion)
})

// renderChart renders the chart and returns its objects and its hooks.
func renderChart(t *testing.T, name, namespace string, values map[string]any) (objs, hooks []*unstructured.Unstructured) {
	t.Helper()
	r, err := templateChart(loadChart(t), name, namespace, values)
	if err != nil {
		t.Fatalf("helm template %s: %v", name, err)
	}
	objs = decodeManifests(t, r.Manifest)
	for _, h := range r.Hooks {
		hooks = append(hooks, decodeManifests(t, h.Manifest)...)
	}
	return objs, hooks
}

// decodeManifests splits a YAML stream into objects.
func decodeManifests(t *testing.T, manifest string) []*unstructured.Unstructured {
	t.Helper()
	reader := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(manifest)))
	var out []*unstructured.Unstructured
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(doc, &u.Object); err != nil {
			t.Fatalf("%v in\n%s", err, doc)
		}
		if len(u.Object) > 0 {
			out = append(out, u)
		}
	}
}

// helmConfig is Helm's action configuration for namespace on the test
// control plane, reached through a kubeconfig as the helm CLI reaches a
// cluster, with release records stored in Secrets as by default.
func helmConfig(t *testing.T, namespace string) *action.Configuration {
	t.Helper()
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	cacheDir := filepath.Join(dir, "cache")
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig, flags.Namespace, flags.CacheDir = &kubeconfig, &namespace, &cacheDir
	cfg := action.NewConfiguration()
	if err := cfg.Init(flags, namespace, "secret"); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// installChart installs the chart for real, as `helm install --create-namespace`
// does, without waiting for pods (the test control plane runs none), and
// uninstalls it when the test ends.
func installChart(t *testing.T, name, namespace string, values map[string]any) *release.Release {
	t.Helper()
	cfg := helmConfig(t, namespace)
	install := action.NewInstall(cfg)
	install.ReleaseName, install.Namespace, install.CreateNamespace = name, namespace, true
	install.WaitStrategy, install.Timeout = kube.HookOnlyStrategy, time.Minute
	// The tests share one control plane: another test may have applied the
	// StorageMigration CRD (cluster-scoped) already, outside any release.
	install.TakeOwnership = true
	r, err := install.RunWithContext(t.Context(), loadChart(t), values)
	if err != nil {
		t.Fatalf("helm install %s: %v", name, err)
	}
	t.Cleanup(func() {
		// Unless the test uninstalled it itself.
		if _, err := cfg.Releases.Last(name); err == nil {
			uninstallChart(t, cfg, name)
		}
	})
	return r.(*release.Release)
}

// upgradeChart upgrades a release to new values, as `helm upgrade` does.
func upgradeChart(t *testing.T, name, namespace string, values map[string]any) *release.Release {
	t.Helper()
	upgrade := action.NewUpgrade(helmConfig(t, namespace))
	upgrade.Namespace, upgrade.WaitStrategy, upgrade.Timeout = namespace, kube.HookOnlyStrategy, time.Minute
	r, err := upgrade.RunWithContext(t.Context(), name, loadChart(t), values)
	if err != nil {
		t.Fatalf("helm upgrade %s: %v", name, err)
	}
	return r.(*release.Release)
}

func uninstallChart(t *testing.T, cfg *action.Configuration, name string) {
	t.Helper()
	uninstall := action.NewUninstall(cfg)
	uninstall.WaitStrategy, uninstall.Timeout = kube.HookOnlyStrategy, time.Minute
	if _, err := uninstall.Run(name); err != nil {
		t.Errorf("helm uninstall %s: %v", name, err)
	}
}

// TestChartInstall installs the chart with its default values for real,
// finds every object it rendered on the API server, runs the manager as the
// chart's Deployment and service account say until it has migrated a CRD,
// has the API server
// validate the test hooks (which only `helm test` creates) by a dry run, and
// uninstalls it: the CRD stays, with the StorageMigrations in it, and the
// rest goes.
func TestChartInstall(t *testing.T) {
	ctx := t.Context()
	const name, namespace = "restow-install", "restow-install"
	objs, hooks := renderChart(t, name, namespace, nil)
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.GetKind()]++
	}
	for _, kind := range []string{"CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
		"Deployment", "Service", "PodDisruptionBudget", "FlowSchema", "PriorityLevelConfiguration"} {
		if kinds[kind] == 0 {
			t.Errorf("the chart renders no %s", kind)
		}
	}
	if kinds["ServiceMonitor"] != 0 {
		t.Error("the chart renders a ServiceMonitor by default; it needs the Prometheus Operator's CRD")
	}

	rel := installChart(t, name, namespace, nil)
	installed := decodeManifests(t, rel.Manifest)
	if len(installed) != len(objs) {
		t.Errorf("helm install created %d objects, helm template renders %d", len(installed), len(objs))
	}
	for _, o := range installed {
		live := &unstructured.Unstructured{}
		live.SetGroupVersionKind(o.GroupVersionKind())
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(o), live); err != nil {
			t.Errorf("%s %s/%s after helm install: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
	}
	for _, h := range hooks {
		if err := env.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(h.DeepCopy()), client.FieldOwner("restow-chart-test"), client.DryRunAll); err != nil {
			t.Errorf("server-side dry run of the test hook's %s %s: %v", h.GetKind(), h.GetName(), err)
		}
	}

	// A working operator: the manager as the chart's Deployment runs it,
	// as the chart's service account, migrates a CRD (proven from etcd).
	manager := assertDeployedManagerMigrates(t, installed, "chart.config.restow.dev", "Gizmo", "gizmos")
	if err := manager.Stop(); err != nil {
		t.Error(err)
	}

	crd := find(t, installed, "CustomResourceDefinition")
	if got := crd.GetAnnotations()["helm.sh/resource-policy"]; got != "keep" {
		t.Errorf("CRD annotation helm.sh/resource-policy = %q, want keep: uninstalling would delete every StorageMigration", got)
	}
	uninstallChart(t, helmConfig(t, namespace), name)
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(crd), crd.DeepCopy()); err != nil {
		t.Errorf("the CRD after helm uninstall: %v, want it kept", err)
	}
	deploy := find(t, installed, "Deployment")
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(deploy), &appsv1.Deployment{}); !apierrors.IsNotFound(err) {
		t.Errorf("the Deployment after helm uninstall: %v, want it gone", err)
	}
}

// TestChartServiceMonitor: with serviceMonitor.enabled, the chart renders a
// ServiceMonitor that would scrape the metrics Service: same namespace, a
// selector that picks the Service, a port the Service names, over HTTPS
// with the scraper's token, and the labels the user's Prometheus selects.
func TestChartServiceMonitor(t *testing.T) {
	objs, _ := renderChart(t, "restow", "restow-system", map[string]any{
		"serviceMonitor": map[string]any{"enabled": true, "labels": map[string]any{"release": "prometheus"}, "interval": "30s"},
	})
	monitor := find(t, objs, "ServiceMonitor")
	var service corev1.Service
	into(t, find(t, objs, "Service"), &service)
	if monitor.GetNamespace() != service.Namespace {
		t.Errorf("ServiceMonitor in %q, Service in %q", monitor.GetNamespace(), service.Namespace)
	}
	if monitor.GetLabels()["release"] != "prometheus" {
		t.Errorf("ServiceMonitor labels %v lack serviceMonitor.labels", monitor.GetLabels())
	}
	matchLabels, _, _ := unstructured.NestedStringMap(monitor.Object, "spec", "selector", "matchLabels")
	if len(matchLabels) == 0 || !labels.SelectorFromSet(matchLabels).Matches(labels.Set(service.Labels)) {
		t.Errorf("ServiceMonitor selector %v does not select the metrics Service's labels %v", matchLabels, service.Labels)
	}
	endpoints, _, _ := unstructured.NestedSlice(monitor.Object, "spec", "endpoints")
	if len(endpoints) != 1 {
		t.Fatalf("ServiceMonitor endpoints %v, want one", endpoints)
	}
	endpoint := endpoints[0].(map[string]any)
	if !slices.ContainsFunc(service.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == endpoint["port"] }) {
		t.Errorf("ServiceMonitor scrapes port %v, which the Service %s does not name (%v)", endpoint["port"], service.Name, service.Spec.Ports)
	}
	if endpoint["scheme"] != "https" || endpoint["bearerTokenFile"] == nil || endpoint["interval"] != "30s" {
		t.Errorf("ServiceMonitor endpoint %v: want HTTPS with the scraper's token every 30s", endpoint)
	}
}

// TestChartMetricsReaderName: the metrics reader's ClusterRole is named as
// the chart's README says, for a release whose name contains "restow" and
// one whose name does not.
func TestChartMetricsReaderName(t *testing.T) {
	for release, want := range map[string]string{"restow": "restow-metrics-reader", "monitoring": "monitoring-restow-metrics-reader"} {
		objs, _ := renderChart(t, release, "restow-system", nil)
		if !slices.ContainsFunc(objs, func(o *unstructured.Unstructured) bool { return o.GetKind() == "ClusterRole" && o.GetName() == want }) {
			t.Errorf("release %s renders no ClusterRole %s", release, want)
		}
		readme, err := os.ReadFile("../charts/restow/README.md")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(strings.Join(strings.Fields(string(readme)), " "), "`"+want+"` for release `"+release+"`") {
			t.Errorf("the chart's README does not give %s for release %s", want, release)
		}
	}
}

// TestChartNotes: what `helm install` prints says what restow will do by
// itself with the values given, built-in resources included whether or not
// CRDs are migrated automatically.
func TestChartNotes(t *testing.T) {
	builtIns := "Built-in resources get a StorageMigration each"
	crds := "every CRD whose status.storedVersions lists more"
	for _, tc := range []struct {
		name         string
		values       map[string]any
		want, absent []string
	}{
		{"defaults", nil, []string{crds, builtIns}, []string{"is off", "not migrated by themselves"}},
		{"CRDs off", map[string]any{"autoMigrate": false},
			[]string{builtIns, "CRDs are not migrated by themselves"}, []string{crds, "is off"}},
		{"all off", map[string]any{"autoMigrate": false, "autoMigrateBuiltins": false},
			[]string{"Automatic migration is off"}, []string{crds, builtIns}},
		{"re-encryption alone", map[string]any{"autoMigrate": false, "autoMigrateBuiltins": false, "reencryptResources": []any{"secrets"}},
			[]string{"restow re-encrypts secrets", "CRDs are not migrated by themselves"}, []string{builtIns, "is off"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := templateChart(loadChart(t), "restow", "restow-system", tc.values)
			if err != nil {
				t.Fatalf("helm template: %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.Info.Notes, w) {
					t.Errorf("NOTES lack %q:\n%s", w, r.Info.Notes)
				}
			}
			for _, a := range tc.absent {
				if strings.Contains(r.Info.Notes, a) {
					t.Errorf("NOTES say %q:\n%s", a, r.Info.Notes)
				}
			}
		})
	}
}

// TestChartSetsEveryFlag: every flag of the manager (docs/operations.md's
// table, which cmd/manager's tests hold to the code) has a value of the
// chart's, or is named in the chart README's extraArgs row as one to set
// there.
func TestChartSetsEveryFlag(t *testing.T) {
	flags, err := doccheck.FlagTable("../docs/operations.md", "## Flags")
	if err != nil {
		t.Fatal(err)
	}
	helpers, err := os.ReadFile("../charts/restow/templates/_helpers.tpl")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../charts/restow/README.md")
	if err != nil {
		t.Fatal(err)
	}
	var extraArgs string
	for line := range strings.SplitSeq(string(readme), "\n") {
		if strings.HasPrefix(line, "| `extraArgs` |") {
			extraArgs = line
		}
	}
	for _, f := range flags {
		if f.Name == "kubeconfig" || f.Name == "version" {
			continue
		}
		if !strings.Contains(string(helpers), "--"+f.Name) && !strings.Contains(extraArgs, "`--"+f.Name+"`") {
			t.Errorf("--%s has no value of the chart's, and the chart README's extraArgs row does not name it", f.Name)
		}
	}
}

// TestChartManagerArgs: the default chart runs the manager with exactly
// config/default's flags, and each value adds its flag only when set.
func TestChartManagerArgs(t *testing.T) {
	base := []string{"--leader-elect", "--metrics-bind-address=:8443", "--health-probe-bind-address=:8081"}
	for _, tc := range []struct {
		name   string
		values map[string]any
		extra  []string
	}{
		{"defaults", nil, nil},
		{"every flag value set", map[string]any{
			"autoMigrate": false, "autoMigrateSelector": "app.kubernetes.io/part-of=shop", "concurrency": 8, "pageSize": 100,
			"deferToStorageVersionMigrations": false, "serveStorageVersionMigrations": true,
			"settleWindow": "5m", "statusInterval": "10s", "logLevel": "debug", "extraArgs": []any{"--log-encoding=console"},
			"apiServerLagLimit": "20m", "apiServers": []any{"10.0.0.11:6443", "[fd00::12]:6443"},
			"autoMigrateBuiltins": false, "autoMigrateBuiltinsExclude": []any{"events", "leases.coordination.k8s.io"},
			"builtinDiscoveryInterval": "30m", "reencryptResources": []any{"secrets", "configmaps"},
		}, []string{
			"--auto-migrate=false", "--auto-migrate-selector=app.kubernetes.io/part-of=shop",
			"--auto-migrate-builtins=false", "--auto-migrate-builtins-exclude=events,leases.coordination.k8s.io", "--builtin-discovery-interval=30m",
			"--reencrypt-resources=secrets,configmaps",
			"--defer-to-storage-version-migrations=false", "--serve-storage-version-migrations", "--concurrency=8", "--page-size=100",
			"--settle-window=5m", "--apiserver-lag-limit=20m", "--apiservers=10.0.0.11:6443,[fd00::12]:6443",
			"--status-interval=10s", "--log-level=debug", "--log-encoding=console",
		}},
		{"autoMigrate true is the binary's default", map[string]any{"autoMigrate": true}, nil},
		{"no built-in resource left alone", map[string]any{"autoMigrateBuiltinsExclude": []any{}}, []string{"--auto-migrate-builtins-exclude="}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, _ := renderChart(t, "restow", "restow-system", tc.values)
			var deploy appsv1.Deployment
			into(t, find(t, objs, "Deployment"), &deploy)
			if got, want := deploy.Spec.Template.Spec.Containers[0].Args, append(slices.Clone(base), tc.extra...); !slices.Equal(got, want) {
				t.Errorf("args %q, want %q", got, want)
			}
		})
	}
}

// TestChartValuesSchema: a value of the wrong shape is refused at install
// time, naming the value and what it must be, instead of a manager that
// exits on a flag it cannot parse.
func TestChartValuesSchema(t *testing.T) {
	ch := loadChart(t)
	for _, tc := range []struct {
		name   string
		values map[string]any
		want   []string // in the error
	}{
		{"concurrency zero", map[string]any{"concurrency": 0}, []string{"/concurrency", "minimum: got 0, want 1"}},
		{"concurrency a string", map[string]any{"concurrency": "16"}, []string{"concurrency"}},
		{"pageSize negative", map[string]any{"pageSize": -1}, []string{"pageSize"}},
		{"settleWindow not a duration", map[string]any{"settleWindow": "2 minutes"}, []string{"/settleWindow", "'2 minutes' does not match pattern"}},
		{"statusInterval without a unit", map[string]any{"statusInterval": "5"}, []string{"statusInterval"}},
		{"settleWindow zero", map[string]any{"settleWindow": "0s"}, []string{"/settleWindow"}},
		{"apiServerLagBound zero", map[string]any{"apiServerLagBound": "0m0.0s"}, []string{"/apiServerLagBound"}},
		{"apiServers without a port", map[string]any{"apiServers": []any{"10.0.0.11"}}, []string{"/apiServers/0"}},
		{"apiServerLagLimit not a duration", map[string]any{"apiServerLagLimit": "10"}, []string{"/apiServerLagLimit"}},
		{"maxConcurrentPasses too many", map[string]any{"maxConcurrentPasses": 65}, []string{"/maxConcurrentPasses"}},
		{"logLevel unknown", map[string]any{"logLevel": "verbose"}, []string{"logLevel"}},
		{"replicaCount zero", map[string]any{"replicaCount": 0}, []string{"replicaCount"}},
		{"migratedGroups a string", map[string]any{"rbac": map[string]any{"migratedGroups": "stable.example.com"}}, []string{"migratedGroups"}},
		{"migratedGroups empty", map[string]any{"rbac": map[string]any{"migratedGroups": []any{}}}, []string{"migratedGroups"}},
		{"a misspelt value", map[string]any{"concurency": 8}, []string{"concurency"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := templateChart(ch, "restow", "restow-system", tc.values)
			if err == nil {
				t.Fatalf("values %v rendered, want them refused", tc.values)
			}
			for _, want := range append(tc.want, "values don't meet the specifications of the schema") {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
			t.Logf("refused: %v", err)
		})
	}
	// The refusals above are the schema's, not a chart that renders nothing.
	if _, err := templateChart(ch, "restow", "restow-system", map[string]any{"concurrency": 1, "settleWindow": "2m30s", "logLevel": "4"}); err != nil {
		t.Errorf("good values refused: %v", err)
	}
}

// TestChartParity holds the chart with its default values, installed as
// release "restow" in restow-system, to config/default: the same objects by
// kind and name, the same RBAC rules per role and bindings, the same
// manager arguments, replicas, security contexts, probes, resources,
// PodDisruptionBudget, metrics Service, flow control and CRD. The table's
// other rows change one side and show the comparison fails.
func TestChartParity(t *testing.T) {
	kustomized := render(t, "default")
	for _, tc := range []struct {
		name        string
		values      map[string]any
		mutate      func(t *testing.T, kustomized, charted []*unstructured.Unstructured)
		wantDiffsIn string // "": no difference
	}{
		{name: "default values and config/default"},
		{name: "a flag value", values: map[string]any{"concurrency": 8}, wantDiffsIn: "Deployment/restow-controller-manager args"},
		{name: "one replica", values: map[string]any{"replicaCount": 1}, wantDiffsIn: "Deployment/restow-controller-manager replicas"},
		{name: "narrowed groups", values: map[string]any{"rbac": map[string]any{"migratedGroups": []any{"stable.example.com"}}}, wantDiffsIn: "ClusterRole/restow-manager-role rules"},
		{name: "no PodDisruptionBudget", values: map[string]any{"podDisruptionBudget": map[string]any{"enabled": false}}, wantDiffsIn: "PodDisruptionBudget/restow-controller-manager"},
		{name: "config/default grants one more verb", mutate: func(t *testing.T, kustomized, _ []*unstructured.Unstructured) {
			role := find(t, kustomized, "Role", "restow-leader-election-role")
			rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
			rules[0].(map[string]any)["verbs"] = append(rules[0].(map[string]any)["verbs"].([]any), "delete")
			if err := unstructured.SetNestedSlice(role.Object, rules, "rules"); err != nil {
				t.Fatal(err)
			}
		}, wantDiffsIn: "Role/restow-leader-election-role rules"},
		{name: "the chart's pod without its seccomp profile", mutate: func(t *testing.T, _, charted []*unstructured.Unstructured) {
			unstructured.RemoveNestedField(find(t, charted, "Deployment").Object, "spec", "template", "spec", "securityContext", "seccompProfile")
		}, wantDiffsIn: "Deployment/restow-controller-manager pod securityContext"},
		{name: "the chart's priority level with more shares", mutate: func(t *testing.T, _, charted []*unstructured.Unstructured) {
			level := find(t, charted, "PriorityLevelConfiguration")
			if err := unstructured.SetNestedField(level.Object, int64(20), "spec", "limited", "nominalConcurrencyShares"); err != nil {
				t.Fatal(err)
			}
		}, wantDiffsIn: "PriorityLevelConfiguration/restow-migrations spec"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kustomized := deepCopyAll(kustomized)
			charted, _ := renderChart(t, "restow", "restow-system", tc.values)
			if tc.mutate != nil {
				tc.mutate(t, kustomized, charted)
			}
			diffs := diffFacts(installFacts(t, kustomized), installFacts(t, charted))
			switch {
			case tc.wantDiffsIn == "" && len(diffs) > 0:
				t.Errorf("the chart and config/default differ:\n%s", strings.Join(diffs, "\n"))
			case tc.wantDiffsIn != "" && !slices.ContainsFunc(diffs, func(d string) bool { return strings.HasPrefix(d, tc.wantDiffsIn) }):
				t.Errorf("no difference in %q found; differences:\n%s", tc.wantDiffsIn, strings.Join(diffs, "\n"))
			}
		})
	}
}

func deepCopyAll(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	out := make([]*unstructured.Unstructured, len(objs))
	for i, o := range objs {
		out[i] = o.DeepCopy()
	}
	return out
}

// installFacts reduces an install to what it grants and runs, keyed by
// "Kind/name what", each value normalised to JSON: rules sorted, label
// selectors reduced to whether they select the manager's pods (the chart's
// labels name its release too). The Namespace is left out: with Helm it is
// the user's (--create-namespace).
func installFacts(t *testing.T, objs []*unstructured.Unstructured) map[string]string {
	t.Helper()
	var deploy appsv1.Deployment
	into(t, find(t, objs, "Deployment"), &deploy)
	podLabels := labels.Set(deploy.Spec.Template.Labels)
	selects := func(s *metav1.LabelSelector) bool {
		selector, err := metav1.LabelSelectorAsSelector(s)
		return err == nil && !selector.Empty() && selector.Matches(podLabels)
	}
	facts := map[string]string{}
	set := func(key string, v any) {
		raw, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		facts[key] = string(raw)
	}
	for _, o := range objs {
		key := o.GetKind() + "/" + o.GetName()
		switch o.GetKind() {
		case "Namespace":
			continue
		case "ClusterRole", "Role":
			var role rbacv1.ClusterRole // a Role's rules have the same shape
			into(t, o, &role)
			set(key+" rules", normalisedRules(role.Rules))
		case "ClusterRoleBinding", "RoleBinding":
			var binding rbacv1.ClusterRoleBinding
			into(t, o, &binding)
			set(key+" roleRef", binding.RoleRef)
			set(key+" subjects", binding.Subjects)
		case "Deployment":
			spec := deploy.Spec.Template.Spec
			c := spec.Containers[0]
			set(key+" replicas", deploy.Spec.Replicas)
			set(key+" selects its pods", selects(deploy.Spec.Selector))
			set(key+" serviceAccountName", spec.ServiceAccountName)
			set(key+" terminationGracePeriodSeconds", spec.TerminationGracePeriodSeconds)
			set(key+" pod securityContext", spec.SecurityContext)
			set(key+" container securityContext", c.SecurityContext)
			set(key+" args", c.Args)
			set(key+" ports", c.Ports)
			set(key+" livenessProbe", c.LivenessProbe)
			set(key+" readinessProbe", c.ReadinessProbe)
			set(key+" resources", c.Resources)
			for i, spread := range spec.TopologySpreadConstraints {
				set(fmt.Sprintf("%s topologySpreadConstraints[%d] selects its pods", key, i), selects(spread.LabelSelector))
				spread.LabelSelector = nil
				set(fmt.Sprintf("%s topologySpreadConstraints[%d]", key, i), spread)
			}
		case "PodDisruptionBudget":
			var pdb policyv1.PodDisruptionBudget
			into(t, o, &pdb)
			set(key+" maxUnavailable", pdb.Spec.MaxUnavailable)
			set(key+" minAvailable", pdb.Spec.MinAvailable)
			set(key+" selects the manager's pods", selects(pdb.Spec.Selector))
		case "Service":
			var svc corev1.Service
			into(t, o, &svc)
			set(key+" ports", svc.Spec.Ports)
			set(key+" selects the manager's pods", selects(&metav1.LabelSelector{MatchLabels: svc.Spec.Selector}))
		default:
			// FlowSchema, PriorityLevelConfiguration, CRD, ServiceAccount.
			spec, _, _ := unstructured.NestedFieldCopy(o.Object, "spec")
			set(key+" spec", spec)
		}
		// kustomize gives cluster-scoped FlowSchemas a namespace, which the
		// API server ignores: only a namespaced object's counts.
		if namespaced, err := env.Client.IsObjectNamespaced(o); err != nil || namespaced {
			set(key+" namespace", o.GetNamespace())
		}
	}
	return facts
}

// normalisedRules sorts each rule's lists and the rules, so that rules
// granting the same compare equal however they are written.
func normalisedRules(rules []rbacv1.PolicyRule) []string {
	out := make([]string, 0, len(rules))
	for _, r := range rules {
		for _, list := range [][]string{r.APIGroups, r.Resources, r.ResourceNames, r.NonResourceURLs, r.Verbs} {
			slices.Sort(list)
		}
		raw, _ := json.Marshal(r)
		out = append(out, string(raw))
	}
	slices.Sort(out)
	return out
}

// diffFacts lists the keys whose values differ, with both values.
func diffFacts(want, got map[string]string) []string {
	keys := map[string]bool{}
	for k := range want {
		keys[k] = true
	}
	for k := range got {
		keys[k] = true
	}
	var diffs []string
	for _, key := range slices.Sorted(maps.Keys(keys)) {
		if want[key] != got[key] {
			diffs = append(diffs, fmt.Sprintf("%s: config/default %s, chart %s", key, orAbsent(want[key]), orAbsent(got[key])))
		}
	}
	return diffs
}

func orAbsent(v string) string {
	if v == "" {
		return "(absent)"
	}
	return v
}

// asServiceAccount is a client configuration that impersonates a service
// account, as its pod's token would authenticate it.
func asServiceAccount(namespace, name string) *rest.Config {
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: serviceaccount.MakeUsername(namespace, name),
		Groups:   serviceaccount.MakeGroupNames(namespace),
	}
	return cfg
}

// managerServiceAccount is the service account the chart's Deployment runs as.
func managerServiceAccount(t *testing.T, rel *release.Release) string {
	t.Helper()
	var deploy appsv1.Deployment
	into(t, find(t, decodeManifests(t, rel.Manifest), "Deployment"), &deploy)
	return deploy.Spec.Template.Spec.ServiceAccountName
}

// TestChartRestrictedRBAC installs the chart with
// rbac.migratedGroups=[stable.example.com] and runs the operator as the
// chart's service account, with nothing but the chart's RBAC: a CRD in the
// named group migrates (proven from etcd), and Secrets, in the core group
// the list leaves out, stall with reason Unsupported and the API server's
// refusal. After `helm upgrade` lists "" too, the same StorageMigration
// migrates every Secret.
func TestChartRestrictedRBAC(t *testing.T) {
	const name, namespace = "restow-narrow", "restow-narrow"
	narrowed := map[string]any{"rbac": map[string]any{"migratedGroups": []any{"stable.example.com"}}}
	rel := installChart(t, name, namespace, narrowed)
	var role rbacv1.ClusterRole
	into(t, find(t, decodeManifests(t, rel.Manifest), "ClusterRole", name+"-manager-role"), &role)
	if got, want := role.Rules[1].APIGroups, []string{"stable.example.com", "migration.restow.dev"}; !slices.Equal(got, want) {
		t.Fatalf("rule 0 of the manager's role covers groups %q, want %q", got, want)
	}
	sa := managerServiceAccount(t, rel)

	gizmos := installCRD(t, "stable.example.com", "Gizmo", "gizmos", 200)
	secrets := createSecrets(t, "chart-secrets", 20, "not-for-restow-"+randomHex(t))
	stop := operator.Start(t, asServiceAccount(namespace, sa), env.Scheme, controllers.Options{AutoMigrate: true})
	defer stop()
	gizmos.SwitchStorage(t, "v1")
	secretsMigration := migrateSecrets(t, "chart-secrets")
	t.Cleanup(func() { deleteMigration(t, gizmos.crdName) })

	waitCondition(t, gizmos.crdName, migrationv1alpha1.ReadyCondition, migrationv1alpha1.SucceededReason)
	gizmos.assertAllStoredAt(t, "v1")
	gizmos.assertStoredVersions(t, "v1")

	sm := waitCondition(t, secretsMigration.Name, migrationv1alpha1.StalledCondition, migrationv1alpha1.UnsupportedReason)
	stalled := apimeta.FindStatusCondition(sm.Status.Conditions, migrationv1alpha1.StalledCondition)
	user := serviceaccount.MakeUsername(namespace, sa)
	for _, want := range []string{"forbidden", `"` + user + `"`, `cannot list resource "secrets" in API group ""`} {
		if !strings.Contains(stalled.Message, want) {
			t.Errorf("Stalled message %q does not name the refusal (%s)", stalled.Message, want)
		}
	}
	t.Logf("Stalled: %s", stalled.Message)

	t.Run(`with "" listed, Secrets migrate`, func(t *testing.T) {
		withCore := map[string]any{"rbac": map[string]any{"migratedGroups": []any{"stable.example.com", ""}}}
		upgraded := upgradeChart(t, name, namespace, withCore)
		into(t, find(t, decodeManifests(t, upgraded.Manifest), "ClusterRole", name+"-manager-role"), &role)
		if got, want := role.Rules[1].APIGroups, []string{"stable.example.com", "", "migration.restow.dev"}; !slices.Equal(got, want) {
			t.Fatalf("after the upgrade rule 0 covers groups %q, want %q", got, want)
		}
		// The Stalled migration is tried again on its own, with backoff.
		sm := waitCondition(t, secretsMigration.Name, migrationv1alpha1.ReadyCondition, migrationv1alpha1.SucceededReason)
		// Helm's release records are Secrets too, and Helm may still be
		// writing the upgrade's: one it changes after the list is counted
		// as changed by others (skipped), which is as good as rewritten.
		if last := sm.Status.LastPass; last == nil || last.Listed < int64(len(secrets)) || last.Migrated+last.AlreadyStored+last.Skipped != last.Listed || last.Failed != 0 {
			t.Errorf("secrets' last pass = %+v, want at least the test's %d Secrets, all rewritten or changed by others, none failed", last, len(secrets))
		}
	})
}

// TestChartTestHook runs `helm test` on an installed release with the test
// control plane standing in for a kubelet: when Helm creates the hook's
// Pod, the test runs the Pod's command in-process (cli.Execute, the
// plugin the image ships) as the Pod's service account, and writes the
// exit code into the Pod's status, which Helm waits for. The operator runs
// as the chart's manager service account. With it, `helm test` passes;
// without any operator the hook's command exits 4, so the test can fail.
func TestChartTestHook(t *testing.T) {
	const name, namespace = "restow-hook", "restow-hook"
	rel := installChart(t, name, namespace, nil)
	hooks := make([]*unstructured.Unstructured, 0, len(rel.Hooks))
	for _, h := range rel.Hooks {
		hooks = append(hooks, decodeManifests(t, h.Manifest)...)
	}
	var pod corev1.Pod
	into(t, find(t, hooks, "Pod"), &pod)
	if got := pod.Annotations["helm.sh/hook"]; got != "test" {
		t.Fatalf("the hook Pod's helm.sh/hook is %q, want test", got)
	}
	if got, want := pod.Spec.Containers[0].Command, []string{"/kubectl-restow"}; !slices.Equal(got, want) {
		t.Fatalf("the hook runs %q, want the image's kubectl plugin %q", got, want)
	}
	t.Cleanup(func() { deleteMigration(t, "storagemigrations.migration.restow.dev") })

	// helm test, with the test standing in for the kubelet; extra goes to
	// the hook's command.
	helmTest := func(t *testing.T, extra ...string) (code int, err error) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		ran := make(chan int, 1)
		go func() { ran <- actAsKubelet(ctx, t, &pod, extra...) }()
		test := action.NewReleaseTesting(helmConfig(t, namespace))
		test.Namespace, test.Timeout = namespace, 2*time.Minute
		_, shutdown, err := test.Run(name)
		if shutdown != nil {
			// It deletes the hooks as their policy says; it repeats a
			// failed run's error.
			if shutdownErr := shutdown(); shutdownErr != nil && err == nil {
				t.Error(shutdownErr)
			}
		}
		cancel()
		return <-ran, err
	}

	t.Run("no operator: helm test fails, the hook exits 4", func(t *testing.T) {
		// Quicker than the default 30 s to conclude that none answers.
		code, err := helmTest(t, "--operator-timeout=3s")
		if err == nil || code != cli.ExitNoOperator {
			t.Errorf("helm test without an operator: %v, the hook exited %d; want a failure and exit %d", err, code, cli.ExitNoOperator)
		}
		t.Logf("helm test: %v", err)
	})

	t.Run("helm test passes with the operator running", func(t *testing.T) {
		stop := operator.Start(t, asServiceAccount(namespace, managerServiceAccount(t, rel)), env.Scheme, controllers.Options{AutoMigrate: true})
		defer stop()
		if code, err := helmTest(t); err != nil || code != 0 {
			t.Errorf("helm test: %v; the hook exited %d", err, code)
		}
		waitCondition(t, "storagemigrations.migration.restow.dev", migrationv1alpha1.ReadyCondition, migrationv1alpha1.SucceededReason)
	})
}

// runHookCommand runs the hook Pod's command in-process, as the Pod's
// service account, with extra arguments, and returns its exit code and
// output. The kubeconfig stands in for the Pod's in-cluster token.
func runHookCommand(t *testing.T, pod *corev1.Pod, extra ...string) (int, string) {
	t.Helper()
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := env.WriteKubeconfigAs(kubeconfig, serviceaccount.MakeUsername(pod.Namespace, pod.Spec.ServiceAccountName), serviceaccount.MakeGroupNames(pod.Namespace)...); err != nil {
		t.Fatal(err)
	}
	args := append(slices.Clone(pod.Spec.Containers[0].Args), "--kubeconfig="+kubeconfig, "--cache-dir="+filepath.Join(dir, "cache"))
	args = append(args, extra...)
	var out bytes.Buffer
	code := cli.Execute(t.Context(), args, genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &out})
	t.Logf("/kubectl-restow %s: exit %d\n%s", strings.Join(args, " "), code, out.String())
	return code, out.String()
}

// actAsKubelet waits for Helm to create the hook Pod, runs its command and
// reports the exit code in the Pod's status, as a kubelet would.
func actAsKubelet(ctx context.Context, t *testing.T, rendered *corev1.Pod, extra ...string) int {
	live := &corev1.Pod{}
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		// Pending: not the one of an earlier run, which Helm deletes first.
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(rendered), live)
		return err == nil && live.Status.Phase == corev1.PodPending, client.IgnoreNotFound(err)
	})
	if err != nil {
		t.Errorf("helm test created no Pod %s: %v", rendered.Name, err)
		return -1
	}
	code, _ := runHookCommand(t, live, extra...)
	phase := corev1.PodSucceeded
	if code != 0 {
		phase = corev1.PodFailed
	}
	now := metav1.Now()
	live.Status.Phase = phase
	live.Status.ContainerStatuses = []corev1.ContainerStatus{{
		Name:  live.Spec.Containers[0].Name,
		Image: live.Spec.Containers[0].Image,
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: int32(code), StartedAt: now, FinishedAt: now}},
	}}
	if err := env.Client.Status().Update(ctx, live); err != nil {
		t.Errorf("writing the hook Pod's status: %v", err)
	}
	return code
}

// TestChartREADMEDocumentsEveryValue: every value in values.yaml is named
// in charts/restow/README.md, itself or through the map holding it
// (`resources` covers resources.requests.cpu).
func TestChartREADMEDocumentsEveryValue(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented := func(path string) bool {
		for prefix := path; prefix != ""; prefix = parentPath(prefix) {
			if strings.Contains(string(readme), "`"+prefix+"`") {
				return true
			}
		}
		return false
	}
	paths := valuePaths("", loadChart(t).Values)
	if len(paths) < 20 {
		t.Fatalf("values.yaml has %d values, expected more: %v", len(paths), paths)
	}
	for _, path := range paths {
		if !documented(path) {
			t.Errorf("value %s is not in %s/README.md", path, chartDir)
		}
	}
}

// valuePaths lists the dotted paths of the leaves of values.
func valuePaths(prefix string, values map[string]any) []string {
	var paths []string
	for _, key := range slices.Sorted(maps.Keys(values)) {
		path := strings.TrimPrefix(prefix+"."+key, ".")
		if nested, ok := values[key].(map[string]any); ok && len(nested) > 0 {
			paths = append(paths, valuePaths(path, nested)...)
			continue
		}
		paths = append(paths, path)
	}
	return paths
}

// parentPath is the dotted path of the map holding path's value: "" for a
// top-level value.
func parentPath(path string) string {
	if i := strings.LastIndex(path, "."); i >= 0 {
		return path[:i]
	}
	return ""
}

// TestChartVersionFollowsMakefile: the chart in the tree names the version
// the Makefile builds when no tag says otherwise, so `helm install
// ./charts/restow` runs the image `make image-tar` tags; make chart sets
// both from VERSION for a release.
func TestChartVersionFollowsMakefile(t *testing.T) {
	makefile, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^VERSION \?= .*\|\| echo (v\S+)\)$`).FindSubmatch(makefile)
	if m == nil {
		t.Fatal("the Makefile's VERSION has no default (|| echo vX.Y.Z)")
	}
	meta := loadChart(t).Metadata
	if want := string(m[1]); meta.AppVersion != want || meta.Version != strings.TrimPrefix(want, "v") {
		t.Errorf("Chart.yaml: version %s, appVersion %s; want %s and %s, the Makefile's VERSION default", meta.Version, meta.AppVersion, strings.TrimPrefix(want, "v"), want)
	}
}
