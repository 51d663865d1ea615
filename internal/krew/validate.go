package krew

import (
	"errors"
	"fmt"
	"path"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/util/version"
)

// The rules below are krew v0.4.4's: internal/index/validation.ValidatePlugin
// and what cmd/validate-krew-manifest adds (every platform matches one krew
// knows, none overlaps another, the install leaves a license). krew-index
// runs them on every manifest; `kubectl krew install` runs ValidatePlugin on
// a custom index's manifests too and refuses the plugin when one fails.

var (
	safePluginName = regexp.MustCompile(`^[\w-]+$`)
	validSHA256    = regexp.MustCompile(`^[a-f0-9]{64}$`)
)

// krewPlatforms are the os/arch pairs krew's manifest validation knows.
var krewPlatforms = []OSArch{
	{"windows", "386"}, {"windows", "amd64"}, {"windows", "arm64"},
	{"linux", "386"}, {"linux", "amd64"}, {"linux", "arm"}, {"linux", "arm64"}, {"linux", "ppc64le"},
	{"darwin", "386"}, {"darwin", "amd64"}, {"darwin", "arm64"},
}

// Validate checks a manifest as krew does before installing from it; name is
// the manifest's file name without .yaml.
func Validate(name string, p Plugin) error {
	if p.APIVersion != APIVersion {
		return fmt.Errorf("apiVersion %q: krew reads only %q", p.APIVersion, APIVersion)
	}
	if p.Kind != Kind {
		return fmt.Errorf("kind %q: want %q", p.Kind, Kind)
	}
	if !safePluginName.MatchString(name) {
		return fmt.Errorf("plugin name %q: must match %s", name, safePluginName)
	}
	if p.Metadata.Name != name {
		return fmt.Errorf("metadata.name %q: krew wants the file's name, %q", p.Metadata.Name, name)
	}
	if p.Spec.ShortDescription == "" || strings.ContainsAny(p.Spec.ShortDescription, "\r\n") {
		return errors.New("spec.shortDescription: want one non-empty line")
	}
	if err := validateVersion(p.Spec.Version); err != nil {
		return err
	}
	if len(p.Spec.Platforms) == 0 {
		return errors.New("spec.platforms: want at least one")
	}
	for i, pl := range p.Spec.Platforms {
		if err := validatePlatform(pl); err != nil {
			return fmt.Errorf("spec.platforms[%d]: %w", i, err)
		}
	}
	return validateSelectors(p.Spec.Platforms)
}

// validateVersion: krew compares versions to offer upgrades, and parses them
// as semver with a leading v.
func validateVersion(v string) error {
	if !strings.HasPrefix(v, "v") {
		return fmt.Errorf("spec.version %q: krew wants a leading v", v)
	}
	if _, err := version.ParseSemantic(v); err != nil {
		return fmt.Errorf("spec.version %q: %w", v, err)
	}
	return nil
}

func validatePlatform(p Platform) error {
	switch {
	case p.URI == "":
		return errors.New("uri is empty")
	case !validSHA256.MatchString(p.Sha256):
		return fmt.Errorf("sha256 %q: want 64 lower-case hex digits", p.Sha256)
	case p.Bin == "":
		return errors.New("bin is empty")
	}
	for j, op := range p.Files {
		if op.From == "" || op.To == "" {
			return fmt.Errorf("files[%d]: want both from and to", j)
		}
	}
	if len(p.Selector.MatchLabels) == 0 {
		return errors.New("selector.matchLabels is empty")
	}
	for k := range p.Selector.MatchLabels {
		if k != "os" && k != "arch" {
			return fmt.Errorf("selector key %q: krew matches only os and arch", k)
		}
	}
	return nil
}

// validateSelectors: a platform no one runs on is a mistake, and two that
// match the same machine leave krew to pick one.
func validateSelectors(platforms []Platform) error {
	for i, p := range platforms {
		if !matchesAny(p.Selector) {
			return fmt.Errorf("spec.platforms[%d]: selector %v matches no platform krew knows", i, p.Selector.MatchLabels)
		}
	}
	for _, env := range krewPlatforms {
		var matched []int
		for i, p := range platforms {
			if p.Selector.matches(env) {
				matched = append(matched, i)
			}
		}
		if len(matched) > 1 {
			return fmt.Errorf("spec.platforms %v all select %s", matched, env)
		}
	}
	return nil
}

func matchesAny(s Selector) bool {
	for _, env := range krewPlatforms {
		if s.matches(env) {
			return true
		}
	}
	return false
}

func (s Selector) matches(env OSArch) bool {
	labels := map[string]string{"os": env.OS, "arch": env.Arch}
	for k, v := range s.MatchLabels {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// CheckArchive checks a platform against its archive as `kubectl krew
// install` would find it: the checksum matches, every files[].from matches
// something in the archive, and the install directory ends up with bin (an
// executable, where the archive records modes) and a license.
func CheckArchive(p Platform, archive string) error {
	sum, err := SHA256(archive)
	if err != nil {
		return err
	}
	if sum != p.Sha256 {
		return fmt.Errorf("%s: sha256 %s, the manifest says %s", archive, sum, p.Sha256)
	}
	entries, err := List(archive)
	if err != nil {
		return err
	}
	installed, err := install(p.Files, entries)
	if err != nil {
		return fmt.Errorf("%s: %w", archive, err)
	}
	bin, ok := installed[path.Clean(p.Bin)]
	if !ok {
		return fmt.Errorf("%s: bin %s is not installed by files %v", archive, p.Bin, p.Files)
	}
	if !strings.HasSuffix(archive, zipExt) && bin.Mode&0o111 == 0 {
		return fmt.Errorf("%s: bin %s is not executable (mode %v)", archive, p.Bin, bin.Mode)
	}
	if _, ok := installed[License]; !ok {
		return fmt.Errorf("%s: files %v install no %s", archive, p.Files, License)
	}
	return nil
}

// install models krew's file operations for what this manifest uses: each
// from is a glob over the archive's paths, and what it matches lands in the
// directory to under its base name. Like krew, it defaults to copying
// everything when files is unset.
func install(ops []FileOperation, entries []Entry) (map[string]Entry, error) {
	if len(ops) == 0 {
		ops = []FileOperation{{From: "*", To: "."}}
	}
	installed := map[string]Entry{}
	for i, op := range ops {
		matched := false
		for _, e := range entries {
			ok, err := path.Match(op.From, e.Name)
			if err != nil {
				return nil, fmt.Errorf("files[%d].from %q: %w", i, op.From, err)
			}
			if ok {
				matched = true
				installed[path.Join(op.To, path.Base(e.Name))] = e
			}
		}
		if !matched {
			return nil, fmt.Errorf("files[%d].from %q matches nothing in the archive", i, op.From)
		}
	}
	return installed, nil
}
