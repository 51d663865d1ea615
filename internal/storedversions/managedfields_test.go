package storedversions

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestRepointManagedFields(t *testing.T) {
	const g = "stable.example.com"
	entry := func(manager string, op metav1.ManagedFieldsOperationType, version, fields string) metav1.ManagedFieldsEntry {
		return metav1.ManagedFieldsEntry{Manager: manager, Operation: op, APIVersion: g + "/" + version, FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(fields)}
	}
	tests := []struct {
		name        string
		in          []metav1.ManagedFieldsEntry
		served      []string
		wantChanged bool
		want        []metav1.ManagedFieldsEntry
	}{
		{
			name:   "nothing stale",
			in:     []metav1.ManagedFieldsEntry{entry("alice", metav1.ManagedFieldsOperationApply, "v1beta1", `{"f:spec":{"f:a":{}}}`)},
			served: []string{"v1beta1", "v1"},
		},
		{
			name: "stale entries re-pointed, served ones kept",
			in: []metav1.ManagedFieldsEntry{
				entry("alice", metav1.ManagedFieldsOperationApply, "v1beta1", `{"f:spec":{"f:a":{}}}`),
				entry("bob", metav1.ManagedFieldsOperationApply, "v1", `{"f:spec":{"f:b":{}}}`),
			},
			served:      []string{"v1"},
			wantChanged: true,
			want: []metav1.ManagedFieldsEntry{
				entry("alice", metav1.ManagedFieldsOperationApply, "v1", `{"f:spec":{"f:a":{}}}`),
				entry("bob", metav1.ManagedFieldsOperationApply, "v1", `{"f:spec":{"f:b":{}}}`),
			},
		},
		{
			name: "colliding updates of one manager merged",
			in: []metav1.ManagedFieldsEntry{
				entry("kubectl-edit", metav1.ManagedFieldsOperationUpdate, "v1beta1", `{"f:spec":{"f:a":{}}}`),
				entry("kubectl-edit", metav1.ManagedFieldsOperationUpdate, "v1", `{"f:spec":{"f:b":{}}}`),
			},
			served:      []string{"v1"},
			wantChanged: true,
			want: []metav1.ManagedFieldsEntry{
				entry("kubectl-edit", metav1.ManagedFieldsOperationUpdate, "v1", `{"f:spec":{"f:a":{},"f:b":{}}}`),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, changed, err := RepointManagedFields(tt.in, g, tt.served, "v1")
			if err != nil {
				t.Fatal(err)
			}
			if changed != tt.wantChanged {
				t.Fatalf("changed = %v, want %v", changed, tt.wantChanged)
			}
			if !changed {
				return
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %d entries, want %d: %+v", len(got), len(tt.want), got)
			}
			for i := range got {
				if got[i].Manager != tt.want[i].Manager || got[i].APIVersion != tt.want[i].APIVersion || got[i].FieldsV1.GetRawString() != tt.want[i].FieldsV1.GetRawString() {
					t.Errorf("entry %d = %s %s %s, want %s %s %s", i, got[i].Manager, got[i].APIVersion, got[i].FieldsV1.GetRawString(),
						tt.want[i].Manager, tt.want[i].APIVersion, tt.want[i].FieldsV1.GetRawString())
				}
			}
		})
	}
}
