package config_test

import (
	"maps"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestMonitoringComponent renders config/default with the monitoring and
// prometheus-rules components: the ServiceMonitor selects the metrics
// Service by its labels and names its port, in its namespace; the binding
// gives Prometheus's service account the metrics reader's ClusterRole that
// config/default installs; the alerts come along. The chart does the same
// with serviceMonitor.prometheusServiceAccount, and binds nothing without it.
func TestMonitoringComponent(t *testing.T) {
	objs := render(t, "testdata/monitoring")
	var service corev1.Service
	into(t, find(t, objs, "Service", "restow-controller-manager-metrics-service"), &service)
	monitor := find(t, objs, "ServiceMonitor")
	selector, _, _ := unstructured.NestedStringMap(monitor.Object, "spec", "selector", "matchLabels")
	if len(selector) == 0 || !isSubset(selector, service.Labels) {
		t.Errorf("the ServiceMonitor selects %v; the metrics Service is labelled %v", selector, service.Labels)
	}
	endpoints, _, _ := unstructured.NestedSlice(monitor.Object, "spec", "endpoints")
	port := endpoints[0].(map[string]any)["port"]
	if !slices.ContainsFunc(service.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == port }) {
		t.Errorf("the ServiceMonitor scrapes port %v; the metrics Service has %+v", port, service.Spec.Ports)
	}
	if monitor.GetNamespace() != service.Namespace {
		t.Errorf("the ServiceMonitor is in %q, the metrics Service in %q", monitor.GetNamespace(), service.Namespace)
	}
	var binding rbacv1.ClusterRoleBinding
	into(t, find(t, objs, "ClusterRoleBinding", "restow-metrics-reader-prometheus"), &binding)
	var reader rbacv1.ClusterRole
	into(t, find(t, objs, "ClusterRole", binding.RoleRef.Name), &reader)
	if len(reader.Rules) != 1 || !slices.Equal(reader.Rules[0].NonResourceURLs, []string{"/metrics"}) {
		t.Errorf("the binding gives %s, whose rules are %+v; want get on /metrics", reader.Name, reader.Rules)
	}
	find(t, objs, "PrometheusRule")

	charted, _ := renderChart(t, "restow", "restow-system", map[string]any{"serviceMonitor": map[string]any{
		"enabled": true, "prometheusServiceAccount": map[string]any{"name": "prometheus-k8s", "namespace": "monitoring"},
	}})
	into(t, find(t, charted, "ClusterRoleBinding", "restow-metrics-reader-prometheus"), &binding)
	if binding.RoleRef.Name != "restow-metrics-reader" || binding.Subjects[0].Name != "prometheus-k8s" || binding.Subjects[0].Namespace != "monitoring" {
		t.Errorf("the chart's binding: %+v", binding)
	}
	find(t, charted, "ClusterRole", "restow-metrics-reader")
	plain, _ := renderChart(t, "restow", "restow-system", nil)
	for _, o := range plain {
		if o.GetKind() == "ClusterRoleBinding" && o.GetName() == "restow-metrics-reader-prometheus" {
			t.Error("the chart binds Prometheus's service account without serviceMonitor.prometheusServiceAccount")
		}
	}
}

func isSubset(sub, of map[string]string) bool {
	for k := range maps.Keys(sub) {
		if of[k] != sub[k] {
			return false
		}
	}
	return true
}
