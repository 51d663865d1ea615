package krew

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

const testVersion = "v1.2.3"

var releasePlatforms = []OSArch{
	{"linux", "amd64"}, {"linux", "arm64"},
	{"darwin", "amd64"}, {"darwin", "arm64"},
	{"windows", "amd64"}, {"windows", "arm64"},
}

// fakeRelease packs a tiny fake binary per platform and a license, as make
// dist does with the real ones, into a fresh directory.
func fakeRelease(t *testing.T, platforms []OSArch) (dir string, archives []string) {
	t.Helper()
	dir = t.TempDir()
	license := writeFile(t, filepath.Join(dir, "src", "LICENSE"), "Apache License 2.0\n")
	binaries := map[OSArch]string{}
	for _, p := range platforms {
		binaries[p] = writeFile(t, filepath.Join(dir, "src", p.OS+"_"+p.Arch, BinaryName(p.OS)), "binary for "+p.String())
	}
	archives, err := PackPlatforms(dir, testVersion, license, binaries)
	if err != nil {
		t.Fatalf("PackPlatforms: %v", err)
	}
	return dir, archives
}

func writeFile(t *testing.T, file, content string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
	return file
}

func sha256Of(t *testing.T, file string) string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// readManifest reads the manifest back as krew would, refusing fields the
// types do not know: a misspelt key would be silently ignored by krew.
func readManifest(t *testing.T, file string) Plugin {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var p Plugin
	if err := yaml.UnmarshalStrict(data, &p); err != nil {
		t.Fatalf("reading %s: %v", file, err)
	}
	return p
}

func TestManifestInstallsOnEveryReleasedPlatform(t *testing.T) {
	dir, archives := fakeRelease(t, releasePlatforms)
	file := filepath.Join(dir, "plugins", "restow.yaml")
	if _, err := WriteManifest(file, testVersion, archives); err != nil {
		t.Fatalf("WriteManifest: %v", err)
	}
	p := readManifest(t, file)

	if err := Validate("restow", p); err != nil {
		t.Errorf("krew's validation refuses the manifest: %v", err)
	}
	if p.Metadata.Name != "restow" || p.Spec.Version != testVersion {
		t.Errorf("metadata.name %q, spec.version %q: want restow, %s", p.Metadata.Name, p.Spec.Version, testVersion)
	}
	if len(p.Spec.Platforms) != len(releasePlatforms) {
		t.Fatalf("%d platforms, want %d", len(p.Spec.Platforms), len(releasePlatforms))
	}
	for _, want := range releasePlatforms {
		t.Run(want.String(), func(t *testing.T) {
			pl := platformSelecting(t, p, want)
			archive := filepath.Join(dir, ArchiveName(testVersion, want))
			wantURI := "https://github.com/restow/restow/releases/download/v1.2.3/" + filepath.Base(archive)
			if pl.URI != wantURI {
				t.Errorf("uri %s, want %s", pl.URI, wantURI)
			}
			if got := sha256Of(t, archive); pl.Sha256 != got {
				t.Errorf("sha256 %s, the archive's is %s", pl.Sha256, got)
			}
			if err := CheckArchive(pl, archive); err != nil {
				t.Errorf("krew install would fail: %v", err)
			}
		})
	}
}

// platformSelecting returns the one platform krew picks on env.
func platformSelecting(t *testing.T, p Plugin, env OSArch) Platform {
	t.Helper()
	var found []Platform
	for _, pl := range p.Spec.Platforms {
		if pl.Selector.matches(env) {
			found = append(found, pl)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d platforms select %s, want exactly one", len(found), env)
	}
	return found[0]
}

func TestWindowsGetsAZipWithAnExe(t *testing.T) {
	windows := OSArch{"windows", "amd64"}
	dir, archives := fakeRelease(t, []OSArch{windows})
	p, err := WriteManifest(filepath.Join(dir, "restow.yaml"), testVersion, archives)
	if err != nil {
		t.Fatal(err)
	}
	pl := p.Spec.Platforms[0]
	if !strings.HasSuffix(pl.URI, "_windows_amd64.zip") || pl.Bin != "kubectl-restow.exe" {
		t.Errorf("uri %s, bin %s: want a .zip and kubectl-restow.exe (Windows runs only .exe from PATH)", pl.URI, pl.Bin)
	}
	entries, err := List(archives[0])
	if err != nil {
		t.Fatal(err)
	}
	if names := entryNames(entries); names != "LICENSE kubectl-restow.exe" {
		t.Errorf("archive holds %q, want LICENSE kubectl-restow.exe", names)
	}
}

func entryNames(entries []Entry) string {
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name)
	}
	return strings.Join(names, " ")
}

