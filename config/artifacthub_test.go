package config_test

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestChartArtifactHubAnnotations: the annotations Artifact Hub reads from
// Chart.yaml have the shapes Artifact Hub documents and say what the chart
// holds: the image it runs by default, the CRD it installs (with the sample
// from config/samples), the license in LICENSE, and links to files that
// exist. A misspelt key would be ignored by Artifact Hub, so every
// artifacthub.io key must be one checked here.
func TestChartArtifactHubAnnotations(t *testing.T) {
	ch := loadChart(t)
	meta := ch.Metadata
	parse := func(key string, into any) {
		t.Helper()
		if meta.Annotations[key] == "" {
			t.Errorf("Chart.yaml has no annotation %s", key)
			return
		}
		if err := yaml.UnmarshalStrict([]byte(meta.Annotations[key]), into); err != nil {
			t.Errorf("annotation %s: %v", key, err)
		}
	}
	checked := []string{
		"artifacthub.io/license", "artifacthub.io/operator", "artifacthub.io/links", "artifacthub.io/images",
		"artifacthub.io/crds", "artifacthub.io/crdsExamples", "artifacthub.io/changes",
	}
	for key := range meta.Annotations {
		if strings.HasPrefix(key, "artifacthub.io/") && !slices.Contains(checked, key) {
			t.Errorf("annotation %s is not one this test checks (make chart sets artifacthub.io/prerelease)", key)
		}
	}

	license, err := os.ReadFile("../LICENSE")
	if err != nil {
		t.Fatal(err)
	}
	if got := meta.Annotations["artifacthub.io/license"]; got != "Apache-2.0" || !strings.Contains(string(license), "Apache License\n                           Version 2.0") {
		t.Errorf("artifacthub.io/license %q: want Apache-2.0, the license in LICENSE", got)
	}
	if got := meta.Annotations["artifacthub.io/operator"]; got != "true" {
		t.Errorf("artifacthub.io/operator %q, want \"true\"", got)
	}

	var links []struct{ Name, URL string }
	parse("artifacthub.io/links", &links)
	inRepo := regexp.MustCompile(`^https://github\.com/restow/restow/(?:blob|tree)/main/(.+)$`)
	for _, l := range links {
		m := inRepo.FindStringSubmatch(l.URL)
		if l.Name == "" || m == nil {
			t.Errorf("link %q %s: want a name and a URL into the repository's main branch", l.Name, l.URL)
			continue
		}
		if _, err := os.Stat("../" + m[1]); err != nil {
			t.Errorf("link %q: %v", l.Name, err)
		}
	}

	var images []struct{ Name, Image string }
	parse("artifacthub.io/images", &images)
	image, _ := ch.Values["image"].(map[string]any)
	if want := image["repository"].(string) + ":" + meta.AppVersion; len(images) != 1 || images[0].Name == "" || images[0].Image != want {
		t.Errorf("artifacthub.io/images %+v: want one, %s, the image the chart runs by default", images, want)
	}

	var crds []struct{ Kind, Version, Name, DisplayName, Description string }
	parse("artifacthub.io/crds", &crds)
	raw, err := os.ReadFile(chartDir + "/files/migration.restow.dev_storagemigrations.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd struct {
		Metadata struct{ Name string }
		Spec     struct {
			Names    struct{ Kind string }
			Versions []struct {
				Name    string
				Storage bool
			}
		}
	}
	if err := yaml.Unmarshal(raw, &crd); err != nil {
		t.Fatal(err)
	}
	storage := ""
	for _, v := range crd.Spec.Versions {
		if v.Storage {
			storage = v.Name
		}
	}
	if len(crds) != 1 || crds[0].Name != crd.Metadata.Name || crds[0].Kind != crd.Spec.Names.Kind ||
		crds[0].Version != storage || crds[0].DisplayName == "" || crds[0].Description == "" {
		t.Errorf("artifacthub.io/crds %+v: want the chart's CRD, %s %s %s, with a display name and a description", crds, crd.Metadata.Name, crd.Spec.Names.Kind, storage)
	}

	var examples []map[string]any
	parse("artifacthub.io/crdsExamples", &examples)
	raw, err = os.ReadFile("samples/migration_v1alpha1_storagemigration.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var sample map[string]any
	if err := yaml.Unmarshal(raw, &sample); err != nil {
		t.Fatal(err)
	}
	if len(examples) != 1 || !reflect.DeepEqual(examples[0], sample) {
		t.Errorf("artifacthub.io/crdsExamples %v: want config/samples/migration_v1alpha1_storagemigration.yaml, %v", examples, sample)
	}

	var changes []struct {
		Kind, Description string
		Links             []struct{ Name, URL string } `json:"links,omitempty"`
	}
	parse("artifacthub.io/changes", &changes)
	kinds := []string{"added", "changed", "deprecated", "removed", "fixed", "security"}
	if len(changes) == 0 {
		t.Error("artifacthub.io/changes lists no change")
	}
	for _, c := range changes {
		if !slices.Contains(kinds, c.Kind) || c.Description == "" {
			t.Errorf("change %+v: want a kind of %v and a description", c, kinds)
		}
	}
}
