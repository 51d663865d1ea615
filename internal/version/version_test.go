package version

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestGetReportsTheStampedVersion(t *testing.T) {
	oldVersion, oldCommit := Version, Commit
	t.Cleanup(func() { Version, Commit = oldVersion, oldCommit })
	Version, Commit = "v1.2.3", "0123abcd"
	info := Get()
	if info.Version != "v1.2.3" || info.GitCommit != "0123abcd" {
		t.Errorf("Get() = %+v, want the stamped v1.2.3 and commit 0123abcd", info)
	}
	if !strings.HasPrefix(info.String(), "v1.2.3") || !strings.Contains(info.String(), info.Platform) {
		t.Errorf("String() = %q, want the version first and the platform", info.String())
	}
}

func TestUnstampedBuilds(t *testing.T) {
	for _, tc := range []struct {
		name   string
		build  *debug.BuildInfo
		ok     bool
		commit string
		want   string
	}{
		{"go install from a tag", &debug.BuildInfo{Main: debug.Module{Version: "v0.2.0"}}, true, "abc", "v0.2.0"},
		{"no module version (-buildvcs=false), a revision stamped", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, true, "0123456789abcdef0123", "devel+0123456789ab"},
		{"no build information", nil, false, "", "devel"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := unstamped(tc.build, tc.ok, tc.commit); got != tc.want {
				t.Errorf("unstamped = %q, want %q", got, tc.want)
			}
		})
	}
}
