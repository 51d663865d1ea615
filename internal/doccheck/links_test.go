package doccheck

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// TestLinks: every relative link in the project's Markdown points at a file
// that exists and, where it names an anchor, at a heading of that file, as
// GitHub renders them.
func TestLinks(t *testing.T) {
	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	docs = append(docs, "../../README.md", "../../CHANGELOG.md", "../../SECURITY.md",
		"../../charts/restow/README.md", "../../e2e/README.md")
	link := regexp.MustCompile(`\]\(([^)\s]+)\)|^\[[^\]]+\]:\s+(\S+)`)
	anchors := map[string]map[string]bool{}
	checked := 0
	for _, doc := range docs {
		lines, _ := markdownLines(t, doc)
		for n, line := range lines {
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target := m[1] + m[2]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, anchor, _ := strings.Cut(target, "#")
				path := doc
				if file != "" {
					path = filepath.Join(filepath.Dir(doc), file)
				}
				checked++
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s:%d links to %s, which does not exist", doc, n+1, target)
					continue
				}
				if anchor == "" || !strings.HasSuffix(path, ".md") {
					continue
				}
				if anchors[path] == nil {
					_, anchors[path] = markdownLines(t, path)
				}
				if !anchors[path][anchor] {
					t.Errorf("%s:%d links to %s: %s has no heading with that anchor", doc, n+1, target, path)
				}
			}
		}
	}
	t.Logf("%d relative links in %d documents", checked, len(docs))
	if checked < 100 {
		t.Errorf("checked %d links: the pattern no longer finds the documents' links", checked)
	}
}

// htmlAnchor is an anchor set by hand, such as <a id="pass"></a>.
var htmlAnchor = regexp.MustCompile(`<a id="([^"]+)"></a>`)

// markdownLines returns a document's lines outside code blocks and their
// anchors: those set by hand (htmlAnchor) and those of its headings: GitHub
// lowercases a heading, drops every character but letters, digits, spaces,
// hyphens and underscores, turns spaces into hyphens, and numbers repeats
// (-1, -2).
func markdownLines(t *testing.T, path string) ([]string, map[string]bool) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	anchors := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	scanner := bufio.NewScanner(f)
	scanner.Buffer(nil, 1<<20)
	for scanner.Scan() {
		line := scanner.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			lines = append(lines, "")
			continue
		}
		if fenced {
			lines = append(lines, "")
			continue
		}
		lines = append(lines, line)
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			anchors[m[1]] = true
		}
		if heading, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " "); ok && strings.HasPrefix(line, "#") {
			slug := strings.Map(func(r rune) rune {
				switch {
				case r == ' ':
					return '-'
				case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
					return unicode.ToLower(r)
				}
				return -1
			}, strings.TrimSpace(heading))
			if n := seen[slug]; n > 0 {
				anchors[slug+"-"+strconv.Itoa(n)] = true
			} else {
				anchors[slug] = true
			}
			seen[slug]++
		}
	}
	if err := scanner.Err(); err != nil {
		t.Fatal(err)
	}
	return lines, anchors
}
