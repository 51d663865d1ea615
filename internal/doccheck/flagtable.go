// Package doccheck reads the flag tables of restow's docs, so that tests can
// hold them to the flags the programs define.
package doccheck

import (
	"fmt"
	"os"
	"regexp"
	"strings"
)

// Flag is one flag as a doc's table gives it.
type Flag struct {
	// Name is the long name, without dashes.
	Name string
	// Shorthand is the one-letter form, or "".
	Shorthand string
	// Default is the default the table gives in backquotes; "" when the
	// table describes it in words or leaves it empty.
	Default string
}

var quoted = regexp.MustCompile("`([^`]*)`")

// FlagTable returns the flags of the first table under heading (a whole
// Markdown heading line, such as "## run") whose header row begins with
// "| flag |". A row names one or more long flags in backquotes, each
// optionally followed by its shorthand (`--output`, `-o`), and gives their
// defaults in backquotes in the same order, or none in backquotes when every
// default is empty.
func FlagTable(path, heading string) ([]Flag, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(raw), "\n")
	level := len(heading) - len(strings.TrimLeft(heading, "#"))
	start := -1
	for i, l := range lines {
		if strings.TrimSpace(l) == heading {
			start = i + 1
			break
		}
	}
	if start < 0 {
		return nil, fmt.Errorf("%s: no heading %q", path, heading)
	}
	inTable := false
	var flags []Flag
	for _, l := range lines[start:] {
		if n := len(l) - len(strings.TrimLeft(l, "#")); n > 0 && n <= level && strings.HasPrefix(l[n:], " ") {
			break
		}
		switch {
		case strings.HasPrefix(l, "| flag |"):
			inTable = true
			continue
		case !inTable:
			continue
		case !strings.HasPrefix(l, "|"):
			return flags, nil
		case strings.HasPrefix(l, "| ---"):
			continue
		}
		row, err := parseRow(l)
		if err != nil {
			return nil, fmt.Errorf("%s, under %q: %w", path, heading, err)
		}
		flags = append(flags, row...)
	}
	if !inTable {
		return nil, fmt.Errorf("%s: no flag table under %q", path, heading)
	}
	return flags, nil
}

func parseRow(line string) ([]Flag, error) {
	cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
	if len(cells) < 3 {
		return nil, fmt.Errorf("row %q has fewer than 3 cells", line)
	}
	var flags []Flag
	for _, m := range quoted.FindAllStringSubmatch(cells[0], -1) {
		switch name := m[1]; {
		case strings.HasPrefix(name, "--"):
			flags = append(flags, Flag{Name: strings.TrimPrefix(name, "--")})
		case strings.HasPrefix(name, "-") && len(flags) > 0:
			flags[len(flags)-1].Shorthand = strings.TrimPrefix(name, "-")
		default:
			return nil, fmt.Errorf("row %q: %q is not a flag", line, name)
		}
	}
	defaults := quoted.FindAllStringSubmatch(cells[1], -1)
	switch {
	case len(flags) == 0:
		return nil, fmt.Errorf("row %q names no flag", line)
	case len(defaults) == 0:
		return flags, nil
	case len(defaults) != len(flags):
		return nil, fmt.Errorf("row %q gives %d defaults for %d flags", line, len(defaults), len(flags))
	}
	for i := range flags {
		flags[i].Default = defaults[i][1]
	}
	return flags, nil
}

// Compare lists how a doc's flag table differs from the flags a program
// defines: flags it documents that do not exist, flags it leaves out, and
// shorthands and defaults it gives wrongly. A default the table leaves
// empty matches an empty default.
func Compare(doc string, documented, defined []Flag) []string {
	var problems []string
	byName := map[string]Flag{}
	for _, f := range defined {
		byName[f.Name] = f
	}
	seen := map[string]bool{}
	for _, d := range documented {
		seen[d.Name] = true
		f, ok := byName[d.Name]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("%s documents --%s, which does not exist", doc, d.Name))
		case d.Shorthand != f.Shorthand:
			problems = append(problems, fmt.Sprintf("%s gives --%s the shorthand %q; it is %q", doc, d.Name, d.Shorthand, f.Shorthand))
		case d.Default != f.Default && (d.Default != "" || f.Default != ""):
			problems = append(problems, fmt.Sprintf("%s gives --%s a default of %q; it is %q", doc, d.Name, d.Default, f.Default))
		}
	}
	for _, f := range defined {
		if !seen[f.Name] {
			problems = append(problems, fmt.Sprintf("%s does not document --%s", doc, f.Name))
		}
	}
	return problems
}