func TestTarballHoldsAnExecutableBinaryAndTheLicense(t *testing.T) {
	_, archives := fakeRelease(t, []OSArch{{"linux", "arm64"}})
	entries, err := List(archives[0])
	if err != nil {
		t.Fatal(err)
	}
	if names := entryNames(entries); names != "LICENSE kubectl-restow" {
		t.Fatalf("archive holds %q, want LICENSE kubectl-restow", names)
	}
	if mode := entries[1].Mode.Perm(); mode != 0o755 {
		t.Errorf("kubectl-restow has mode %v, want 0755: kubectl runs only executables", mode)
	}
}

// Users and reviewers rebuild a release to compare checksums: the same
// files must give the same bytes.
func TestArchivesAreReproducible(t *testing.T) {
	dir := t.TempDir()
	bin := writeFile(t, filepath.Join(dir, "kubectl-restow"), "binary")
	license := writeFile(t, filepath.Join(dir, "LICENSE"), "license")
	for _, ext := range []string{".tar.gz", ".zip"} {
		first, second := filepath.Join(dir, "first"+ext), filepath.Join(dir, "second"+ext)
		files := []File{{Name: "kubectl-restow", Source: bin, Executable: true}, {Name: "LICENSE", Source: license}}
		if err := Pack(first, files); err != nil {
			t.Fatal(err)
		}
		// Touch the inputs between the two: their times must not matter.
		if err := os.Chtimes(bin, modTime, modTime); err != nil {
			t.Fatal(err)
		}
		if err := Pack(second, []File{files[1], files[0]}); err != nil {
			t.Fatal(err)
		}
		if a, b := sha256Of(t, first), sha256Of(t, second); a != b {
			t.Errorf("%s: two packs of the same files differ (%s, %s)", ext, a, b)
		}
	}
}

func TestChecksumsReadBySha256sum(t *testing.T) {
	dir, archives := fakeRelease(t, releasePlatforms[:2])
	file := filepath.Join(dir, "checksums.txt")
	if err := WriteChecksumsFile(file, archives); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, a := range archives {
		want[filepath.Base(a)] = sha256Of(t, a)
	}
	lines := bufio.NewScanner(bytes.NewReader(data))
	for lines.Scan() {
		// sha256sum --check reads "<hex><space><space><name>".
		sum, name, ok := strings.Cut(lines.Text(), "  ")
		if !ok || want[name] != sum {
			t.Errorf("line %q: want %q's sha256 and its name after two spaces", lines.Text(), name)
		}
		delete(want, name)
	}
	if len(want) != 0 {
		t.Errorf("checksums.txt misses %v", want)
	}
}

func TestWriteManifestRefusesWhatKrewCannotInstall(t *testing.T) {
	dir := t.TempDir()
	license := writeFile(t, filepath.Join(dir, "LICENSE"), "license")
	notTheBinary := writeFile(t, filepath.Join(dir, "kubectl-other"), "binary")
	linux := OSArch{"linux", "amd64"}
	withoutBinary := filepath.Join(dir, ArchiveName(testVersion, linux))
	if err := Pack(withoutBinary, []File{{Name: "kubectl-other", Source: notTheBinary, Executable: true}, {Name: "LICENSE", Source: license}}); err != nil {
		t.Fatal(err)
	}
	strayName := writeFile(t, filepath.Join(dir, "restow_linux_amd64.tar.gz"), "")

	for _, tc := range []struct {
		name     string
		version  string
		archives []string
		file     string
	}{
		{"an archive without the binary", testVersion, []string{withoutBinary}, "restow.yaml"},
		{"a version krew cannot compare", "1.2.3", []string{withoutBinary}, "restow.yaml"},
		{"an archive named for no platform", testVersion, []string{strayName}, "restow.yaml"},
		{"a file name that is not the plugin's", testVersion, []string{withoutBinary}, "kubectl-restow.yaml"},
		{"no archives", testVersion, nil, "restow.yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), tc.file)
			if _, err := WriteManifest(out, tc.version, tc.archives); err == nil {
				t.Fatal("WriteManifest succeeded, want an error")
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Errorf("%s was written anyway", out)
			}
		})
	}
}

