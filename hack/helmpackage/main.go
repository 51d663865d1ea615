// Command helmpackage packages the Helm chart as `helm package` does, with
// the Helm SDK instead of a helm binary (make chart): it sets the chart's
// version and appVersion from the build's VERSION, and the default image
// repository from IMAGE_REPO, so a release's chart runs that release's
// image by default.
package main

import (
	"flag"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"

	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	chartutil "helm.sh/helm/v4/pkg/chart/v2/util"
	"sigs.k8s.io/yaml"
)

func main() {
	var chartDir, version, appVersion, imageRepository, output string
	flag.StringVar(&chartDir, "chart", "charts/restow", "chart directory")
	flag.StringVar(&version, "version", "", "the chart's version (SemVer 2, no leading v); empty keeps Chart.yaml's")
	flag.StringVar(&appVersion, "app-version", "", "the chart's appVersion, the default image tag; empty keeps Chart.yaml's")
	flag.StringVar(&imageRepository, "image-repository", "", "the default of the value image.repository; empty keeps values.yaml's")
	flag.StringVar(&output, "output", "dist", "directory to write <name>-<version>.tgz into")
	flag.Parse()
	path, err := packageChart(chartDir, version, appVersion, imageRepository, output)
	if err != nil {
		fmt.Fprintln(os.Stderr, "helmpackage:", err)
		os.Exit(1)
	}
	fmt.Println("wrote", path)
}

func packageChart(chartDir, version, appVersion, imageRepository, output string) (string, error) {
	ch, err := loader.LoadDir(chartDir)
	if err != nil {
		return "", err
	}
	if version != "" {
		ch.Metadata.Version = version
	}
	if appVersion != "" {
		ch.Metadata.AppVersion = appVersion
	}
	if imageRepository != "" {
		if err := setImageRepository(ch, imageRepository); err != nil {
			return "", err
		}
	}
	if err := setArtifactHubAnnotations(ch); err != nil {
		return "", fmt.Errorf("chart %s: %w", chartDir, err)
	}
	// What `helm lint` and `helm package` refuse: a version that is not
	// SemVer, a missing name.
	if err := ch.Validate(); err != nil {
		return "", fmt.Errorf("chart %s: %w", chartDir, err)
	}
	if err := os.MkdirAll(output, 0o755); err != nil {
		return "", err
	}
	return chartutil.Save(ch, output)
}

// imageRepositoryLine is image.repository in values.yaml, the one
// two-space-indented "repository:" key.
var imageRepositoryLine = regexp.MustCompile(`(?m)^  repository: .*$`)

// setImageRepository changes the default of image.repository in the
// chart's values and in the values.yaml it packages, whose comments stay.
func setImageRepository(ch *chart.Chart, repository string) error {
	image, ok := ch.Values["image"].(map[string]any)
	if !ok {
		return fmt.Errorf("values.yaml has no image")
	}
	image["repository"] = repository
	for _, f := range ch.Raw {
		if f.Name != chartutil.ValuesfileName {
			continue
		}
		if n := len(imageRepositoryLine.FindAllIndex(f.Data, -1)); n != 1 {
			return fmt.Errorf("values.yaml has %d lines like %q, want one", n, imageRepositoryLine)
		}
		f.Data = imageRepositoryLine.ReplaceAllLiteral(f.Data, []byte("  repository: "+repository))
	}
	return nil
}

// Artifact Hub's annotations that follow the version being packaged.
const (
	artifactHubImages     = "artifacthub.io/images"
	artifactHubPrerelease = "artifacthub.io/prerelease"
)

// artifactHubImage is one entry of artifacthub.io/images.
type artifactHubImage struct {
	Name  string `json:"name"`
	Image string `json:"image"`
}

// setArtifactHubAnnotations points Chart.yaml's one artifacthub.io/images
// entry at the image the chart runs by default, image.repository at
// image.tag or else appVersion, and marks a SemVer pre-release version as
// one (artifacthub.io/prerelease), which Artifact Hub shows on the version.
func setArtifactHubAnnotations(ch *chart.Chart) error {
	var images []artifactHubImage
	if err := yaml.UnmarshalStrict([]byte(ch.Metadata.Annotations[artifactHubImages]), &images); err != nil {
		return fmt.Errorf("annotation %s: %w", artifactHubImages, err)
	}
	if len(images) != 1 {
		return fmt.Errorf("annotation %s lists %d images, want the manager's one", artifactHubImages, len(images))
	}
	image, _ := ch.Values["image"].(map[string]any)
	repository, _ := image["repository"].(string)
	tag, _ := image["tag"].(string)
	if repository == "" {
		return fmt.Errorf("values.yaml has no image.repository")
	}
	if tag == "" {
		tag = ch.Metadata.AppVersion
	}
	images[0].Image = repository + ":" + tag
	data, err := yaml.Marshal(images)
	if err != nil {
		return err
	}
	ch.Metadata.Annotations[artifactHubImages] = string(data)
	ch.Metadata.Annotations[artifactHubPrerelease] = strconv.FormatBool(strings.Contains(ch.Metadata.Version, "-"))
	return nil
}
