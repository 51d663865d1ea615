package config_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// dashboardFile is restow's Grafana dashboard, also rendered by the chart
// (grafanaDashboard.enabled) from the copy make manifests puts in files/.
const dashboardFile = "grafana/restow-dashboard.json"

// dashboardQueries returns the PromQL of every panel target, by panel title,
// with the dashboard's variables replaced by what they select at most.
func dashboardQueries(t *testing.T) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dashboard struct {
		Panels []struct {
			ID      int    `json:"id"`
			Title   string `json:"title"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dashboard); err != nil {
		t.Fatal(err)
	}
	queries := map[string]string{}
	for _, p := range dashboard.Panels {
		for _, target := range p.Targets {
			if target.Expr == "" {
				t.Errorf("panel %q target %s has no query", p.Title, target.RefID)
			}
			queries[fmt.Sprintf("%s (%s)", p.Title, target.RefID)] = strings.ReplaceAll(target.Expr, "$resource", ".*")
		}
	}
	if len(queries) == 0 {
		t.Fatalf("%s has no queries", dashboardFile)
	}
	return queries
}

var metricName = regexp.MustCompile(`\b(restow_[a-z_]+|rest_client_[a-z_]+)\b`)

// TestGrafanaDashboard checks every query of the dashboard twice: Prometheus'
// own parser accepts it (promtool check rules, each query a recording
// rule), and every metric it reads is one that restow's manager, deployed
// as config/default has it, really serves after a migration.
func TestGrafanaDashboard(t *testing.T) {
	queries := dashboardQueries(t)
	rules := make([]map[string]any, 0, len(queries))
	names := map[string]bool{}
	for i, title := range slices.Sorted(maps.Keys(queries)) {
		rules = append(rules, map[string]any{"record": fmt.Sprintf("restow:dashboard_query_%d", i), "expr": queries[title]})
		for _, m := range metricName.FindAllString(queries[title], -1) {
			names[m] = true
		}
	}
	out, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	if err := os.WriteFile(file, out, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool(t), "check", "rules", file).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules on the dashboard's queries: %v\n%s", err, out)
	}

	objs := render(t, "default")
	apply(t, objs)
	manager := assertDeployedManagerMigrates(t, objs, "dashboard.config.restow.dev", "Widget", "widgets")
	served, err := manager.MetricsText(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for name := range names {
		if !regexp.MustCompile(`(?m)^` + name + `[{ ]`).MatchString(served) {
			t.Errorf("the dashboard reads %s, which the manager does not serve", name)
		}
	}
	if !names["restow_objects_total"] || !names["restow_pass_duration_seconds_bucket"] {
		t.Errorf("the dashboard's metrics %v miss the object counts or the pass durations", names)
	}
}

// TestChartGrafanaDashboard: with grafanaDashboard.enabled, the chart ships
// the dashboard TestGrafanaDashboard checks, unchanged, in a ConfigMap that
// Grafana's sidecar picks up.
func TestChartGrafanaDashboard(t *testing.T) {
	objs, _ := renderChart(t, "restow", "restow-system", map[string]any{"grafanaDashboard": map[string]any{"enabled": true}})
	cm := find(t, objs, "ConfigMap", "restow-dashboard")
	if cm.GetLabels()["grafana_dashboard"] != "1" {
		t.Errorf("ConfigMap labels %v: the sidecar selects grafana_dashboard=1", cm.GetLabels())
	}
	data, _, _ := unstructured.NestedString(cm.Object, "data", "restow.json")
	want, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(data) != strings.TrimSpace(string(want)) {
		t.Errorf("the chart's dashboard differs from %s", dashboardFile)
	}
}
