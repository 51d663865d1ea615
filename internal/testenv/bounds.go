package testenv

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// SpecSizeBounds reads the bounds of a StorageMigration's spec.concurrency
// and spec.pageSize from its generated CRD: the manager's and kubectl
// restow run's --concurrency and --page-size take the same.
func SpecSizeBounds(tb testing.TB) (concurrency, pageSize [2]int64) {
	tb.Helper()
	_, here, _, _ := runtime.Caller(0)
	raw, err := os.ReadFile(filepath.Join(filepath.Dir(here), "../../config/crd/bases/migration.restow.dev_storagemigrations.yaml"))
	if err != nil {
		tb.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(raw, &crd); err != nil {
		tb.Fatal(err)
	}
	spec := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"]
	bounds := func(field string) [2]int64 {
		p := spec.Properties[field]
		if p.Minimum == nil || p.Maximum == nil {
			tb.Fatalf("spec.%s has no minimum or maximum", field)
		}
		return [2]int64{int64(*p.Minimum), int64(*p.Maximum)}
	}
	return bounds("concurrency"), bounds("pageSize")
}

// AssertOneErrorLine checks what a command that refused its input printed
// on stderr: one line starting with "error: " that names want.
func AssertOneErrorLine(tb testing.TB, stderr, want string) {
	tb.Helper()
	if lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n"); len(lines) != 1 || !strings.HasPrefix(stderr, "error: ") {
		tb.Errorf("stderr is %d lines, want one line starting with \"error: \": %q", len(lines), stderr)
	}
	if !strings.Contains(stderr, want) {
		tb.Errorf("stderr %q does not name %q", stderr, want)
	}
}
