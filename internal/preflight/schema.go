package preflight

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
)

// Fields compared, pure: what one schema allows and another does not
// (LostFields, SchemaLoss), and what one object has and another lacks
// (FieldPaths, Missing, Changed).

// LostFields lists what an object valid at the schema from may hold that
// the schema to does not keep: the fields the API server prunes when it
// decodes the object at to without conversion, and the values to's types
// refuse. The API server's own pruning is the oracle: a sample object that
// sets every field from allows (each property, a key of each map, an item
// of each array, an unknown field wherever from preserves them, the
// apiVersion, kind and metadata of each embedded resource) is pruned with
// to's structural schema, and whatever goes is lost. Paths are dotted,
// with [] for an array's items, {} for a map's values and * for a field
// from preserves unknown; the root's apiVersion, kind and metadata are the
// API server's and left out. A type from allows and to does not (an
// int-or-string that becomes an integer) is named as path (from to to). A
// schema that is not structural is named as such: nothing about it is
// known.
func LostFields(from, to *apiextensionsv1.JSONSchemaProps) []string {
	if from == nil || to == nil {
		return []string{"(a version without a schema: what it keeps is unknown)"}
	}
	structural, err := structuralOf(to)
	if err != nil {
		return []string{"(the schema is not structural, so what it prunes is unknown: " + err.Error() + ")"}
	}
	sample, _ := sampleOf(from, to, false).(map[string]any)
	for _, meta := range []string{"apiVersion", "kind", "metadata"} {
		delete(sample, meta)
	}
	pruned := pruning.PruneWithOptions(sample, structural, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true})
	lost := make([]string, 0, len(pruned))
	for _, path := range pruned {
		lost = append(lost, notation(path))
	}
	lost = append(lost, narrowed("", from, to)...)
	slices.Sort(lost)
	return slices.Compact(lost)
}

// The keys a sample object sets where from allows any: a map's key, and a
// field of an object that preserves unknown fields. No schema declares
// them as properties, so to keeps them only where it allows any too.
const (
	sampleMapKey     = "{}"
	sampleUnknownKey = "*"
)

// sampleOf is a value that sets every field from allows, at any depth (see
// LostFields); to is the schema at the same place in the other version, or
// nil, which shapes what an object may hold where from allows anything;
// embedded says from is an embedded resource's.
func sampleOf(from, to *apiextensionsv1.JSONSchemaProps, embedded bool) any {
	switch {
	case from == nil:
		// Anything: whatever to declares here, and more.
		return anySample(to)
	case isList(from):
		return []any{sampleOf(itemsOf(from), itemsOf(to), false)}
	case !isObject(from) && !embedded:
		return "x"
	}
	out := map[string]any{}
	for name, p := range from.Properties {
		out[name] = sampleOf(&p, fieldOf(to, name), embeds(&p))
	}
	if ap := from.AdditionalProperties; ap != nil && (ap.Schema != nil || ap.Allows) {
		out[sampleMapKey] = sampleOf(ap.Schema, fieldOf(to, sampleMapKey), false)
	}
	if preserves(from) {
		// An unknown field may be one that to declares, holding anything.
		out[sampleUnknownKey] = "x"
		if to != nil {
			for name, tp := range to.Properties {
				if _, ok := out[name]; !ok {
					out[name] = anySample(&tp)
				}
			}
		}
	}
	if embedded || embeds(from) {
		withObjectMeta(out)
	}
	return out
}

// anySample is a value an object may hold where its schema allows
// anything, shaped by to: every field to declares, at any depth, and at
// each level an unknown field, a map's key and a list's item, so that
// whatever to prunes of it shows.
func anySample(to *apiextensionsv1.JSONSchemaProps) any {
	switch {
	case to == nil:
		return "x"
	case isList(to):
		return []any{anySample(itemsOf(to))}
	case !isObject(to):
		return "x"
	}
	out := map[string]any{sampleUnknownKey: "x"}
	for name, tp := range to.Properties {
		out[name] = anySample(&tp)
	}
	if to.AdditionalProperties != nil {
		out[sampleMapKey] = anySample(to.AdditionalProperties.Schema)
	}
	if embeds(to) {
		withObjectMeta(out)
	}
	return out
}

