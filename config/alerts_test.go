package config_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// prometheusRuleFile is the one source of restow's alerts: the kustomize
// component's PrometheusRule, copied into the chart by make manifests.
const prometheusRuleFile = "components/prometheus-rules/prometheusrule.yaml"

// promtool returns the promtool binary the Makefile builds from Prometheus'
// Go module (make test passes it as PROMTOOL).
func promtool(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("PROMTOOL")
	if bin == "" {
		t.Fatal("PROMTOOL is not set: run the tests with `make test`, which builds promtool into bin/ and sets it")
	}
	return bin
}

// ruleGroups writes the PrometheusRule's spec (its rule groups) into dir as
// rules.yaml, the plain rule file promtool reads.
func ruleGroups(t *testing.T, dir string) string {
	t.Helper()
	raw, err := os.ReadFile(prometheusRuleFile)
	if err != nil {
		t.Fatal(err)
	}
	var rule struct {
		Kind string         `json:"kind"`
		Spec map[string]any `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &rule); err != nil {
		t.Fatal(err)
	}
	if rule.Kind != "PrometheusRule" || rule.Spec["groups"] == nil {
		t.Fatalf("%s: kind %q with no spec.groups", prometheusRuleFile, rule.Kind)
	}
	out, err := yaml.Marshal(rule.Spec)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestAlertRules checks restow's alerts with Prometheus' own tools: promtool
// check rules (syntax, templates) and promtool test rules, which replays
// the series in prometheus/tests/alerts_test.yaml and compares the alerts
// that fire, with their labels and annotations, at each evaluation time.
func TestAlertRules(t *testing.T) {
	bin := promtool(t)
	dir := t.TempDir()
	rules := ruleGroups(t, dir)
	if out, err := exec.Command(bin, "check", "rules", rules).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	tests, err := os.ReadFile("prometheus/tests/alerts_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	testFile := filepath.Join(dir, "alerts_test.yaml")
	if err := os.WriteFile(testFile, tests, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "test", "rules", testFile).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

// TestChartPrometheusRule: with prometheusRule.enabled, the chart renders
// the alerts promtool tests (the kustomize component's rule groups, not a
// copy that could drift), with the labels the user's Prometheus selects;
// without it, none.
func TestChartPrometheusRule(t *testing.T) {
	objs, _ := renderChart(t, "restow", "restow-system", nil)
	if slices.ContainsFunc(objs, func(o *unstructured.Unstructured) bool { return o.GetKind() == "PrometheusRule" }) {
		t.Error("the default chart renders a PrometheusRule")
	}
	objs, _ = renderChart(t, "restow", "monitoring-test", map[string]any{
		"prometheusRule": map[string]any{"enabled": true, "labels": map[string]any{"release": "prometheus"}},
	})
	rendered := find(t, objs, "PrometheusRule")
	if rendered.GetNamespace() != "monitoring-test" || rendered.GetLabels()["release"] != "prometheus" {
		t.Errorf("PrometheusRule in %q with labels %v, want the release's namespace and prometheusRule.labels", rendered.GetNamespace(), rendered.GetLabels())
	}
	raw, err := os.ReadFile(prometheusRuleFile)
	if err != nil {
		t.Fatal(err)
	}
	var source map[string]any
	if err := yaml.Unmarshal(raw, &source); err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(rendered.Object["spec"], source["spec"]) {
		t.Errorf("the chart's PrometheusRule spec differs from %s:\n%v", prometheusRuleFile, rendered.Object["spec"])
	}
}
