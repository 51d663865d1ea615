package preflight

import (
	"reflect"
	"slices"
	"sort"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
)

// Fields compared, pure: what one schema allows and another does not
// (LostFields, SchemaLoss), and what one object has and another lacks
// (FieldPaths, Missing, Changed).

// LostFields lists the fields the schema from allows and the schema to
// does not: an object at from that sets one loses it when the API server
// decodes it at to without conversion (pruning). A field under
// x-kubernetes-preserve-unknown-fields in to is kept; under it in from
// alone, any field beyond to's is lost (path.*). Paths
// are dotted, with [] for an array's items and {} for a map's values;
// apiVersion, kind and metadata are the API server's and left out.
func LostFields(from, to *apiextensionsv1.JSONSchemaProps) []string {
	var lost []string
	var walk func(path string, f, t *apiextensionsv1.JSONSchemaProps)
	walk = func(path string, f, t *apiextensionsv1.JSONSchemaProps) {
		if f == nil || t == nil || preserves(t) {
			return
		}
		if preserves(f) {
			// from keeps any field here and to does not: whatever an
			// object holds beyond to's properties is lost.
			lost = append(lost, join(path, "*"))
		}
		names := make([]string, 0, len(f.Properties))
		for name := range f.Properties {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			if path == "" && (name == "apiVersion" || name == "kind" || name == "metadata") {
				continue
			}
			child := join(path, name)
			fp := f.Properties[name]
			tp, ok := t.Properties[name]
			switch {
			case ok:
				walk(child, &fp, &tp)
			case t.AdditionalProperties != nil && t.AdditionalProperties.Schema != nil:
				walk(child, &fp, t.AdditionalProperties.Schema)
			case t.AdditionalProperties != nil && t.AdditionalProperties.Allows:
			default:
				lost = append(lost, child)
			}
		}
		if f.Items != nil && f.Items.Schema != nil && t.Items != nil && t.Items.Schema != nil {
			walk(path+"[]", f.Items.Schema, t.Items.Schema)
		}
		if f.AdditionalProperties != nil && f.AdditionalProperties.Schema != nil {
			switch {
			case t.AdditionalProperties != nil && t.AdditionalProperties.Schema != nil:
				walk(path+"{}", f.AdditionalProperties.Schema, t.AdditionalProperties.Schema)
			case t.AdditionalProperties == nil && len(t.Properties) == 0 && t.Type == "object":
				lost = append(lost, path+"{}")
			}
		}
	}
	walk("", from, to)
	return lost
}

func preserves(s *apiextensionsv1.JSONSchemaProps) bool {
	return s.XPreserveUnknownFields != nil && *s.XPreserveUnknownFields
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// FieldPaths lists the paths of every leaf and empty container in obj (an
// object's content as JSON decodes it), in the notation of LostFields,
// metadata, apiVersion and kind left out.
func FieldPaths(obj map[string]any) []string {
	var out []string
	for k, v := range obj {
		if k != "apiVersion" && k != "kind" && k != "metadata" {
			out = leaves(out, k, v)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// leaves appends the paths of every leaf and empty container of v, at path.
func leaves(out []string, path string, v any) []string {
	switch v := v.(type) {
	case map[string]any:
		if len(v) == 0 {
			out = append(out, path)
		}
		for k, c := range v {
			out = leaves(out, join(path, k), c)
		}
	case []any:
		if len(v) == 0 {
			out = append(out, path)
		}
		for _, c := range v {
			out = leaves(out, path+"[]", c)
		}
	default:
		out = append(out, path)
	}
	return out
}

// Missing lists the paths of have that want lacks: what an object read at
// one version holds and the same object read at another does not.
func Missing(have, want []string) []string {
	var out []string
	for _, p := range have {
		if _, found := slices.BinarySearch(want, p); !found {
			out = append(out, p)
		}
	}
	return out
}

// schemaOf is the schema of version in crd, or nil.
func schemaOf(crd *apiextensionsv1.CustomResourceDefinition, version string) *apiextensionsv1.JSONSchemaProps {
	for _, v := range crd.Spec.Versions {
		if v.Name == version && v.Schema != nil {
			return v.Schema.OpenAPIV3Schema
		}
	}
	return nil
}

// SchemaLoss says, for each version in versions, the fields its schema in
// from allows that version to's schema in into does not, as "v1beta1:
// spec.foo, spec.bar". from and into may be the same CRD, or the live one
// and a release's manifest.
func SchemaLoss(from *apiextensionsv1.CustomResourceDefinition, versions []string, into *apiextensionsv1.CustomResourceDefinition, to string) []string {
	var out []string
	for _, v := range versions {
		if from == into && v == to {
			continue
		}
		if lost := LostFields(schemaOf(from, v), schemaOf(into, to)); len(lost) > 0 {
			out = append(out, v+": "+strings.Join(lost, ", "))
		}
	}
	return out
}

// Changed lists the paths, in the notation of FieldPaths, where after
// differs from before: a field before has that after lacks or holds with
// another value, or a list of another length. Labels and annotations are
// compared too (a conversion may change them, and what it drops is lost);
// the rest of metadata, apiVersion and kind are not. It is what a round
// trip through a conversion lost.
func Changed(before, after map[string]any) []string {
	var out []string
	var walk func(path string, b, a any)
	walk = func(path string, b, a any) {
		switch b := b.(type) {
		case map[string]any:
			am, ok := a.(map[string]any)
			if !ok {
				out = leaves(out, path, b)
				return
			}
			if len(b) == 0 && len(am) != 0 {
				out = append(out, path)
				return
			}
			for k, bc := range b {
				ac, found := am[k]
				if !found {
					out = leaves(out, join(path, k), bc)
					continue
				}
				walk(join(path, k), bc, ac)
			}
		case []any:
			al, ok := a.([]any)
			if !ok || len(al) != len(b) {
				out = append(out, path)
				return
			}
			for i := range b {
				walk(path+"[]", b[i], al[i])
			}
		default:
			if !reflect.DeepEqual(b, a) {
				out = append(out, path)
			}
		}
	}
	for k, bc := range before {
		switch k {
		case "apiVersion", "kind":
			continue
		case "metadata":
			bm, _ := bc.(map[string]any)
			am, _ := after[k].(map[string]any)
			for _, field := range []string{"labels", "annotations"} {
				if bm[field] != nil {
					walk("metadata."+field, bm[field], am[field])
				}
			}
			continue
		}
		walk(k, bc, after[k])
	}
	slices.Sort(out)
	return slices.Compact(out)
}
