package doccheck

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestChangelog holds CHANGELOG.md to the repository's tags: it opens with
// an Unreleased section, every tag vX.Y.Z has a section of its own, newest
// first, and every section's entries sit under one of the kinds Artifact
// Hub shows.
func TestChangelog(t *testing.T) {
	raw, err := os.ReadFile("../../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	var sections, kinds []string
	for line := range strings.Lines(string(raw)) {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "## "):
			sections = append(sections, strings.Fields(strings.TrimPrefix(line, "## "))[0])
		case strings.HasPrefix(line, "### "):
			kinds = append(kinds, strings.TrimPrefix(line, "### "))
		}
	}
	if len(sections) == 0 || sections[0] != "Unreleased" {
		t.Fatalf("CHANGELOG.md's sections are %v; the first must be Unreleased", sections)
	}
	for _, k := range kinds {
		if !slices.Contains([]string{"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, k) {
			t.Errorf("CHANGELOG.md has a section of kind %q, not one Artifact Hub shows", k)
		}
	}
	out, err := exec.Command("git", "tag", "--list", "v*", "--sort=-v:refname").Output()
	if err != nil {
		t.Fatalf("git tag: %v", err)
	}
	release := regexp.MustCompile(`^v\d+\.\d+\.\d+$`)
	var tags []string
	for _, tag := range strings.Fields(string(out)) {
		if release.MatchString(tag) {
			tags = append(tags, tag)
		}
	}
	if got := sections[1:]; !slices.Equal(got, tags) {
		t.Errorf("CHANGELOG.md has sections %v after Unreleased; the repository's release tags, newest first, are %v", got, tags)
	}
}
