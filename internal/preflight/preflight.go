// Package preflight says, before a CRD upgrade is applied, whether the API
// server would refuse it: a CRD manifest that drops a version still listed
// in the live CRD's status.storedVersions is refused ("missing from
// spec.versions" on Kubernetes 1.37, "must appear in spec.versions"
// before), however the apply is made (kubectl, Helm, Argo CD, Flux). It
// reads manifests, holds each CRD in them against the live one, and judges
// (Judge, a pure function) what the apply needs: nothing, a migration that
// prunes status.storedVersions to the live storage version (kubectl restow
// prepare), or something restow cannot do yet.
package preflight

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

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

// State is what an apply of a CRD manifest needs.
type State string

// The states, in the order of their weight: a run's exit code is its
// weightiest CRD's.
const (
	// New: the cluster has no such CRD; the apply creates it.
	New State = "new"
	// OK: the apply keeps every version status.storedVersions lists.
	OK State = "ok"
	// NeedsPrepare: the apply drops stored versions and keeps the live
	// storage version: a migration to it, and a prune of
	// status.storedVersions (kubectl restow prepare), let it through.
	NeedsPrepare State = "needs prepare"
	// Blocked: the apply drops the live storage version too (a skipped
	// release, a downgrade), or the API server refuses it for another
	// reason.
	Blocked State = "blocked"
)

// Live is what the cluster says of a CRD.
type Live struct {
	Storage        string
	StoredVersions []string
	Served         []string
	// Migrated, when set, says what restow's record shows: a pass that
	// rewrote every object at the live storage version.
	Migrated string
}

// LiveOf reads a live CRD.
func LiveOf(crd *apiextensionsv1.CustomResourceDefinition) Live {
	l := Live{StoredVersions: slices.Clone(crd.Status.StoredVersions)}
	for _, v := range crd.Spec.Versions {
		if v.Storage {
			l.Storage = v.Name
		}
		if v.Served {
			l.Served = append(l.Served, v.Name)
		}
	}
	return l
}

// Verdict is what preflight says of one CRD.
type Verdict struct {
	CRD    string `json:"crd"`
	State  State  `json:"state"`
	Reason string `json:"reason"`
	// Drops are the versions of status.storedVersions the manifest drops.
	Drops []string `json:"drops,omitempty"`
	// Storage is the live storage version.
	Storage string `json:"liveStorageVersion,omitempty"`
	// Bridge, for a manifest that drops the live storage version, is the
	// version prepare makes the live storage version and migrates to.
	Bridge string `json:"bridge,omitempty"`
	// CheckedResourceVersion is the resourceVersion of the live CRD that
	// was judged (and, for a bridge, field-checked): prepare writes
	// nothing to a CRD that changed since.
	CheckedResourceVersion string `json:"-"`
	// Unchecked says why a check that prepare needs before it writes could
	// not be made here (a conversion webhook out of reach): preflight
	// warns, prepare changes nothing.
	Unchecked string `json:"unchecked,omitempty"`
	// Warnings are what the user should know that does not change the
	// state.
	Warnings []string `json:"warnings,omitempty"`
	// DryRun says what the API server answered a server-side dry run of
	// the manifest: "accepted", "refused: ...", or "" when none was made.
	DryRun string `json:"dryRun,omitempty"`
	// Etcd is what etcd holds of the resource, when preflight read it.
	Etcd   *Stored `json:"etcd,omitempty"`
	Source string  `json:"source"`
}

// Stored is what a read of etcd found: how many objects are stored at each
// version, at one revision, held against the API's count there.
type Stored struct {
	Revision int64          `json:"revision"`
	Versions map[string]int `json:"versions"`
}

// String says it in a line: "20 objects at v1alpha1, 3 at v1 (etcd
// revision 812)".
func (s Stored) String() string {
	if len(s.Versions) == 0 {
		return fmt.Sprintf("no object (etcd revision %d)", s.Revision)
	}
	versions := slices.Sorted(maps.Keys(s.Versions))
	parts := make([]string, 0, len(versions))
	for i, v := range versions {
		unit := ""
		if i == 0 {
			unit = " objects"
		}
		parts = append(parts, fmt.Sprintf("%d%s at %s", s.Versions[v], unit, v))
	}
	return fmt.Sprintf("%s (etcd revision %d)", strings.Join(parts, ", "), s.Revision)
}

// Judge says what applying m needs, given the live CRD (nil when the
// cluster has none).
func Judge(m Manifest, live *Live) Verdict {
	v := Verdict{CRD: m.Name, Source: m.Source}
	if live == nil {
		v.State, v.Reason = New, "no such CRD in the cluster: the apply creates it"
		return v
	}
	v.Storage = live.Storage
	for _, stored := range live.StoredVersions {
		if !slices.Contains(m.Versions, stored) {
			v.Drops = append(v.Drops, stored)
		}
	}
	switch {
	case len(v.Drops) == 0:
		v.State, v.Reason = OK, fmt.Sprintf("the manifest keeps every version status.storedVersions lists (%s)", strings.Join(live.StoredVersions, ", "))
	case slices.Contains(m.Versions, live.Storage):
		v.State = NeedsPrepare
		v.Reason = fmt.Sprintf("the manifest drops %s, which status.storedVersions still lists: kubectl restow prepare migrates every object to %s, the live storage version, and prunes status.storedVersions to [%s]; the apply then passes",
			strings.Join(v.Drops, ", "), live.Storage, live.Storage)
		if live.Migrated != "" {
			v.Reason += "; " + live.Migrated
		}
	default:
		c, unserved, ok := Bridge(m, *live)
		if !ok {
			v.State = Blocked
			v.Reason = fmt.Sprintf("the manifest drops %s, the live storage version, as a skipped release or a downgrade does (status.storedVersions lists %s), and no version the live CRD serves is in the manifest to carry the objects across: the API server refuses the apply. Apply a release in between that lists a version both sides know, first",
				live.Storage, strings.Join(live.StoredVersions, ", "))
			return v
		}
		v.State, v.Bridge = NeedsPrepare, c
		v.Reason = fmt.Sprintf("the manifest drops %s, the live storage version, as a skipped release or a downgrade does (status.storedVersions lists %s): kubectl restow prepare makes %s (served by both) the live storage version, once no field of any object would be lost at it, migrates every object to it and prunes status.storedVersions to [%s]; the apply then passes",
			live.Storage, strings.Join(live.StoredVersions, ", "), c, c)
		if unserved {
			v.Warnings = append(v.Warnings, fmt.Sprintf("the manifest lists %s with served: false: the new release's conversion must still read objects stored at it", c))
		}
	}
	return v
}

// Weight orders states for the exit code: the weightiest CRD decides.
func (s State) Weight() int {
	switch s {
	case Blocked:
		return 2
	case NeedsPrepare:
		return 1
	}
	return 0
}
