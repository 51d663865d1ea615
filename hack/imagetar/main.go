// Command imagetar writes the manager's container image as an OCI archive
// without a container engine (make image-tar): see internal/imagetar.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"

	"github.com/restow/restow/internal/imagetar"
)

func main() {
	var opts imagetar.Options
	var output, ref string
	flag.StringVar(&opts.Binary, "binary", "", "static manager binary (CGO_ENABLED=0) for --arch")
	flag.StringVar(&opts.Plugin, "plugin", "", "static kubectl-restow binary for --arch, run by the Helm chart's test hook (optional)")
	flag.StringVar(&opts.Arch, "arch", runtime.GOARCH, "GOARCH the binary was built for")
	flag.StringVar(&opts.Version, "version", "dev", "version recorded in the image's labels")
	flag.StringVar(&ref, "ref", "restow:dev", "image name recorded in the archive")
	flag.StringVar(&output, "output", "restow-image.tar", "archive to write")
	flag.Parse()
	if err := run(opts, ref, output); err != nil {
		fmt.Fprintln(os.Stderr, "imagetar:", err)
		os.Exit(1)
	}
}

func run(opts imagetar.Options, ref, output string) error {
	if opts.Binary == "" {
		return fmt.Errorf("--binary is required")
	}
	img, err := imagetar.Build(opts)
	if err != nil {
		return err
	}
	if err := imagetar.WriteOCIArchive(output, ref, img); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("wrote %s: %s@%s\n", output, ref, digest)
	return nil
}
