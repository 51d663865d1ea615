package controllers

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/restow/restow/internal/version"
)

// TestBuildInfo: restow_build_info has one series, 1 under the labels of
// this binary's build, the same version --version prints.
func TestBuildInfo(t *testing.T) {
	metrics := make(chan prometheus.Metric, 10)
	buildInfo.Collect(metrics)
	close(metrics)
	var series []*dto.Metric
	for m := range metrics {
		written := &dto.Metric{}
		if err := m.Write(written); err != nil {
			t.Fatal(err)
		}
		series = append(series, written)
	}
	if len(series) != 1 {
		t.Fatalf("restow_build_info has %d series, want one", len(series))
	}
	info := version.Get()
	want := map[string]string{"version": info.Version, "revision": info.GitCommit, "goversion": info.GoVersion}
	for _, label := range series[0].GetLabel() {
		if want[label.GetName()] != label.GetValue() {
			t.Errorf("restow_build_info label %s=%q, want %q", label.GetName(), label.GetValue(), want[label.GetName()])
		}
	}
	if v := series[0].GetGauge().GetValue(); v != 1 {
		t.Errorf("restow_build_info = %v, want 1", v)
	}
}
