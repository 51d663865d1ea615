package cli

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"
)

func addOutputFlag(cmd *cobra.Command, output *string) {
	cmd.Flags().StringVarP(output, "output", "o", "", "Output format: json or yaml. The default is a table.")
}

func validateOutput(output string) error {
	switch output {
	case "", "json", "yaml":
		return nil
	}
	return fmt.Errorf("--output %q is not supported: use json or yaml, or leave it out for a table", output)
}

// printStructured prints v as indented JSON or as YAML.
func printStructured(out io.Writer, output string, v any) error {
	raw, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if output == "yaml" {
		if raw, err = yaml.JSONToYAML(raw); err != nil {
			return err
		}
		_, err = out.Write(raw)
		return err
	}
	_, err = fmt.Fprintf(out, "%s\n", raw)
	return err
}
