package main

import (
	"testing"

	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"sigs.k8s.io/yaml"
)

// TestPackageSetsArtifactHubAnnotations packages the chart as make chart
// does for a release and a pre-release, and reads the packages back: the
// image Artifact Hub lists is the one the packaged chart runs by default,
// and only a SemVer pre-release is marked as one.
func TestPackageSetsArtifactHubAnnotations(t *testing.T) {
	for _, tc := range []struct {
		version, prerelease string
	}{
		{"0.2.0", "false"},
		{"0.3.0-rc.1", "true"},
	} {
		t.Run(tc.version, func(t *testing.T) {
			path, err := packageChart("../../charts/restow", tc.version, "v"+tc.version, "registry.example.com/restow", t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			ch, err := loader.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			var images []artifactHubImage
			if err := yaml.UnmarshalStrict([]byte(ch.Metadata.Annotations[artifactHubImages]), &images); err != nil {
				t.Fatalf("%s: %v", artifactHubImages, err)
			}
			want := "registry.example.com/restow:v" + tc.version
			if len(images) != 1 || images[0].Name != "restow" || images[0].Image != want {
				t.Errorf("%s: %+v, want restow %s", artifactHubImages, images, want)
			}
			if image := ch.Values["image"].(map[string]any); image["repository"] != "registry.example.com/restow" || image["tag"] != "" {
				t.Errorf("packaged image values %v: want repository registry.example.com/restow and no tag, so the chart runs %s", image, want)
			}
			if got := ch.Metadata.Annotations[artifactHubPrerelease]; got != tc.prerelease {
				t.Errorf("%s: %q, want %q", artifactHubPrerelease, got, tc.prerelease)
			}
			if ch.Metadata.Annotations["artifacthub.io/license"] != "Apache-2.0" {
				t.Errorf("the package lost Chart.yaml's other annotations: %v", ch.Metadata.Annotations)
			}
		})
	}
}
