package doccheck

import (
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestTermsLinkedAtFirstUse: on every user page, the first use of a term
// docs/concepts.md defines, in prose, is a link to its definition there, so
// that a reader who meets the word can look it up. The terms are those the
// pages use most; a page that never uses one passes for it.
func TestTermsLinkedAtFirstUse(t *testing.T) {
	terms := []struct {
		word    string // a regular expression, matched whole-word and case-insensitively
		anchors []string
	}{
		{`(first )?pass(es)?`, []string{"pass", "first-pass"}},
		{`re-check`, []string{"re-check"}},
		{`settle windows?`, []string{"settle-window"}},
		{`lag bound`, []string{"lag-bound"}},
		{`lag limit`, []string{"lag-limit"}},
		{`baselines?`, []string{"baseline"}},
		{`switched`, []string{"switched"}},
		{`prun(e|es|ed|ing)`, []string{"prune"}},
		{`bridges?`, []string{"bridge"}},
	}
	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	notForUsers := []string{"concepts.md", "benchmarks.md", "development.md", "release.md", "api-reference.md", "architecture.md"}
	docs = slices.DeleteFunc(docs, func(doc string) bool { return slices.Contains(notForUsers, filepath.Base(doc)) })
	if len(docs) < 10 {
		t.Fatalf("found %d user pages in docs/, want the dozen or so there are: is the path right?", len(docs))
	}
	for _, doc := range append(docs, "../../README.md") {
		concepts := "concepts.md#"
		if doc == "../../README.md" {
			concepts = "docs/concepts.md#"
		}
		text, links := prose(t, doc)
		for _, term := range terms {
			at := regexp.MustCompile(`(?i)\b(` + term.word + `)\b`).FindStringIndex(text)
			if at == nil {
				continue
			}
			target := linkAround(links, at)
			anchor, ok := strings.CutPrefix(target, concepts)
			if !ok || !slices.Contains(term.anchors, anchor) {
				line := strings.Count(text[:at[0]], "\n") + 1
				t.Errorf("%s:%d uses %q first, not as the text of a link to %s%s (it links to %q)",
					doc, line, text[at[0]:at[1]], concepts, term.anchors[0], target)
			}
		}
	}
}

// link is a Markdown link's text, as byte offsets into a document, and the
// target it points at.
type link struct {
	start, end int
	target     string
}

var (
	codeSpan   = regexp.MustCompile("`[^`]*`")
	inlineLink = regexp.MustCompile(`\[([^\]]*)\]\(([^)\s]*)\)`)
	definition = regexp.MustCompile(`^\[[^\]]+\]:\s`)
)

// blank turns every character of s but line ends into a space.
func blank(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\n' {
			return r
		}
		return ' '
	}, s)
}

// prose returns a document's text with everything that is not prose blanked
// out, line numbers kept: fenced code blocks, headings, link reference
// definitions, inline code spans and link targets. It returns the
// document's inline links besides, as offsets into that text.
func prose(t *testing.T, path string) (string, []link) {
	t.Helper()
	lines, _ := markdownLines(t, path)
	for i, line := range lines {
		if strings.HasPrefix(line, "#") || definition.MatchString(line) {
			lines[i] = blank(line)
		}
	}
	text := codeSpan.ReplaceAllStringFunc(strings.Join(lines, "\n"), blank)
	matches := inlineLink.FindAllStringSubmatchIndex(text, -1)
	links := make([]link, 0, len(matches))
	for _, m := range matches {
		links = append(links, link{start: m[2], end: m[3], target: text[m[4]:m[5]]})
	}
	for _, l := range links {
		url := l.end + len("](") + len(l.target) + len(")")
		text = text[:l.end] + blank(text[l.end:url]) + text[url:]
	}
	return text, links
}

// linkAround returns the target of the link whose text holds the span at,
// or "" when it is no link's text.
func linkAround(links []link, at []int) string {
	for _, l := range links {
		if l.start <= at[0] && at[1] <= l.end {
			return l.target
		}
	}
	return ""
}
