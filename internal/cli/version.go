package cli

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/restow/restow/internal/version"
)

// newVersionCommand prints the plugin's build: the version string the
// Makefile stamps into the plugin, the manager and the image reference alike.
func newVersionCommand(streams genericiooptions.IOStreams) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the plugin's version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			info := version.Get()
			switch output {
			case "":
				_, err := fmt.Fprintln(streams.Out, "kubectl-restow", info)
				return err
			case "json":
				enc := json.NewEncoder(streams.Out)
				enc.SetIndent("", "  ")
				return enc.Encode(info)
			default:
				return fmt.Errorf("--output %q: want json, or nothing for one line", output)
			}
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "Output format: json, or empty for one line.")
	return cmd
}