func TestValidateCatchesWhatKrewRefuses(t *testing.T) {
	valid := func() Plugin {
		return Plugin{
			APIVersion: APIVersion, Kind: Kind, Metadata: Metadata{Name: "restow"},
			Spec: PluginSpec{Version: "v0.1.0", ShortDescription: "short", Platforms: []Platform{
				{Selector: Selector{MatchLabels: map[string]string{"os": "linux", "arch": "amd64"}}, URI: "https://x/a.tar.gz", Sha256: strings.Repeat("a", 64), Bin: "kubectl-restow"},
				{Selector: Selector{MatchLabels: map[string]string{"os": "darwin"}}, URI: "https://x/b.tar.gz", Sha256: strings.Repeat("b", 64), Bin: "kubectl-restow"},
			}},
		}
	}
	if err := Validate("restow", valid()); err != nil {
		t.Fatalf("the valid manifest is refused: %v", err)
	}
	for _, tc := range []struct {
		name  string
		spoil func(p *Plugin)
	}{
		{"another apiVersion", func(p *Plugin) { p.APIVersion = "krew.googlecontainertools.github.com/v1alpha1" }},
		{"name unlike the file", func(p *Plugin) { p.Metadata.Name = "kubectl-restow" }},
		{"two-line short description", func(p *Plugin) { p.Spec.ShortDescription = "one\ntwo" }},
		{"a pre-release that is not semver", func(p *Plugin) { p.Spec.Version = "v0.1" }},
		{"no platforms", func(p *Plugin) { p.Spec.Platforms = nil }},
		{"no sha256", func(p *Plugin) { p.Spec.Platforms[0].Sha256 = "" }},
		{"upper-case sha256", func(p *Plugin) { p.Spec.Platforms[0].Sha256 = strings.Repeat("A", 64) }},
		{"no uri", func(p *Plugin) { p.Spec.Platforms[0].URI = "" }},
		{"no bin", func(p *Plugin) { p.Spec.Platforms[0].Bin = "" }},
		{"a selector key krew ignores", func(p *Plugin) { p.Spec.Platforms[0].Selector.MatchLabels["distro"] = "debian" }},
		{"a platform no one runs", func(p *Plugin) { p.Spec.Platforms[0].Selector.MatchLabels["os"] = "plan9" }},
		{"two platforms for darwin/arm64", func(p *Plugin) { p.Spec.Platforms[0].Selector.MatchLabels = map[string]string{"arch": "arm64"} }},
		{"a file operation without to", func(p *Plugin) { p.Spec.Platforms[0].Files = []FileOperation{{From: "x"}} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := valid()
			tc.spoil(&p)
			if err := Validate("restow", p); err == nil {
				t.Error("Validate accepted it, krew would not")
			}
		})
	}
}

func TestCheckArchiveCatchesAWrongChecksum(t *testing.T) {
	dir, archives := fakeRelease(t, releasePlatforms[:1])
	p, err := WriteManifest(filepath.Join(dir, "restow.yaml"), testVersion, archives)
	if err != nil {
		t.Fatal(err)
	}
	// A rebuild after the manifest was written: krew would refuse to install.
	if err := os.WriteFile(archives[0], []byte("rebuilt"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := CheckArchive(p.Spec.Platforms[0], archives[0]); err == nil {
		t.Error("CheckArchive accepted an archive whose sha256 is not the manifest's")
	}
}
