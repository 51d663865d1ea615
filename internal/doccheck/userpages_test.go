package doccheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// developerPages are the pages of docs/ written for whoever works on restow,
// where test names, commits, dates and measured runs belong (with the
// command that produced each figure); every other page is a user's.
var developerPages = map[string]bool{
	"benchmarks.md":    true,
	"development.md":   true,
	"release.md":       true,
	"api-reference.md": true,
}

// userPages are the README and every page of docs/ (the generated CLI
// reference included) but developerPages.
func userPages(t *testing.T) []string {
	t.Helper()
	pages := []string{"../../README.md"}
	err := filepath.WalkDir("../../docs", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(path) != ".md" {
			return err
		}
		if filepath.Dir(path) == filepath.Clean("../../docs") && developerPages[d.Name()] {
			return nil
		}
		pages = append(pages, path)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pages
}

var (
	// testName is a Go test function's name.
	testName = regexp.MustCompile(`\bTest[A-Z]\w+`)
	// hexWord may be a commit hash: 7 to 40 hex digits with a digit and a
	// letter among them; those inside a URL (a citation of another
	// project's commit) and digests after "sha256:" are not.
	hexWord = regexp.MustCompile(`(sha256:|[/=])?\b[0-9a-f]{7,40}\b`)
	// date is an ISO date, as runs were dated.
	date = regexp.MustCompile(`\b20\d\d-\d\d-\d\d\b`)
	// ipv4 is an address; user pages may show loopback and the range
	// reserved for documentation (192.0.2.0/24) only, never a test's.
	ipv4 = regexp.MustCompile(`\b(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})\b`)
	// runFigure is how a run's result was written down.
	runFigure = regexp.MustCompile(`(?i)\b(passed|green) in \d|\brun of [0-9a-f]{7}|\b\d{4} run\b|\bthis project's machines\b`)
)

// TestUserPagesHoldNoTestRecords: a user page says what restow does and
// how to use it; which test proves it, on which commit, when and in how
// many seconds is development.md's and benchmarks.md's, so that user pages
// never go stale with a run. It fails on test names, commit hashes, dates,
// addresses of the tests' control planes and run figures.
func TestUserPagesHoldNoTestRecords(t *testing.T) {
	for _, page := range userPages(t) {
		raw, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(raw), "\n") {
			for _, found := range findTestRecords(line) {
				t.Errorf("%s:%d: %s: move it to docs/development.md or docs/benchmarks.md", page, i+1, found)
			}
		}
	}
}

// findTestRecords says what line holds that a user page must not.
func findTestRecords(line string) []string {
	var found []string
	for _, m := range testName.FindAllString(line, -1) {
		found = append(found, "a test's name, "+m)
	}
	for _, m := range hexWord.FindAllStringSubmatch(line, -1) {
		word := strings.TrimPrefix(strings.TrimPrefix(m[0], "/"), "=")
		if m[1] != "" || strings.Contains(line, "://") && strings.Contains(line, "/"+word) {
			continue
		}
		if strings.ContainsAny(word, "0123456789") && strings.ContainsAny(word, "abcdef") {
			found = append(found, "a commit hash, "+word)
		}
	}
	for _, m := range date.FindAllString(line, -1) {
		found = append(found, "a date, "+m)
	}
	for _, m := range ipv4.FindAllStringSubmatch(line, -1) {
		if m[0] == "127.0.0.1" || m[0] == "0.0.0.0" || m[1]+"."+m[2]+"."+m[3] == "192.0.2" {
			continue
		}
		found = append(found, "an address, "+m[0])
	}
	for _, m := range runFigure.FindAllString(line, -1) {
		found = append(found, "a run's figure, "+m)
	}
	return found
}
