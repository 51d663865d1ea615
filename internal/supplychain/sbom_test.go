package supplychain_test

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// bom is the part of a CycloneDX JSON document the test reads.
type bom struct {
	BOMFormat    string `json:"bomFormat"`
	SpecVersion  string `json:"specVersion"`
	SerialNumber string `json:"serialNumber"`
	Metadata     struct {
		Timestamp string    `json:"timestamp"`
		Component component `json:"component"`
	} `json:"metadata"`
	Components []component `json:"components"`
}

type component struct {
	Type       string `json:"type"`
	Name       string `json:"name"`
	Version    string `json:"version"`
	PURL       string `json:"purl"`
	Properties []struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	} `json:"properties"`
}

func (c component) property(name string) string {
	for _, p := range c.Properties {
		if p.Name == name {
			return p.Value
		}
	}
	return ""
}

// TestSBOMListsTheModulesOfEachBinary runs make sbom, as the release
// workflow runs make sbom-dist with the same tool and flags, and holds each
// SBOM to what Go builds the binary from: the module and main package, the
// platform, and every module the binary's packages come from, at the
// version Go selects, nothing more. k8s.io/client-go and
// sigs.k8s.io/controller-runtime must be there at go.mod's versions.
func TestSBOMListsTheModulesOfEachBinary(t *testing.T) {
	cyclonedx := tool(t, "CYCLONEDX_GOMOD")
	dir := t.TempDir()
	if out, err := command(t, repoRoot, nil, "make", "--no-print-directory", "sbom",
		"SBOM_DIR="+dir, "CYCLONEDX_GOMOD="+cyclonedx,
		"GOOS="+runtime.GOOS, "GOARCH="+runtime.GOARCH); err != nil {
		t.Fatalf("make sbom: %v\n%s", err, out)
	}
	required := goModRequires(t)
	for _, binary := range []string{"manager", "kubectl-restow"} {
		t.Run(binary, func(t *testing.T) {
			b := readBOM(t, filepath.Join(dir, binary+".cdx.json"))
			if b.BOMFormat != "CycloneDX" || b.SpecVersion != "1.6" {
				t.Errorf("bomFormat %q, specVersion %q; want CycloneDX 1.6", b.BOMFormat, b.SpecVersion)
			}
			// The same commit must give the same file.
			if b.SerialNumber != "" || b.Metadata.Timestamp != "" {
				t.Errorf("serialNumber %q, timestamp %q; want neither", b.SerialNumber, b.Metadata.Timestamp)
			}

			main := b.Metadata.Component
			if main.Type != "application" || main.Name != "github.com/restow/restow" || !strings.HasSuffix(main.PURL, "#cmd/"+binary) {
				t.Errorf("metadata.component: %s %s (%s); want the application github.com/restow/restow, purl ending #cmd/%s", main.Type, main.Name, main.PURL, binary)
			}
			for name, want := range map[string]string{
				"cdx:gomod:build:env:GOOS":        runtime.GOOS,
				"cdx:gomod:build:env:GOARCH":      runtime.GOARCH,
				"cdx:gomod:build:env:CGO_ENABLED": "0",
			} {
				if got := main.property(name); got != want {
					t.Errorf("metadata.component property %s = %q, want %q", name, got, want)
				}
			}

			listed := map[string]string{}
			for _, c := range b.Components {
				if prev, dup := listed[c.Name]; dup {
					t.Errorf("%s listed twice, at %s and %s", c.Name, prev, c.Version)
				}
				listed[c.Name] = c.Version
			}
			built := builtFrom(t, "./cmd/"+binary)
			for _, path := range sortedKeys(built) {
				if got, ok := listed[path]; !ok {
					t.Errorf("%s %s: the binary is built from it, the SBOM does not list it", path, built[path])
				} else if got != built[path] {
					t.Errorf("%s: the SBOM says %s, Go builds %s", path, got, built[path])
				}
			}
			for _, path := range sortedKeys(listed) {
				if _, ok := built[path]; !ok {
					t.Errorf("%s %s: listed, but no package of the binary comes from it", path, listed[path])
				}
			}
			for _, path := range []string{"k8s.io/client-go", "sigs.k8s.io/controller-runtime"} {
				if want := required[path]; want == "" || listed[path] != want {
					t.Errorf("%s: the SBOM says %q, go.mod requires %q", path, listed[path], want)
				}
			}
		})
	}
}

func readBOM(t *testing.T, file string) bom {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var b bom
	if err := json.Unmarshal(data, &b); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return b
}

// builtFrom is the modules Go builds pkg's binary from, for this platform
// with cgo off as the release builds it: path to selected version.
func builtFrom(t *testing.T, pkg string) map[string]string {
	t.Helper()
	out, err := command(t, repoRoot, []string{"CGO_ENABLED=0"}, "go", "list", "-deps",
		"-f", "{{with .Module}}{{if not .Main}}{{.Path}} {{with .Replace}}{{.Version}}{{else}}{{.Version}}{{end}}{{end}}{{end}}", pkg)
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
	}
	modules := map[string]string{}
	for line := range strings.Lines(out) {
		if path, version, ok := strings.Cut(strings.TrimSpace(line), " "); ok {
			modules[path] = version
		}
	}
	if len(modules) == 0 {
		t.Fatalf("go list -deps %s lists no modules", pkg)
	}
	return modules
}

// goModRequires is go.mod's require directives: path to version.
func goModRequires(t *testing.T) map[string]string {
	t.Helper()
	out, err := command(t, repoRoot, nil, "go", "mod", "edit", "-json")
	if err != nil {
		t.Fatalf("go mod edit -json: %v\n%s", err, out)
	}
	var mod struct {
		Require []struct{ Path, Version string }
	}
	if err := json.Unmarshal([]byte(out), &mod); err != nil {
		t.Fatal(err)
	}
	required := map[string]string{}
	for _, r := range mod.Require {
		required[r.Path] = r.Version
	}
	return required
}

func sortedKeys(m map[string]string) []string {
	return slices.Sorted(maps.Keys(m))
}
