package imagetar_test

import (
	"archive/tar"
	"bytes"
	"crypto/x509"
	"debug/elf"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/restow/restow/internal/imagetar"
)

// TestImageArchive builds the manager as make image-tar does, assembles the
// image, writes the OCI archive, and reads it back as a client would: the
// image runs the static binary as the non-root user, with the CA bundle,
// and ships the static kubectl plugin the Helm chart's test hook runs.
func TestImageArchive(t *testing.T) {
	dir := t.TempDir()
	binary := filepath.Join(dir, "manager")
	plugin := filepath.Join(dir, "kubectl-restow")
	for out, pkg := range map[string]string{binary: "github.com/restow/restow/cmd/manager", plugin: "github.com/restow/restow/cmd/kubectl-restow"} {
		build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", out, pkg)
		build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	img, err := imagetar.Build(imagetar.Options{Binary: binary, Plugin: plugin, Arch: runtime.GOARCH, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "restow-image.tar")
	if err := imagetar.WriteOCIArchive(archive, "restow:test", img); err != nil {
		t.Fatal(err)
	}

	// Read it back: untar the OCI layout and open its one image.
	unpacked := filepath.Join(dir, "layout")
	untar(t, archive, unpacked)
	index, err := layout.ImageIndexFromPath(unpacked)
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := index.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(manifest.Manifests) != 1 || manifest.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "restow:test" {
		t.Fatalf("index lists %+v, want one image named restow:test", manifest.Manifests)
	}
	read, err := index.Image(manifest.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := read.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Config.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532 (non-root)", cfg.Config.User)
	}
	if !slices.Equal(cfg.Config.Entrypoint, []string{"/manager"}) || len(cfg.Config.Cmd) != 0 {
		t.Errorf("entrypoint %q cmd %q, want [/manager] and no cmd", cfg.Config.Entrypoint, cfg.Config.Cmd)
	}
	if cfg.OS != "linux" || cfg.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s, want linux/%s", cfg.OS, cfg.Architecture, runtime.GOARCH)
	}
	layers, err := read.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers (%v), want 1", len(layers), err)
	}
	files := layerFiles(t, layers[0])

	for _, name := range []string{"manager", "kubectl-restow"} {
		binary, ok := files[name]
		if !ok || binary.mode&0o111 == 0 {
			t.Fatalf("/%s missing or not executable: %+v", name, binary.mode)
		}
		exe, err := elf.NewFile(bytes.NewReader(binary.data))
		if err != nil {
			t.Fatalf("/%s is not an ELF binary: %v", name, err)
		}
		for _, prog := range exe.Progs {
			if prog.Type == elf.PT_INTERP {
				t.Errorf("/%s asks for a dynamic loader: not static, it cannot run on an empty base", name)
			}
		}
	}
	if _, ok := files["bin/sh"]; ok {
		t.Error("the image has a shell")
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(files["etc/ssl/certs/ca-certificates.crt"].data) {
		t.Fatal("/etc/ssl/certs/ca-certificates.crt holds no certificates")
	}
	if n := strings.Count(string(files["etc/ssl/certs/ca-certificates.crt"].data), "BEGIN CERTIFICATE"); n < 100 {
		t.Errorf("CA bundle holds %d certificates, want the NSS store's 100 and more", n)
	}
	if !strings.Contains(string(files["etc/passwd"].data), "nonroot:x:65532:65532:") {
		t.Error("/etc/passwd does not name the non-root user")
	}

	// Reproducible: the same inputs give the same image.
	again, err := imagetar.Build(imagetar.Options{Binary: binary, Plugin: plugin, Arch: runtime.GOARCH, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	first, _ := img.Digest()
	second, _ := again.Digest()
	if first != second {
		t.Errorf("two builds of the same binary gave %s and %s", first, second)
	}
}

type file struct {
	mode int64
	data []byte
}

func layerFiles(t *testing.T, layer interface {
	Uncompressed() (io.ReadCloser, error)
},
) map[string]file {
	t.Helper()
	rc, err := layer.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rc.Close() }()
	out := map[string]file{}
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimPrefix(hdr.Name, "/")] = file{mode: hdr.Mode, data: data}
	}
}

func untar(t *testing.T, archive, dir string) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		target := filepath.Join(dir, filepath.FromSlash(hdr.Name))
		if !strings.HasPrefix(target, filepath.Clean(dir)+string(os.PathSeparator)) {
			t.Fatalf("archive entry %q escapes the directory", hdr.Name)
		}
		if hdr.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(target, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(target, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
