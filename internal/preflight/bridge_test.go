package preflight

import (
	"slices"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/utils/ptr"
)

func TestBridge(t *testing.T) {
	live := Live{Storage: "v1alpha1", Served: []string{"v1alpha1", "v1beta1", "v1"}}
	for _, tc := range []struct {
		name     string
		m        Manifest
		want     string
		unserved bool
		ok       bool
	}{
		{"the manifest's storage version, served live", Manifest{Versions: []string{"v1beta1", "v1"}, Storage: "v1", Served: []string{"v1beta1", "v1"}}, "v1", false, true},
		{"then the first version it serves", Manifest{Versions: []string{"v1beta1", "v2"}, Storage: "v2", Served: []string{"v1beta1", "v2"}}, "v1beta1", false, true},
		{"then one it lists unserved", Manifest{Versions: []string{"v1beta1", "v2"}, Storage: "v2", Served: []string{"v2"}}, "v1beta1", true, true},
		{"--keep: in its order", Manifest{Versions: []string{"v2", "v1"}}, "v1", false, true},
		{"none in common", Manifest{Versions: []string{"v2"}, Storage: "v2", Served: []string{"v2"}}, "", false, false},
	} {
		got, unserved, ok := Bridge(tc.m, live)
		if got != tc.want || unserved != tc.unserved || ok != tc.ok {
			t.Errorf("%s: Bridge = %q, %v, %v; want %q, %v, %v", tc.name, got, unserved, ok, tc.want, tc.unserved, tc.ok)
		}
	}
}

func TestLostFields(t *testing.T) {
	str := apiextensionsv1.JSONSchemaProps{Type: "string"}
	obj := func(props map[string]apiextensionsv1.JSONSchemaProps) apiextensionsv1.JSONSchemaProps {
		return apiextensionsv1.JSONSchemaProps{Type: "object", Properties: props}
	}
	from := obj(map[string]apiextensionsv1.JSONSchemaProps{
		"metadata": obj(nil),
		"spec": obj(map[string]apiextensionsv1.JSONSchemaProps{
			"a":     str,
			"extra": str,
			"list":  {Type: "array", Items: &apiextensionsv1.JSONSchemaPropsOrArray{Schema: ptr.To(obj(map[string]apiextensionsv1.JSONSchemaProps{"x": str, "y": str}))}},
			"open":  obj(map[string]apiextensionsv1.JSONSchemaProps{"k": str}),
		}),
	})
	to := obj(map[string]apiextensionsv1.JSONSchemaProps{
		"spec": obj(map[string]apiextensionsv1.JSONSchemaProps{
			"a":    str,
			"list": {Type: "array", Items: &apiextensionsv1.JSONSchemaPropsOrArray{Schema: ptr.To(obj(map[string]apiextensionsv1.JSONSchemaProps{"x": str}))}},
			"open": {Type: "object", XPreserveUnknownFields: ptr.To(true)},
		}),
	})
	if got, want := LostFields(&from, &to), []string{"spec.extra", "spec.list[].y"}; !slices.Equal(got, want) {
		t.Errorf("LostFields = %v, want %v", got, want)
	}
	open := obj(map[string]apiextensionsv1.JSONSchemaProps{"spec": {Type: "object", XPreserveUnknownFields: ptr.To(true)}})
	if got, want := LostFields(&open, &to), []string{"spec.*", "spec.list[].*"}; !slices.Equal(got, want) {
		t.Errorf("LostFields from an open spec = %v, want %v", got, want)
	}
	if got := LostFields(&to, &to); len(got) != 0 {
		t.Errorf("LostFields of a schema against itself = %v, want none", got)
	}
}

func TestFieldPaths(t *testing.T) {
	obj := map[string]any{
		"apiVersion": "x/v1", "kind": "K", "metadata": map[string]any{"name": "n"},
		"spec": map[string]any{"a": "1", "empty": map[string]any{}, "list": []any{map[string]any{"x": 1}, map[string]any{"y": nil}}, "none": []any{}},
	}
	want := []string{"spec.a", "spec.empty", "spec.list[].x", "spec.list[].y", "spec.none"}
	got := FieldPaths(obj)
	if !slices.Equal(got, want) {
		t.Errorf("FieldPaths = %v, want %v", got, want)
	}
	if missing := Missing(got, []string{"spec.a", "spec.list[].x"}); !slices.Equal(missing, []string{"spec.empty", "spec.list[].y", "spec.none"}) {
		t.Errorf("Missing = %v", missing)
	}
}

