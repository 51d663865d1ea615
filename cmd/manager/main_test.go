package main

import (
	"flag"
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
	var defined []doccheck.Flag
	fs.VisitAll(func(f *flag.Flag) { defined = append(defined, doccheck.Flag{Name: f.Name, Default: f.DefValue}) })
	for _, p := range doccheck.Compare("docs/operations.md", documented, defined) {
		t.Error(p)
	}
}
