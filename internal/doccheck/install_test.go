package doccheck

import (
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
	installing := []string{"../../README.md", "../../docs/install.md", "../../charts/restow/README.md"}
	others, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	docs := slices.Clone(installing)
	for _, doc := range append(others, "../../e2e/README.md", "../../CHANGELOG.md", "../../SECURITY.md") {
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

// TestTestTimeAgrees: the CI workflow's note on how long `make test` takes
// gives the README's figure, so that the two never disagree again.
func TestTestTimeAgrees(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(\d+m\d+s) on a fresh clone, the slowest of three consecutive green runs`).FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md's test row no longer gives the slowest of three fresh-clone runs")
	}
	ci, err := os.ReadFile("../../.github/workflows/ci.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(ci), "A fresh clone took "+string(m[1])) {
		t.Errorf(".github/workflows/ci.yaml does not say the README's %s for a fresh clone's make test", m[1])
	}
}
