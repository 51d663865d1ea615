// Package imagetar assembles the manager's container image without a
// container engine: one layer on an empty base holding the static binary
// (and the kubectl plugin, which the Helm chart's `helm test` runs),
// the CA certificates and a passwd entry for the non-root user, with the
// same user and entrypoint as the Dockerfile's distroless image. It writes
// the image as an OCI image layout in a tar archive, which `podman load`,
// `skopeo copy oci-archive:` and `crane push` take. Its output is
// reproducible: every timestamp is the epoch.
package imagetar

import (
	"archive/tar"
	"bytes"
	"encoding/pem"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// Paths and identity inside the image.
const (
	BinaryPath = "/manager"
	// PluginPath is the kubectl plugin, for the Helm chart's test hook.
	PluginPath = "/kubectl-restow"
	CAPath     = "/etc/ssl/certs/ca-certificates.crt"
	// User is distroless's nonroot user, as in the Dockerfile.
	User = "65532:65532"
)

// Options say what goes into the image.
type Options struct {
	// Binary is the static manager binary (CGO_ENABLED=0) for Arch.
	Binary string
	// Plugin, if set, is the static kubectl plugin binary for Arch.
	Plugin string
	// Arch is the GOARCH the binary was built for.
	Arch string
	// Version is recorded in the image's labels.
	Version string
}

// Build assembles the image.
func Build(opts Options) (v1.Image, error) {
	binary, err := os.ReadFile(opts.Binary)
	if err != nil {
		return nil, err
	}
	var plugin []byte
	if opts.Plugin != "" {
		if plugin, err = os.ReadFile(opts.Plugin); err != nil {
			return nil, err
		}
	}
	layerTar, err := layerContents(binary, plugin)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", opts.Arch
	cfg.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cfg.Config.User = User
	cfg.Config.Entrypoint = []string{BinaryPath}
	cfg.Config.WorkingDir = "/"
	cfg.Config.Labels = map[string]string{
		"org.opencontainers.image.title":       "restow",
		"org.opencontainers.image.description": "Kubernetes storage version migrator",
		"org.opencontainers.image.version":     opts.Version,
	}
	return mutate.ConfigFile(img, cfg)
}

// layerContents is the image's only layer: the binary, the plugin if any,
// the CA bundle and /etc/passwd and /etc/group naming the non-root user.
func layerContents(binary, plugin []byte) ([]byte, error) {
	var ca bytes.Buffer
	for root := range bundle.Roots() {
		// Roots with constraints X.509 cannot express are left out, as
		// Debian's ca-certificates leaves out distrusted ones.
		if root.Constraint != nil {
			continue
		}
		if err := pem.Encode(&ca, &pem.Block{Type: "CERTIFICATE", Bytes: root.Certificate}); err != nil {
			return nil, err
		}
	}
	type file struct {
		path string
		mode int64
		data []byte
	}
	files := []file{
		{"etc/", 0o755, nil},
		{"etc/group", 0o644, []byte("root:x:0:\nnonroot:x:65532:\n")},
		{"etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{"etc/ssl/", 0o755, nil},
		{"etc/ssl/certs/", 0o755, nil},
		{CAPath[1:], 0o644, ca.Bytes()},
		{"home/", 0o755, nil},
		{"home/nonroot/", 0o700, nil},
		{BinaryPath[1:], 0o755, binary},
	}
	if plugin != nil {
		files = append(files, file{PluginPath[1:], 0o755, plugin})
	}
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	for _, f := range files {
		hdr := &tar.Header{Name: f.path, Mode: f.mode, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(f.data))
		if f.data == nil {
			hdr.Typeflag = tar.TypeDir
		}
		if f.path == "home/nonroot/" {
			hdr.Uid, hdr.Gid = 65532, 65532
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// WriteOCIArchive writes img, named ref, as an OCI image layout in a tar
// archive at path.
func WriteOCIArchive(path, ref string, img v1.Image) error {
	dir, err := os.MkdirTemp("", "restow-image-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref})); err != nil {
		return err
	}
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(out)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: filepath.ToSlash(rel), Mode: 0o644, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		if d.IsDir() {
			hdr.Name += "/"
			hdr.Typeflag, hdr.Mode = tar.TypeDir, 0o755
			return tw.WriteHeader(hdr)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(data))
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err = tw.Write(data)
		return err
	})
	if err == nil {
		err = tw.Close()
	}
	if closeErr := out.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
