package config_test

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/controllers"
	"github.com/restow/restow/internal/operator"
)

// The fields of kube-state-metrics' custom-resource-state configuration that
// restow's file uses (k8s.io/kube-state-metrics/v2/pkg/customresourcestate,
// whose module the proxy here does not serve). Decoding strictly refuses a
// field kube-state-metrics would not know.
type ksmConfig struct {
	Kind string `json:"kind"`
	Spec struct {
		Resources []struct {
			GroupVersionKind struct {
				Group   string `json:"group"`
				Version string `json:"version"`
				Kind    string `json:"kind"`
			} `json:"groupVersionKind"`
			MetricNamePrefix string              `json:"metricNamePrefix"`
			LabelsFromPath   map[string][]string `json:"labelsFromPath"`
			Metrics          []struct {
				Name string `json:"name"`
				Help string `json:"help"`
				Each struct {
					Type  string `json:"type"`
					Gauge *struct {
						Path           []string            `json:"path"`
						LabelsFromPath map[string][]string `json:"labelsFromPath"`
						ValueFrom      []string            `json:"valueFrom"`
					} `json:"gauge"`
					Info *struct {
						LabelsFromPath map[string][]string `json:"labelsFromPath"`
					} `json:"info"`
				} `json:"each"`
			} `json:"metrics"`
		} `json:"resources"`
	} `json:"spec"`
}

// TestKubeStateMetricsConfig: every path of the custom-resource-state
// configuration leads, in a StorageMigration that restow's operator brought
// to Ready, to a value of the kind kube-state-metrics reads there: labels
// to strings, gauges to numbers or condition statuses, and a condition list
// whose items carry the labels asked for.
func TestKubeStateMetricsConfig(t *testing.T) {
	raw, err := os.ReadFile("kube-state-metrics/custom-resource-state.yaml")
	if err != nil {
		t.Fatal(err)
	}
	asJSON, err := yaml.YAMLToJSON(raw)
	if err != nil {
		t.Fatal(err)
	}
	var cfg ksmConfig
	dec := json.NewDecoder(bytes.NewReader(asJSON))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		t.Fatalf("custom-resource-state.yaml: %v", err)
	}
	if cfg.Kind != "CustomResourceStateMetrics" || len(cfg.Spec.Resources) != 1 {
		t.Fatalf("kind %q with %d resources, want CustomResourceStateMetrics with one", cfg.Kind, len(cfg.Spec.Resources))
	}
	res := cfg.Spec.Resources[0]
	gvk := migrationv1alpha1.GroupVersion.WithKind("StorageMigration")
	if res.GroupVersionKind.Group != gvk.Group || res.GroupVersionKind.Version != gvk.Version || res.GroupVersionKind.Kind != gvk.Kind {
		t.Fatalf("groupVersionKind %+v, want %s", res.GroupVersionKind, gvk)
	}

	apply(t, render(t, "crd"))
	c := installCRD(t, "ksm.config.restow.dev", "Widget", "widgets", 20)
	operator.Start(t, env.Config, env.Scheme, controllers.Options{AutoMigrate: true})
	c.SwitchStorage(t, "v1")
	waitCondition(t, c.crdName, migrationv1alpha1.ReadyCondition, migrationv1alpha1.SucceededReason)
	t.Cleanup(func() { deleteMigration(t, c.crdName) })
	sm := &unstructured.Unstructured{}
	sm.SetGroupVersionKind(gvk)
	if err := env.Client.Get(t.Context(), client.ObjectKey{Name: c.crdName}, sm); err != nil {
		t.Fatal(err)
	}

	stringAt := func(obj map[string]any, path []string, what string) {
		t.Helper()
		if v, ok, err := unstructured.NestedFieldNoCopy(obj, path...); err != nil || !ok {
			t.Errorf("%s: path %v leads nowhere in a Ready StorageMigration", what, path)
		} else if _, isString := v.(string); !isString {
			t.Errorf("%s: path %v holds %T, not a string", what, path, v)
		}
	}
	for label, path := range res.LabelsFromPath {
		stringAt(sm.Object, path, "label "+label)
	}
	for _, m := range res.Metrics {
		switch {
		case m.Each.Type == "Info" && m.Each.Info != nil:
			for label, path := range m.Each.Info.LabelsFromPath {
				stringAt(sm.Object, path, m.Name+" label "+label)
			}
		case m.Each.Type == "Gauge" && m.Each.Gauge != nil:
			at, ok, err := unstructured.NestedFieldNoCopy(sm.Object, m.Each.Gauge.Path...)
			if err != nil || !ok {
				t.Errorf("%s: path %v leads nowhere", m.Name, m.Each.Gauge.Path)
				continue
			}
			items := []any{at}
			if list, isList := at.([]any); isList {
				items = list
			}
			for _, item := range items {
				fields, isMap := item.(map[string]any)
				if !isMap {
					t.Errorf("%s: %v holds %T, not objects", m.Name, m.Each.Gauge.Path, item)
					continue
				}
				for label, path := range m.Each.Gauge.LabelsFromPath {
					stringAt(fields, path, m.Name+" label "+label)
				}
				switch v, _, _ := unstructured.NestedFieldNoCopy(fields, m.Each.Gauge.ValueFrom...); v.(type) {
				case int64, float64:
				case string:
					if v != "True" && v != "False" && v != "Unknown" {
						t.Errorf("%s: value %q at %v is neither a number nor a condition status", m.Name, v, m.Each.Gauge.ValueFrom)
					}
				default:
					t.Errorf("%s: value at %v is %T, not a number", m.Name, m.Each.Gauge.ValueFrom, v)
				}
			}
		default:
			t.Errorf("metric %s: type %q without its %s block", m.Name, m.Each.Type, m.Each.Type)
		}
	}
}