func TestChanged(t *testing.T) {
	before := map[string]any{
		"apiVersion": "a.example.com/v1alpha1",
		"metadata":   map[string]any{"name": "o", "labels": map[string]any{"team": "x"}, "annotations": map[string]any{"note": "n"}},
		"spec": map[string]any{
			"n": int64(3), "label": "l", "tags": []any{"a", "b"},
			"nested": map[string]any{"ratio": "0.25", "deep": map[string]any{"x": true}},
			"empty":  map[string]any{},
		},
		"status": map[string]any{"phase": "Ready"},
	}
	same := map[string]any{
		"apiVersion": "a.example.com/v1beta1",
		"metadata":   map[string]any{"name": "o", "resourceVersion": "9", "labels": map[string]any{"team": "x"}, "annotations": map[string]any{"note": "n"}},
		"spec": map[string]any{
			"n": int64(3), "label": "l", "tags": []any{"a", "b"}, "added": "fine",
			"nested": map[string]any{"ratio": "0.25", "deep": map[string]any{"x": true}},
			"empty":  map[string]any{},
		},
		"status": map[string]any{"phase": "Ready"},
	}
	if got := Changed(before, same); len(got) != 0 {
		t.Errorf("Changed of a faithful round trip = %v, want none", got)
	}
	lossy := map[string]any{
		"metadata": map[string]any{"name": "o", "labels": map[string]any{}},
		"spec": map[string]any{
			"n": int64(4), "tags": []any{"a"},
			"nested": map[string]any{"ratio": "0.25"},
			"empty":  map[string]any{"x": "y"},
		},
	}
	want := []string{"metadata.annotations.note", "metadata.labels.team", "spec.empty", "spec.label", "spec.n", "spec.nested.deep.x", "spec.tags", "status.phase"}
	if got := Changed(before, lossy); !slices.Equal(got, want) {
		t.Errorf("Changed = %v, want %v", got, want)
	}
}

