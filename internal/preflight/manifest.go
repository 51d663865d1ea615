package preflight

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// The manifests a release would apply: read from files, directories and
// standard input (Read), or given as versions alone (ParseKeep).

// Manifest is one CRD as a release would apply it.
type Manifest struct {
	// Name is the CRD's name (<plural>.<group>).
	Name string `json:"name"`
	// Versions are the names in spec.versions, in order; Storage the one
	// marked storage ("" when --keep gave the versions alone).
	Versions []string `json:"versions"`
	Storage  string   `json:"storage,omitempty"`
	// Served are the versions it serves; nil when --keep gave the
	// versions alone.
	Served []string `json:"served,omitempty"`
	// Source says where it was read: a file and the document's index, or
	// --keep.
	Source string `json:"source"`
	// CRD is the whole manifest, for the server-side dry run; nil for
	// --keep.
	CRD *apiextensionsv1.CustomResourceDefinition `json:"-"`
}

// Read reads the CRDs of the manifests at paths ("-" is in): files, or
// directories of .yaml, .yml and .json files (with recursive, their
// subdirectories too), each a stream of YAML or JSON documents, as `helm
// template --include-crds` or `kustomize build` print them. Documents that
// are not apiextensions.k8s.io/v1 CustomResourceDefinitions are left out;
// one that does not decode is an error naming the file and document.
func Read(paths []string, recursive bool, in io.Reader) ([]Manifest, error) {
	var out []Manifest
	for _, p := range paths {
		files, err := expand(p, recursive)
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			raw, err := readFile(f, in)
			if err != nil {
				return nil, err
			}
			found, err := decode(raw, f)
			if err != nil {
				return nil, err
			}
			out = append(out, found...)
		}
	}
	return out, nil
}

func expand(p string, recursive bool) ([]string, error) {
	if p == "-" {
		return []string{p}, nil
	}
	info, err := os.Stat(p)
	if err != nil {
		return nil, fmt.Errorf("-f %s: %w", p, err)
	}
	if !info.IsDir() {
		return []string{p}, nil
	}
	var files []string
	err = filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && path != p && !recursive:
			return filepath.SkipDir
		case d.IsDir():
			return nil
		}
		if ext := strings.ToLower(filepath.Ext(path)); ext == ".yaml" || ext == ".yml" || ext == ".json" {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("-f %s: %w", p, err)
	}
	return files, nil
}

func readFile(path string, in io.Reader) ([]byte, error) {
	if path == "-" {
		if in == nil {
			return nil, errors.New("-f -: no standard input")
		}
		return io.ReadAll(in)
	}
	return os.ReadFile(path)
}

// decode reads the CRDs of one stream of documents.
func decode(raw []byte, source string) ([]Manifest, error) {
	if source == "-" {
		source = "standard input"
	}
	var out []Manifest
	d := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	for i := 0; ; i++ {
		u := &unstructured.Unstructured{}
		err := d.Decode(&u.Object)
		switch {
		case errors.Is(err, io.EOF):
			return out, nil
		case err != nil:
			return nil, fmt.Errorf("%s, document %d: %w", source, i+1, err)
		case u.Object == nil || u.GetKind() != "CustomResourceDefinition" || u.GetAPIVersion() != apiextensionsv1.SchemeGroupVersion.String():
			continue
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, crd); err != nil {
			return nil, fmt.Errorf("%s, document %d: not a CustomResourceDefinition: %w", source, i+1, err)
		}
		m := Manifest{Name: crd.Name, Source: fmt.Sprintf("%s, document %d", source, i+1), CRD: crd}
		for _, v := range crd.Spec.Versions {
			m.Versions = append(m.Versions, v.Name)
			if v.Storage {
				m.Storage = v.Name
			}
			if v.Served {
				m.Served = append(m.Served, v.Name)
			}
		}
		if m.Name == "" || len(m.Versions) == 0 {
			return nil, fmt.Errorf("%s: a CustomResourceDefinition without a name or versions", m.Source)
		}
		out = append(out, m)
	}
}

// ParseKeep reads --keep CRD=v1,v2: the versions a release keeps of a CRD,
// for hooks whose manifests are not at hand.
func ParseKeep(s string) (Manifest, error) {
	name, list, ok := strings.Cut(s, "=")
	versions := strings.Split(list, ",")
	if !ok || name == "" || !strings.Contains(name, ".") || slices.Contains(versions, "") {
		return Manifest{}, fmt.Errorf("--keep %q: want CRD=VERSION[,VERSION...], such as crontabs.stable.example.com=v1,v2", s)
	}
	return Manifest{Name: name, Versions: versions, Source: "--keep"}, nil
}
