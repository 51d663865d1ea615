package cli_test

import (
	"slices"
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
			names := make([]string, 0, len(documented))
			for _, d := range documented {
				names = append(names, d.Name)
				f := cmd.LocalFlags().Lookup(d.Name)
				switch {
				case f == nil:
					t.Errorf("docs/cli.md documents --%s, which %s does not have", d.Name, cmd.Name())
				case d.Shorthand != f.Shorthand:
					t.Errorf("docs/cli.md gives --%s the shorthand %q; %s's is %q", d.Name, d.Shorthand, cmd.Name(), f.Shorthand)
				case d.Default != f.DefValue && (d.Default != "" || f.DefValue != ""):
					t.Errorf("docs/cli.md gives --%s a default of %q; %s's is %q", d.Name, d.Default, cmd.Name(), f.DefValue)
				}
			}
			cmd.LocalFlags().VisitAll(func(f *pflag.Flag) {
				if f.Name != "help" && !slices.Contains(names, f.Name) {
					t.Errorf("docs/cli.md does not document %s --%s (%s)", cmd.Name(), f.Name, f.Usage)
				}
			})
		})
	}
}
