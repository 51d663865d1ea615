package config_test

import (
	"os"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestInstallSamples holds config/samples/install, restow installed by
// Argo CD and by Flux, to the chart: each takes the chart of the release
// this tree becomes (Chart.yaml's version without "-dev") from the
// registry the release workflow pushes it to, into restow-system, and its
// values render with the chart's own schema, as Helm's SDK runs it.
func TestInstallSamples(t *testing.T) {
	release := strings.TrimSuffix(loadChart(t).Metadata.Version, "-dev")
	const registry = "oci://ghcr.io/restow/charts/restow"
	docs := func(file string) map[string]*unstructured.Unstructured {
		t.Helper()
		raw, err := os.ReadFile("samples/install/" + file)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]*unstructured.Unstructured{}
		for _, o := range decodeManifests(t, string(raw)) {
			out[o.GetKind()] = o
		}
		return out
	}
	str := func(o *unstructured.Unstructured, path ...string) string {
		v, _, _ := unstructured.NestedString(o.Object, path...)
		return v
	}

	argo := docs("argocd-application.yaml")["Application"]
	if argo == nil {
		t.Fatal("argocd-application.yaml holds no Application")
	}
	if got := str(argo, "spec", "source", "repoURL"); got != registry {
		t.Errorf("the Application's repoURL is %s, want %s", got, registry)
	}
	if got := str(argo, "spec", "source", "targetRevision"); got != release {
		t.Errorf("the Application takes chart %s, want %s", got, release)
	}
	if got := str(argo, "spec", "destination", "namespace"); got != "restow-system" {
		t.Errorf("the Application installs into %s, want restow-system", got)
	}
	options, _, _ := unstructured.NestedStringSlice(argo.Object, "spec", "syncPolicy", "syncOptions")
	if !strings.Contains(strings.Join(options, ","), "ServerSideApply=true") {
		t.Errorf("the Application's syncOptions %v lack ServerSideApply=true", options)
	}
	argoValues, _, _ := unstructured.NestedMap(argo.Object, "spec", "source", "helm", "valuesObject")
	if _, err := templateChart(loadChart(t), "restow", "restow-system", argoValues); err != nil {
		t.Errorf("the Application's values do not render: %v", err)
	}

	flux := docs("flux-helmrelease.yaml")
	repo, hr := flux["OCIRepository"], flux["HelmRelease"]
	if repo == nil || hr == nil {
		t.Fatal("flux-helmrelease.yaml holds no OCIRepository and HelmRelease")
	}
	if got := str(repo, "spec", "url"); got != registry {
		t.Errorf("the OCIRepository's url is %s, want %s", got, registry)
	}
	if got := str(repo, "spec", "ref", "tag"); got != release {
		t.Errorf("the OCIRepository takes chart %s, want %s", got, release)
	}
	if str(hr, "spec", "chartRef", "kind") != "OCIRepository" || str(hr, "spec", "chartRef", "name") != repo.GetName() || repo.GetNamespace() != hr.GetNamespace() {
		t.Errorf("the HelmRelease's chartRef does not name the OCIRepository %s/%s", repo.GetNamespace(), repo.GetName())
	}
	if got := str(hr, "spec", "targetNamespace"); got != "restow-system" {
		t.Errorf("the HelmRelease installs into %s, want restow-system", got)
	}
	fluxValues, _, _ := unstructured.NestedMap(hr.Object, "spec", "values")
	if _, err := templateChart(loadChart(t), "restow", "restow-system", fluxValues); err != nil {
		t.Errorf("the HelmRelease's values do not render: %v", err)
	}
}
