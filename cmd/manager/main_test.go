package main

import (
	"flag"
	"slices"
	"testing"

	"github.com/restow/restow/internal/doccheck"
)

// TestFlagTable: the flag table of docs/operations.md names every flag of
// the manager, no other, with the defaults the manager uses.
func TestFlagTable(t *testing.T) {
	var o options
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	o.bindFlags(fs)
	documented, err := doccheck.FlagTable("../../docs/operations.md", "## Flags")
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(documented))
	for _, d := range documented {
		names = append(names, d.Name)
		f := fs.Lookup(d.Name)
		switch {
		case f == nil:
			t.Errorf("docs/operations.md documents --%s, which the manager does not have", d.Name)
		case d.Default != f.DefValue && (d.Default != "" || f.DefValue != ""):
			t.Errorf("docs/operations.md gives --%s a default of %q; the manager's is %q", d.Name, d.Default, f.DefValue)
		}
	}
	fs.VisitAll(func(f *flag.Flag) {
		if !slices.Contains(names, f.Name) {
			t.Errorf("docs/operations.md does not document --%s (%s)", f.Name, f.Usage)
		}
	})
}
