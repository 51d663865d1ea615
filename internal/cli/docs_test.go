package cli_test

import (
	"testing"

	"github.com/spf13/pflag"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/restow/restow/internal/cli"
	"github.com/restow/restow/internal/doccheck"
)

// TestFlagTables: each command's flag table in docs/cli.md names every flag
// of the command, no other, with the shorthand and default --help shows.
func TestFlagTables(t *testing.T) {
	root := cli.NewCommand(genericiooptions.NewTestIOStreamsDiscard())
	for _, cmd := range root.Commands() {
		if cmd.Name() == "help" || cmd.Name() == "completion" {
			continue
		}
		t.Run(cmd.Name(), func(t *testing.T) {
			documented, err := doccheck.FlagTable("../../docs/cli.md", "## "+cmd.Name())
			if err != nil {
				t.Fatal(err)
			}
			var defined []doccheck.Flag
			cmd.LocalFlags().VisitAll(func(f *pflag.Flag) {
				if f.Name != "help" {
					defined = append(defined, doccheck.Flag{Name: f.Name, Shorthand: f.Shorthand, Default: f.DefValue})
				}
			})
			for _, p := range doccheck.Compare("docs/cli.md, "+cmd.Name(), documented, defined) {
				t.Error(p)
			}
		})
	}
}
