package krew

import (
	"archive/tar"
	"archive/zip"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"
)

// Archive formats, chosen by the archive's name: Windows users expect a zip,
// everyone else a tarball; krew takes both.
const (
	tarGz  = ".tar.gz"
	zipExt = ".zip"
)

// modTime is every entry's modification time. A fixed time makes the archive
// a function of its files alone, so the same commit and Go toolchain give the
// same archive and the same checksum: a release rebuilt by hand can be
// compared with the published one. 1980 is the earliest time zip can hold.
var modTime = time.Date(1980, time.January, 1, 0, 0, 0, 0, time.UTC)

// File is one file to put at the top level of an archive.
type File struct {
	// Name is the file's name inside the archive.
	Name string
	// Source is the file to read it from.
	Source string
	// Executable marks the plugin binary: its mode is 0755, every other
	// file's 0644.
	Executable bool
}

// Pack writes files into the archive dst, a .tar.gz or a .zip by its name.
func Pack(dst string, files []File) (err error) {
	files = append([]File(nil), files...)
	sort.Slice(files, func(i, j int) bool { return files[i].Name < files[j].Name })
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
	}()
	switch {
	case strings.HasSuffix(dst, tarGz):
		return writeTarGz(out, files)
	case strings.HasSuffix(dst, zipExt):
		return writeZip(out, files)
	default:
		return fmt.Errorf("%s: want a %s or %s archive", dst, tarGz, zipExt)
	}
}

func fileMode(f File) int64 {
	if f.Executable {
		return 0o755
	}
	return 0o644
}

func writeTarGz(out io.Writer, files []File) error {
	gz := gzip.NewWriter(out)
	tw := tar.NewWriter(gz)
	for _, f := range files {
		data, err := os.ReadFile(f.Source)
		if err != nil {
			return err
		}
		hdr := &tar.Header{
			Typeflag: tar.TypeReg,
			Name:     f.Name,
			Size:     int64(len(data)),
			Mode:     fileMode(f),
			ModTime:  modTime,
			Format:   tar.FormatPAX,
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return gz.Close()
}

func writeZip(out io.Writer, files []File) error {
	zw := zip.NewWriter(out)
	for _, f := range files {
		data, err := os.ReadFile(f.Source)
		if err != nil {
			return err
		}
		hdr := &zip.FileHeader{Name: f.Name, Method: zip.Deflate, Modified: modTime}
		hdr.SetMode(os.FileMode(fileMode(f)))
		w, err := zw.CreateHeader(hdr)
		if err != nil {
			return err
		}
		if _, err := w.Write(data); err != nil {
			return err
		}
	}
	return zw.Close()
}

// Entry is a regular file read back from an archive.
type Entry struct {
	Name string
	Mode os.FileMode
}

// List returns the regular files in a .tar.gz or .zip archive, by their
// cleaned paths: what krew finds after extracting it.
func List(archive string) ([]Entry, error) {
	switch {
	case strings.HasSuffix(archive, tarGz):
		return listTarGz(archive)
	case strings.HasSuffix(archive, zipExt):
		return listZip(archive)
	default:
		return nil, fmt.Errorf("%s: want a %s or %s archive", archive, tarGz, zipExt)
	}
}

func listTarGz(archive string) ([]Entry, error) {
	f, err := os.Open(archive)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	gz, err := gzip.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", archive, err)
	}
	tr := tar.NewReader(gz)
	var entries []Entry
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return entries, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", archive, err)
		}
		if hdr.Typeflag == tar.TypeReg {
			entries = append(entries, Entry{Name: path.Clean(hdr.Name), Mode: hdr.FileInfo().Mode()})
		}
	}
}

func listZip(archive string) ([]Entry, error) {
	zr, err := zip.OpenReader(archive)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", archive, err)
	}
	defer func() { _ = zr.Close() }()
	var entries []Entry
	for _, f := range zr.File {
		if f.Mode().IsRegular() {
			entries = append(entries, Entry{Name: path.Clean(f.Name), Mode: f.Mode()})
		}
	}
	return entries, nil
}
