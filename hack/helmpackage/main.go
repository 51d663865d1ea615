// Command helmpackage packages the Helm chart as `helm package` does, with
// the Helm SDK instead of a helm binary (make chart): it sets the chart's
// version and appVersion from the build's VERSION, so a release's chart
// runs that release's image by default.
package main

import (
	"flag"
	"fmt"
	"os"

	"helm.sh/helm/v4/pkg/chart/v2/loader"
	chartutil "helm.sh/helm/v4/pkg/chart/v2/util"
)

func main() {
	var chartDir, version, appVersion, output string
	flag.StringVar(&chartDir, "chart", "charts/restow", "chart directory")
	flag.StringVar(&version, "version", "", "the chart's version (SemVer 2, no leading v); empty keeps Chart.yaml's")
	flag.StringVar(&appVersion, "app-version", "", "the chart's appVersion, the default image tag; empty keeps Chart.yaml's")
	flag.StringVar(&output, "output", "dist", "directory to write <name>-<version>.tgz into")
	flag.Parse()
	path, err := packageChart(chartDir, version, appVersion, output)
	if err != nil {
		fmt.Fprintln(os.Stderr, "helmpackage:", err)
		os.Exit(1)
	}
	fmt.Println("wrote", path)
}

func packageChart(chartDir, version, appVersion, output string) (string, error) {
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