// TestLostFieldsNarrowings: every way a schema can narrow what an object
// holds, each where no property is removed, so that only a comparison of
// what the schemas allow sees it.
func TestLostFieldsNarrowings(t *testing.T) {
	str := apiextensionsv1.JSONSchemaProps{Type: "string"}
	obj := func(props map[string]apiextensionsv1.JSONSchemaProps) apiextensionsv1.JSONSchemaProps {
		return apiextensionsv1.JSONSchemaProps{Type: "object", Properties: props}
	}
	mapOf := func(v apiextensionsv1.JSONSchemaProps) apiextensionsv1.JSONSchemaProps {
		return apiextensionsv1.JSONSchemaProps{Type: "object", AdditionalProperties: &apiextensionsv1.JSONSchemaPropsOrBool{Allows: true, Schema: &v}}
	}
	open := func(props map[string]apiextensionsv1.JSONSchemaProps) apiextensionsv1.JSONSchemaProps {
		s := obj(props)
		s.XPreserveUnknownFields = ptr.To(true)
		return s
	}
	list := func(item apiextensionsv1.JSONSchemaProps) apiextensionsv1.JSONSchemaProps {
		return apiextensionsv1.JSONSchemaProps{Type: "array", Items: &apiextensionsv1.JSONSchemaPropsOrArray{Schema: &item}}
	}
	spec := func(props map[string]apiextensionsv1.JSONSchemaProps) *apiextensionsv1.JSONSchemaProps {
		root := obj(map[string]apiextensionsv1.JSONSchemaProps{"spec": obj(props)})
		return &root
	}
	embedded := obj(map[string]apiextensionsv1.JSONSchemaProps{"replicas": {Type: "integer"}})
	embedded.XEmbeddedResource = true
	for _, tc := range []struct {
		name     string
		from, to *apiextensionsv1.JSONSchemaProps
		want     []string
	}{
		{"a map becomes fixed properties",
			spec(map[string]apiextensionsv1.JSONSchemaProps{"labels": mapOf(str)}),
			spec(map[string]apiextensionsv1.JSONSchemaProps{"labels": obj(map[string]apiextensionsv1.JSONSchemaProps{"team": str})}),
			[]string{"spec.labels{}"}},
		{"a map's values narrow",
			spec(map[string]apiextensionsv1.JSONSchemaProps{"ports": mapOf(obj(map[string]apiextensionsv1.JSONSchemaProps{"port": str, "host": str}))}),
			spec(map[string]apiextensionsv1.JSONSchemaProps{"ports": mapOf(obj(map[string]apiextensionsv1.JSONSchemaProps{"port": str}))}),
			[]string{"spec.ports{}.host"}},
		{"unknown fields preserved deep in a list, then not",
			spec(map[string]apiextensionsv1.JSONSchemaProps{"rules": list(obj(map[string]apiextensionsv1.JSONSchemaProps{"match": open(map[string]apiextensionsv1.JSONSchemaProps{"path": str})}))}),
			spec(map[string]apiextensionsv1.JSONSchemaProps{"rules": list(obj(map[string]apiextensionsv1.JSONSchemaProps{"match": obj(map[string]apiextensionsv1.JSONSchemaProps{"path": str})}))}),
			[]string{"spec.rules[].match.*"}},
		{"a list's items narrow",
			spec(map[string]apiextensionsv1.JSONSchemaProps{"items": list(obj(map[string]apiextensionsv1.JSONSchemaProps{"name": str, "weight": {Type: "integer"}}))}),
			spec(map[string]apiextensionsv1.JSONSchemaProps{"items": list(obj(map[string]apiextensionsv1.JSONSchemaProps{"name": str}))}),
			[]string{"spec.items[].weight"}},
		{"an embedded resource becomes a plain object",
			spec(map[string]apiextensionsv1.JSONSchemaProps{"template": embedded}),
			spec(map[string]apiextensionsv1.JSONSchemaProps{"template": obj(map[string]apiextensionsv1.JSONSchemaProps{"replicas": {Type: "integer"}})}),
			[]string{"spec.template.apiVersion", "spec.template.kind", "spec.template.metadata"}},
		{"int-or-string becomes an integer",
			spec(map[string]apiextensionsv1.JSONSchemaProps{"port": {XIntOrString: true}}),
			spec(map[string]apiextensionsv1.JSONSchemaProps{"port": {Type: "integer"}}),
			[]string{"spec.port (int-or-string to integer)"}},
		{"a number becomes an integer",
			spec(map[string]apiextensionsv1.JSONSchemaProps{"ratio": {Type: "number"}}),
			spec(map[string]apiextensionsv1.JSONSchemaProps{"ratio": {Type: "integer"}}),
			[]string{"spec.ratio (number to integer)"}},
		{"unknown fields kept where to types a subtree",
			spec(map[string]apiextensionsv1.JSONSchemaProps{"open": open(nil)}),
			spec(map[string]apiextensionsv1.JSONSchemaProps{"open": open(map[string]apiextensionsv1.JSONSchemaProps{"template": obj(map[string]apiextensionsv1.JSONSchemaProps{"image": str})})}),
			[]string{"spec.open.template.*"}},
		{"a map of anything, then of typed objects",
			spec(map[string]apiextensionsv1.JSONSchemaProps{"any": {Type: "object", AdditionalProperties: &apiextensionsv1.JSONSchemaPropsOrBool{Allows: true}}}),
			spec(map[string]apiextensionsv1.JSONSchemaProps{"any": mapOf(obj(map[string]apiextensionsv1.JSONSchemaProps{"image": str}))}),
			[]string{"spec.any{}.*"}},
		{"an embedded resource's metadata, then a plain object's",
			spec(map[string]apiextensionsv1.JSONSchemaProps{"template": embedded}),
			spec(map[string]apiextensionsv1.JSONSchemaProps{"template": obj(map[string]apiextensionsv1.JSONSchemaProps{
				"apiVersion": str, "kind": str, "replicas": {Type: "integer"},
				"metadata": obj(map[string]apiextensionsv1.JSONSchemaProps{"name": str, "labels": mapOf(str)}),
			})}),
			[]string{"spec.template.metadata.annotations", "spec.template.metadata.finalizers", "spec.template.metadata.generateName", "spec.template.metadata.namespace", "spec.template.metadata.ownerReferences"}},
		{"fixed properties become a map of narrower values",
			spec(map[string]apiextensionsv1.JSONSchemaProps{"limits": obj(map[string]apiextensionsv1.JSONSchemaProps{"cpu": str})}),
			spec(map[string]apiextensionsv1.JSONSchemaProps{"limits": mapOf(apiextensionsv1.JSONSchemaProps{Type: "integer"})}),
			[]string{"spec.limits.cpu (string to integer)"}},
		{"a version without a schema", spec(nil), nil, []string{"(a version without a schema: what it keeps is unknown)"}},
		{"widening loses nothing",
			spec(map[string]apiextensionsv1.JSONSchemaProps{"n": {Type: "integer"}, "labels": obj(map[string]apiextensionsv1.JSONSchemaProps{"team": str}), "port": {Type: "integer"}}),
			spec(map[string]apiextensionsv1.JSONSchemaProps{"n": {Type: "number"}, "labels": mapOf(str), "port": {XIntOrString: true}}),
			nil},
		{"a map kept a map",
			spec(map[string]apiextensionsv1.JSONSchemaProps{"labels": mapOf(str)}),
			spec(map[string]apiextensionsv1.JSONSchemaProps{"labels": mapOf(str)}),
			nil},
	} {
		if got := LostFields(tc.from, tc.to); !slices.Equal(got, tc.want) {
			t.Errorf("%s: LostFields = %q, want %q", tc.name, got, tc.want)
		}
	}
}
