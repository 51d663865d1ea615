package version_test

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/restow/restow/internal/version"
)

// TestMakeBuildStampsBothBinaries builds the manager and the plugin as
// `make build` does, with a VERSION and GIT_COMMIT of the test's, and finds
// that one version string in what each binary says of itself: the -X paths
// in the Makefile's LDFLAGS are the ones this package reads.
func TestMakeBuildStampsBothBinaries(t *testing.T) {
	const release, commit = "v9.8.7-stamp", "0123456789abcdef0123456789abcdef01234567"
	bin := t.TempDir()
	build := exec.CommandContext(t.Context(), "make", "-C", "../..", "--no-print-directory", "build",
		"LOCALBIN="+bin, "VERSION="+release, "GIT_COMMIT="+commit)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}

	manager, err := exec.CommandContext(t.Context(), filepath.Join(bin, "manager"), "--version").Output()
	if err != nil {
		t.Fatalf("manager --version: %v", err)
	}
	if want := "restow manager " + release + " (commit " + commit + ")"; !strings.HasPrefix(string(manager), want) {
		t.Errorf("manager --version printed %q, want it to start with %q", manager, want)
	}

	plugin, err := exec.CommandContext(t.Context(), filepath.Join(bin, "kubectl-restow"), "version", "-o", "json").Output()
	if err != nil {
		t.Fatalf("kubectl-restow version -o json: %v", err)
	}
	var info version.Info
	if err := json.Unmarshal(plugin, &info); err != nil {
		t.Fatalf("kubectl-restow version -o json printed %q: %v", plugin, err)
	}
	if info.Version != release || info.GitCommit != commit {
		t.Errorf("kubectl-restow version -o json = %+v, want version %s and commit %s", info, release, commit)
	}
}
