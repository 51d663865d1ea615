package krew

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"
)

// PackPlatforms writes one archive per platform into dir, holding the
// platform's binary (named BinaryName) and the license, and returns the
// archives' paths.
func PackPlatforms(dir, version, license string, binaries map[OSArch]string) ([]string, error) {
	if len(binaries) == 0 {
		return nil, fmt.Errorf("no binaries to pack")
	}
	var archives []string
	for p, binary := range binaries {
		archive := filepath.Join(dir, ArchiveName(version, p))
		files := []File{
			{Name: BinaryName(p.OS), Source: binary, Executable: true},
			{Name: License, Source: license},
		}
		if err := Pack(archive, files); err != nil {
			return nil, fmt.Errorf("packing %s: %w", p, err)
		}
		archives = append(archives, archive)
	}
	return archives, nil
}

// WriteManifest writes the krew manifest for the archives to file, named
// <plugin>.yaml as krew requires, after checking it as krew would: a
// manifest krew refuses, or one whose bin is missing from its archive,
// would break every user's `kubectl krew install` and upgrade, so it is an
// error here rather than a file.
func WriteManifest(file, version string, archives []string) (Plugin, error) {
	p, err := Manifest(version, archives)
	if err != nil {
		return Plugin{}, err
	}
	name := strings.TrimSuffix(filepath.Base(file), ".yaml")
	if err := Validate(name, p); err != nil {
		return Plugin{}, fmt.Errorf("krew would refuse the manifest: %w", err)
	}
	if err := checkArchives(p, archives); err != nil {
		return Plugin{}, err
	}
	data, err := yaml.Marshal(p)
	if err != nil {
		return Plugin{}, err
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return Plugin{}, err
	}
	return p, os.WriteFile(file, data, 0o644)
}

// checkArchives runs CheckArchive for each platform on the archive its URI
// names.
func checkArchives(p Plugin, archives []string) error {
	byName := map[string]string{}
	for _, a := range archives {
		byName[filepath.Base(a)] = a
	}
	for _, pl := range p.Spec.Platforms {
		archive, ok := byName[pl.URI[strings.LastIndex(pl.URI, "/")+1:]]
		if !ok {
			return fmt.Errorf("no archive for %s", pl.URI)
		}
		if err := CheckArchive(pl, archive); err != nil {
			return err
		}
	}
	return nil
}

// WriteChecksumsFile writes WriteChecksums's lines for files to file.
func WriteChecksumsFile(file string, files []string) (err error) {
	out, err := os.Create(file)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
	}()
	return WriteChecksums(out, files)
}
