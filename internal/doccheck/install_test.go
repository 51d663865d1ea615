package doccheck

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestInstallSaysWhatItDoes: in every document that shows how to install
// the operator, the first install command comes after the line that says
// what installing restow does (it starts migrating every pending CRD by
// itself), so that no one runs one before reading it.
func TestInstallSaysWhatItDoes(t *testing.T) {
	install := regexp.MustCompile(`kubectl apply -f \S*install\.yaml|kubectl apply -k \S*config/default|helm (upgrade --)?install restow`)
	// The documents that give the install commands; any other that shows
	// one is held to the same rule.
	installing := []string{"../../docs/install.md", "../../charts/restow/README.md"}
	others, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	docs := slices.Clone(installing)
	for _, doc := range append(others, "../../README.md", "../../e2e/README.md", "../../CHANGELOG.md", "../../SECURITY.md") {
		if !slices.Contains(docs, doc) {
			docs = append(docs, doc)
		}
	}
	for _, doc := range docs {
		raw, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		text := string(raw)
		says := strings.Index(text, "What installing restow does")
		first := install.FindStringIndex(text)
		switch {
		case first == nil && slices.Contains(installing, doc):
			t.Errorf("%s shows no install command: drop it from this test", doc)
		case first == nil:
		case says < 0:
			t.Errorf("%s shows %q and never says what installing restow does", doc, text[first[0]:first[1]])
		case first[0] < says:
			line := strings.Count(text[:first[0]], "\n") + 1
			t.Errorf("%s:%d shows %q before it says what installing restow does (line %d)", doc, line, text[first[0]:first[1]], strings.Count(text[:says], "\n")+1)
		}
	}
}

// TestREADMEFirstCommandEarly: a reader of the README meets a command to
// run within its first 300 words, after what restow is, why, and when to
// use it rather than the in-tree controller.
func TestREADMEFirstCommandEarly(t *testing.T) {
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	first := strings.Index(text, "```sh")
	if first < 0 {
		t.Fatal("README.md shows no command")
	}
	if words := len(strings.Fields(text[:first])); words > 300 {
		t.Errorf("README.md's first command comes after %d words, more than 300", words)
	}
	for _, says := range []string{"**Why.**", "**restow or the in-tree StorageVersionMigration?**"} {
		if i := strings.Index(text, says); i < 0 || i > first {
			t.Errorf("README.md does not say %q before its first command", says)
		}
	}
}

// TestTestTimeAgrees: how long `make test` takes is measured in one place,
// docs/development.md; the README, CONTRIBUTING.md and the CI workflow link
// there and give no figure of their own, so that they never disagree again.
func TestTestTimeAgrees(t *testing.T) {
	duration := regexp.MustCompile(`\b\d+m\d+s\b`)
	for _, path := range []string{"../../README.md", "../../CONTRIBUTING.md", "../../.github/workflows/ci.yaml"} {
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := duration.FindAll(raw, -1); len(got) > 0 {
			t.Errorf("%s gives test times of its own (%s): give them in docs/development.md only", path, bytes.Join(got, []byte(", ")))
		}
		if !strings.Contains(string(raw), "development.md") {
			t.Errorf("%s does not point at docs/development.md for how long the tests take", path)
		}
	}
	dev, err := os.ReadFile("../../docs/development.md")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?s)The latest measured run:.{0,300}?green in \d+m\d+s`).Match(dev) {
		t.Error("docs/development.md no longer gives the latest measured run's time")
	}
}
