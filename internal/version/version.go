// Package version owns restow's version string: the one value stamped into
// the manager, the kubectl plugin, the image reference of the manifests and
// the restow_build_info metric at build time.
package version

import (
	"runtime"
	"runtime/debug"
)

// Version is set at build time by the Makefile:
//
//	-ldflags "-X github.com/restow/restow/internal/version.Version=$(VERSION)"
//
// A binary built without it (go run, go test) reports the Go module
// version, or "devel" with the source revision.
var Version = ""

// Commit is the source revision, set at build time as Version is. A build
// without it reports the revision Go recorded, if it recorded one (not
// with -buildvcs=false, nor in a container build without .git).
var Commit = ""

// Info is what a binary knows of its build.
type Info struct {
	// Version is the release, e.g. v0.1.0, or devel+<revision> for an
	// unstamped build.
	Version string `json:"version"`
	// GitCommit is the source revision, when the build recorded it.
	GitCommit string `json:"gitCommit,omitempty"`
	// GoVersion is the Go toolchain the binary was built with.
	GoVersion string `json:"goVersion"`
	// Platform is GOOS/GOARCH.
	Platform string `json:"platform"`
}

// Get returns this binary's build information.
func Get() Info {
	info := Info{Version: Version, GitCommit: Commit, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	build, ok := debug.ReadBuildInfo()
	if ok && info.GitCommit == "" {
		for _, s := range build.Settings {
			if s.Key == "vcs.revision" {
				info.GitCommit = s.Value
			}
		}
	}
	if info.Version == "" {
		info.Version = unstamped(build, ok, info.GitCommit)
	}
	return info
}

// unstamped names a build that was not given a version: the module's own
// version when it was installed from a tag (go install ...@v0.1.0), else
// devel and the revision.
func unstamped(build *debug.BuildInfo, ok bool, commit string) string {
	if ok && build.Main.Version != "" && build.Main.Version != "(devel)" {
		return build.Main.Version
	}
	if len(commit) > 12 {
		commit = commit[:12]
	}
	if commit == "" {
		return "devel"
	}
	return "devel+" + commit
}

// String is the one-line form both binaries print for --version.
func (i Info) String() string {
	s := i.Version
	if i.GitCommit != "" {
		s += " (commit " + i.GitCommit + ")"
	}
	return s + ", " + i.GoVersion + ", " + i.Platform
}
