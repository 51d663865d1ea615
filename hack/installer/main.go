// Command installer writes restow's single-file install manifest
// (make build-installer): see internal/installer.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/restow/restow/internal/installer"
)

func main() {
	var dir, image, version, output string
	flag.StringVar(&dir, "kustomization", "config/default", "kustomization directory to build")
	flag.StringVar(&image, "image", "", "the manager's image, repository:tag or repository@digest")
	flag.StringVar(&version, "version", "", "the release, named in the manifest's header")
	flag.StringVar(&output, "output", "dist/install.yaml", "file to write")
	flag.Parse()
	if err := run(dir, image, version, output); err != nil {
		fmt.Fprintln(os.Stderr, "installer:", err)
		os.Exit(1)
	}
}

func run(dir, image, version, output string) error {
	if image == "" || version == "" {
		return fmt.Errorf("--image and --version are required")
	}
	manifest, err := installer.Render(dir, image, version)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(output), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(output, manifest, 0o644); err != nil {
		return err
	}
	fmt.Printf("wrote %s: restow %s, image %s\n", output, version, image)
	return nil
}