// withObjectMeta sets an embedded resource's apiVersion, kind and every
// field of its metadata, which a schema that is no longer an embedded
// resource's may prune.
func withObjectMeta(out map[string]any) {
	out["apiVersion"], out["kind"] = "example.com/v1", "Sample"
	out["metadata"] = map[string]any{
		"name": "sample", "generateName": "sample-", "namespace": "default",
		"labels": map[string]any{sampleMapKey: "x"}, "annotations": map[string]any{sampleMapKey: "x"},
		"ownerReferences": []any{map[string]any{"apiVersion": "v1", "kind": "Sample", "name": "owner", "uid": "0"}},
		"finalizers":      []any{"x"},
	}
}

func isList(s *apiextensionsv1.JSONSchemaProps) bool {
	return s.Type == "array" || (s.Items != nil && s.Items.Schema != nil)
}

func isObject(s *apiextensionsv1.JSONSchemaProps) bool {
	return s.Type == "object" || len(s.Properties) > 0 || s.AdditionalProperties != nil || preserves(s) || embeds(s)
}

// itemsOf is the schema of s's items, or nil (any, or s nil).
func itemsOf(s *apiextensionsv1.JSONSchemaProps) *apiextensionsv1.JSONSchemaProps {
	if s == nil || s.Items == nil {
		return nil
	}
	return s.Items.Schema
}

// fieldOf is the schema s gives the field name (sampleMapKey: a map's
// values), or nil.
func fieldOf(s *apiextensionsv1.JSONSchemaProps, name string) *apiextensionsv1.JSONSchemaProps {
	if s == nil {
		return nil
	}
	if p, ok := s.Properties[name]; ok && name != sampleMapKey {
		return &p
	}
	if s.AdditionalProperties != nil {
		return s.AdditionalProperties.Schema
	}
	return nil
}

func embeds(s *apiextensionsv1.JSONSchemaProps) bool { return s != nil && s.XEmbeddedResource }

// notation writes a path the pruning reports (spec.m.{}.x, spec.l[0].y)
// in LostFields' notation (spec.m{}.x, spec.l[].y).
func notation(path string) string {
	path = strings.ReplaceAll(path, "."+sampleMapKey, sampleMapKey)
	return strings.ReplaceAll(path, "[0]", "[]")
}

// structuralOf is s as the API server prunes with it.
func structuralOf(s *apiextensionsv1.JSONSchemaProps) (*structuralschema.Structural, error) {
	internal := &apiextensions.JSONSchemaProps{}
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(s, internal, nil); err != nil {
		return nil, err
	}
	return structuralschema.NewStructural(internal)
}

// narrowed names, at path and below, the values from takes and to
// refuses: a type of from's that to's type does not take.
func narrowed(path string, from, to *apiextensionsv1.JSONSchemaProps) []string {
	if from == nil || to == nil {
		return nil
	}
	var out []string
	if f, t := typesOf(from), typesOf(to); !takes(t, f) {
		out = append(out, fmt.Sprintf("%s (%s to %s)", path, typeName(from), typeName(to)))
	}
	for name, fp := range from.Properties {
		if path == "" && (name == "apiVersion" || name == "kind" || name == "metadata") {
			continue
		}
		if tp := fieldOf(to, name); tp != nil {
			out = append(out, narrowed(join(path, name), &fp, tp)...)
		}
	}
	if from.Items != nil && to.Items != nil {
		out = append(out, narrowed(path+"[]", from.Items.Schema, to.Items.Schema)...)
	}
	if from.AdditionalProperties != nil && to.AdditionalProperties != nil {
		out = append(out, narrowed(path+"{}", from.AdditionalProperties.Schema, to.AdditionalProperties.Schema)...)
	}
	return out
}

// typesOf is the JSON types s takes; nil for any.
func typesOf(s *apiextensionsv1.JSONSchemaProps) []string {
	switch {
	case s.XIntOrString:
		return []string{"integer", "string"}
	case s.Type == "":
		return nil
	}
	return []string{s.Type}
}

// takes says whether a value of every type in from is one of to's: any
// takes all, and number takes integer.
func takes(to, from []string) bool {
	if to == nil {
		return true
	}
	if from == nil {
		return false
	}
	for _, f := range from {
		if !slices.Contains(to, f) && (f != "integer" || !slices.Contains(to, "number")) {
			return false
		}
	}
	return true
}

func typeName(s *apiextensionsv1.JSONSchemaProps) string {
	switch {
	case s.XIntOrString:
		return "int-or-string"
	case s.Type == "":
		return "any type"
	}
	return s.Type
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
