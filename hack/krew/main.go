// Command krew packs the cross-built kubectl-restow binaries into release
// archives and writes their checksums and the krew plugin manifest that
// points at them (make dist): see internal/krew.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/restow/restow/internal/krew"
)

func main() {
	var version, binaries, license, dist string
	flag.StringVar(&version, "version", "", "release tag the archives are published under, e.g. v0.1.0")
	flag.StringVar(&binaries, "binaries", "dist/bin", "directory of <os>_<arch>/kubectl-restow[.exe] builds")
	flag.StringVar(&license, "license", "LICENSE", "license file to put in every archive")
	flag.StringVar(&dist, "dist", "dist", "directory for the archives, checksums.txt and plugins/restow.yaml")
	flag.Parse()
	if err := run(version, binaries, license, dist); err != nil {
		fmt.Fprintln(os.Stderr, "krew:", err)
		os.Exit(1)
	}
}

func run(version, binaries, license, dist string) error {
	if version == "" {
		return fmt.Errorf("--version is required")
	}
	builds, err := findBinaries(binaries)
	if err != nil {
		return err
	}
	archives, err := krew.PackPlatforms(dist, version, license, builds)
	if err != nil {
		return err
	}
	manifest := filepath.Join(dist, "plugins", krew.PluginName+".yaml")
	if _, err := krew.WriteManifest(manifest, version, archives); err != nil {
		return err
	}
	checksums := filepath.Join(dist, "checksums.txt")
	if err := krew.WriteChecksumsFile(checksums, archives); err != nil {
		return err
	}
	for _, a := range archives {
		fmt.Println("wrote", a)
	}
	fmt.Println("wrote", checksums)
	fmt.Println("wrote", manifest)
	return nil
}

// findBinaries reads the platform of each build from its directory's name,
// <os>_<arch>, as the Makefile's dist target lays them out.
func findBinaries(dir string) (map[krew.OSArch]string, error) {
	dirs, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	builds := map[krew.OSArch]string{}
	for _, d := range dirs {
		goos, arch, ok := strings.Cut(d.Name(), "_")
		if !d.IsDir() || !ok {
			return nil, fmt.Errorf("%s: want only <os>_<arch> directories, found %s", dir, d.Name())
		}
		binary := filepath.Join(dir, d.Name(), krew.BinaryName(goos))
		if _, err := os.Stat(binary); err != nil {
			return nil, err
		}
		builds[krew.OSArch{OS: goos, Arch: arch}] = binary
	}
	return builds, nil
}
