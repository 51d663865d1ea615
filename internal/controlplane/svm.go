package controlplane

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
)

// withStorageVersionMigrations returns args with the flags that make the
// kube-apiserver of KUBEBUILDER_ASSETS serve storagemigration.k8s.io in
// every version it has past alpha (see Options.StorageVersionMigrations).
func withStorageVersionMigrations(args map[string]string) (map[string]string, error) {
	minor, err := APIServerMinor()
	if err != nil {
		return nil, err
	}
	out := maps.Clone(args)
	if out == nil {
		out = map[string]string{}
	}
	if minor < 35 {
		return out, nil
	}
	add := func(flag, value string) {
		if old := out[flag]; old != "" {
			value = old + "," + value
		}
		out[flag] = value
	}
	// GA and on by default from 1.37, where setting it only logs a warning.
	add("feature-gates", "StorageVersionMigrator=true")
	add("runtime-config", "storagemigration.k8s.io/v1beta1=true")
	return out, nil
}

var minorVersion = regexp.MustCompile(`v1\.(\d+)\.`)

// APIServerMinor is the minor version of the kube-apiserver in
// KUBEBUILDER_ASSETS, from its --version.
func APIServerMinor() (int, error) {
	bin := filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kube-apiserver")
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return 0, fmt.Errorf("reading the version of %s: %w", bin, err)
	}
	m := minorVersion.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("%s --version printed %q, not a version", bin, out)
	}
	return strconv.Atoi(string(m[1]))
}
