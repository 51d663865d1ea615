// Package krew owns the kubectl plugin's release artifacts as krew and a
// user installing by hand see them: the per-platform archives
// (kubectl-restow_<version>_<os>_<arch>.tar.gz, .zip on Windows), their
// sha256 checksums, and the krew Plugin manifest that points at them, with
// the checks krew's own index validation makes before it accepts one.
//
// The types mirror sigs.k8s.io/krew/pkg/index rather than import it: that
// module requires k8s.io/client-go v11.0.0+incompatible, which outranks every
// real client-go release, and its validation is in an internal package.
package krew

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// What krew and the release know the plugin by.
const (
	APIVersion = "krew.googlecontainertools.github.com/v1alpha2"
	Kind       = "Plugin"
	// PluginName is the name in `kubectl krew install restow` and the
	// manifest's file name, plugins/restow.yaml.
	PluginName = "restow"
	// Binary is the executable kubectl finds on PATH as `kubectl restow`.
	Binary   = "kubectl-restow"
	Homepage = "https://github.com/restow/restow"
	// ReleasesURL is where GitHub serves a release's assets:
	// <ReleasesURL>/<tag>/<asset>.
	ReleasesURL      = Homepage + "/releases/download"
	License          = "LICENSE"
	shortDescription = "Re-store custom resources at their storage version"
	description      = `kubectl restow shows which CustomResourceDefinitions still have objects
stored in etcd at an old API version (plan, with a CI gate), and migrates
them so the old version can be removed from status.storedVersions and then
from the CRD: through the restow operator (migrate --wait, status -w) or
in-process without any operator (run).
`
	caveats = `migrate and status need the restow operator in the cluster; plan and run
do not. Installing the operator: https://github.com/restow/restow/blob/main/docs/install.md
`
)

// Plugin is krew's plugin manifest (krew's pkg/index.Plugin).
type Plugin struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   Metadata   `json:"metadata"`
	Spec       PluginSpec `json:"spec"`
}

// Metadata is the part of ObjectMeta krew reads.
type Metadata struct {
	Name string `json:"name"`
}

// PluginSpec describes the plugin and where each platform's archive is.
type PluginSpec struct {
	Version          string     `json:"version"`
	Homepage         string     `json:"homepage,omitempty"`
	ShortDescription string     `json:"shortDescription"`
	Description      string     `json:"description,omitempty"`
	Caveats          string     `json:"caveats,omitempty"`
	Platforms        []Platform `json:"platforms"`
}

// Platform is one os/arch's archive and what krew installs from it.
type Platform struct {
	Selector Selector `json:"selector"`
	URI      string   `json:"uri"`
	Sha256   string   `json:"sha256"`
	// Bin is the executable's path in the installation directory, after
	// Files are copied into it.
	Bin   string          `json:"bin"`
	Files []FileOperation `json:"files,omitempty"`
}

// Selector is the label selector krew matches against {os, arch}.
type Selector struct {
	MatchLabels map[string]string `json:"matchLabels,omitempty"`
}

// FileOperation copies what From matches in the extracted archive (a glob)
// to To in the installation directory.
type FileOperation struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// OSArch is a platform as Go and krew name it.
type OSArch struct {
	OS   string
	Arch string
}

// String is the os/arch form Go and kubectl use, e.g. linux/amd64.
func (p OSArch) String() string { return p.OS + "/" + p.Arch }

// BinaryName is the plugin's executable on a platform: Windows finds only
// .exe files on PATH.
func BinaryName(goos string) string {
	if goos == "windows" {
		return Binary + ".exe"
	}
	return Binary
}

// ArchiveName is the release asset holding a platform's plugin binary and
// the license.
func ArchiveName(version string, p OSArch) string {
	ext := tarGz
	if p.OS == "windows" {
		ext = zipExt
	}
	return fmt.Sprintf("%s_%s_%s_%s%s", Binary, version, p.OS, p.Arch, ext)
}

// parseArchiveName reads the platform back from an ArchiveName. The version
// may hold anything but the separator; os and arch are the last two fields.
func parseArchiveName(version, name string) (OSArch, error) {
	prefix := Binary + "_" + version + "_"
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return OSArch{}, fmt.Errorf("archive %s: want a name starting with %s", name, prefix)
	}
	rest = strings.TrimSuffix(strings.TrimSuffix(rest, tarGz), zipExt)
	goos, arch, ok := strings.Cut(rest, "_")
	if !ok || goos == "" || arch == "" || strings.Contains(arch, "_") {
		return OSArch{}, fmt.Errorf("archive %s: want %s", name, ArchiveName(version, OSArch{"<os>", "<arch>"}))
	}
	p := OSArch{OS: goos, Arch: arch}
	if want := ArchiveName(version, p); name != want {
		return OSArch{}, fmt.Errorf("archive %s: want %s for %s", name, want, p)
	}
	return p, nil
}

// Manifest describes the release version of the plugin from its archives,
// one per platform, named by ArchiveName: each platform's URI is the
// archive's download address in the GitHub release of that tag, its sha256
// the archive's own.
func Manifest(version string, archives []string) (Plugin, error) {
	p := Plugin{
		APIVersion: APIVersion,
		Kind:       Kind,
		Metadata:   Metadata{Name: PluginName},
		Spec: PluginSpec{
			Version:          version,
			Homepage:         Homepage,
			ShortDescription: shortDescription,
			Description:      description,
			Caveats:          caveats,
		},
	}
	for _, archive := range archives {
		platform, err := platformFor(version, archive)
		if err != nil {
			return Plugin{}, err
		}
		p.Spec.Platforms = append(p.Spec.Platforms, platform)
	}
	// One order whatever the order of the arguments, so that the committed
	// manifest's diff from one release to the next shows only what changed.
	sort.Slice(p.Spec.Platforms, func(i, j int) bool {
		return p.Spec.Platforms[i].URI < p.Spec.Platforms[j].URI
	})
	return p, nil
}

func platformFor(version, archive string) (Platform, error) {
	name := filepath.Base(archive)
	osArch, err := parseArchiveName(version, name)
	if err != nil {
		return Platform{}, err
	}
	sum, err := SHA256(archive)
	if err != nil {
		return Platform{}, err
	}
	bin := BinaryName(osArch.OS)
	return Platform{
		Selector: Selector{MatchLabels: map[string]string{"os": osArch.OS, "arch": osArch.Arch}},
		URI:      ReleasesURL + "/" + version + "/" + name,
		Sha256:   sum,
		Bin:      bin,
		Files: []FileOperation{
			{From: bin, To: "."},
			{From: License, To: "."},
		},
	}, nil
}

// SHA256 is a file's sha256 in hex, as sha256sum prints it.
func SHA256(file string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("%s: %w", file, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// WriteChecksums writes one "<sha256>  <file name>" line per file, the
// format `sha256sum --check` reads in the directory that holds them.
func WriteChecksums(w io.Writer, files []string) error {
	sorted := append([]string(nil), files...)
	sort.Slice(sorted, func(i, j int) bool { return filepath.Base(sorted[i]) < filepath.Base(sorted[j]) })
	for _, file := range sorted {
		sum, err := SHA256(file)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "%s  %s\n", sum, filepath.Base(file)); err != nil {
			return err
		}
	}
	return nil
}
