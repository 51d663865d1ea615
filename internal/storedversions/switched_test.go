package storedversions

import (
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// LastStorageSwitch dates the last storage switch only where the CRD's
// managedFields do: the newest owner of a storage flag, and nothing where an owner has no time or the storage
// version's flag has no owner.
func TestLastStorageSwitch(t *testing.T) {
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(minutes int) *metav1.Time {
		return &metav1.Time{Time: created.Add(time.Duration(minutes) * time.Minute)}
	}
	flags := func(versions ...string) *metav1.FieldsV1 {
		raw := `{"f:spec":{"f:versions":{`
		for i, v := range versions {
			if i > 0 {
				raw += ","
			}
			raw += `"k:{\"name\":\"` + v + `\"}":{".":{},"f:name":{},"f:storage":{}}`
		}
		return metav1.NewFieldsV1(raw + `}}}`)
	}
	other := metav1.NewFieldsV1(`{"f:metadata":{"f:labels":{"f:team":{}}},"f:spec":{"f:versions":{"k:{\"name\":\"v1\"}":{"f:schema":{}}}}}`)
	entry := func(manager string, time *metav1.Time, fields *metav1.FieldsV1) metav1.ManagedFieldsEntry {
		return metav1.ManagedFieldsEntry{Manager: manager, Operation: metav1.ManagedFieldsOperationApply, Time: time, FieldsType: "FieldsV1", FieldsV1: fields}
	}
	tests := []struct {
		name    string
		entries []metav1.ManagedFieldsEntry
		want    *metav1.Time
	}{
		{"the one owner's time", []metav1.ManagedFieldsEntry{entry("helm", at(10), flags("v1beta1", "v1"))}, at(10)},
		{"the newest of the owners of a flag", []metav1.ManagedFieldsEntry{
			entry("helm", at(10), flags("v1beta1", "v1")), entry("argocd", at(30), flags("v1")), entry("labeler", at(50), other),
		}, at(30)},
		{"a later write that owns no flag does not count", []metav1.ManagedFieldsEntry{
			entry("helm", at(10), flags("v1beta1", "v1")), entry("labeler", at(50), other),
		}, at(10)},
		{"an owner of the old version's flag counts", []metav1.ManagedFieldsEntry{
			entry("helm", at(10), flags("v1")), entry("kubectl", at(20), flags("v1beta1")),
		}, at(20)},
		{"the status subresource does not count", []metav1.ManagedFieldsEntry{
			entry("helm", at(10), flags("v1beta1", "v1")), {Manager: "apiserver", Subresource: "status", Time: at(40), FieldsV1: flags("v1")},
		}, at(10)},
		{"an owner without a time: unknown", []metav1.ManagedFieldsEntry{
			entry("helm", at(10), flags("v1beta1", "v1")), entry("kubectl", nil, flags("v1")),
		}, nil},
		{"the storage version's flag owned by none: unknown", []metav1.ManagedFieldsEntry{entry("helm", at(10), flags("v1beta1")), entry("labeler", at(50), other)}, nil},
		{"no managedFields: unknown", nil, nil},
		{"an owner of spec.versions, an atomic list", []metav1.ManagedFieldsEntry{
			entry("helm", at(10), metav1.NewFieldsV1(`{"f:spec":{"f:group":{},"f:versions":{}}}`)), entry("labeler", at(50), other),
		}, at(10)},
		{"unreadable fields: unknown", []metav1.ManagedFieldsEntry{
			entry("helm", at(10), flags("v1beta1", "v1")), entry("kubectl", at(20), metav1.NewFieldsV1(`{"f:spec":`)),
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			crd := &apiextensionsv1.CustomResourceDefinition{
				ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.Time{Time: created}, ManagedFields: tt.entries},
				Spec: apiextensionsv1.CustomResourceDefinitionSpec{Versions: []apiextensionsv1.CustomResourceDefinitionVersion{
					{Name: "v1beta1", Served: true}, {Name: "v1", Served: true, Storage: true},
				}},
			}
			ev, ok := LastStorageSwitch(crd)
			switch {
			case tt.want == nil && ok:
				t.Errorf("dated the switch %s (%s), want unknown", ev.At, ev.Source)
			case tt.want != nil && !ok:
				t.Errorf("unknown, want %s", tt.want.Time)
			case tt.want != nil && !ev.At.Equal(tt.want.Time):
				t.Errorf("dated the switch %s (%s), want %s", ev.At, ev.Source, tt.want.Time)
			}
		})
	}
}
