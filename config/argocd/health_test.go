package argocd

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
)

// TestArgoCDHealthEdgeCases covers the statuses the controllers' scenarios
// do not stop at (they assert the script on every status they reach, beside
// kstatus): before restow looked, and after a spec change it has not seen.
func TestArgoCDHealthEdgeCases(t *testing.T) {
	cond := func(conditionType string, status metav1.ConditionStatus, reason string) metav1.Condition {
		return metav1.Condition{Type: conditionType, Status: status, Reason: reason, Message: "m"}
	}
	tests := []struct {
		name       string
		generation int64
		status     migrationv1alpha1.StorageMigrationStatus
		want       string
	}{
		{name: "no status yet", generation: 1, want: "Progressing"},
		{name: "ready for an older generation", generation: 2, want: "Progressing", status: migrationv1alpha1.StorageMigrationStatus{
			ObservedGeneration: 1, Conditions: []metav1.Condition{cond("Ready", "True", migrationv1alpha1.SucceededReason)},
		}},
		{name: "waiting for the storage version", generation: 1, want: "Progressing", status: migrationv1alpha1.StorageMigrationStatus{
			ObservedGeneration: 1, Conditions: []metav1.Condition{
				cond("Ready", "False", migrationv1alpha1.WaitingForStorageVersionReason),
				cond("Reconciling", "True", migrationv1alpha1.WaitingForStorageVersionReason),
			},
		}},
		{name: "stalled wins over a stale ready", generation: 3, want: "Degraded", status: migrationv1alpha1.StorageMigrationStatus{
			ObservedGeneration: 3, Conditions: []metav1.Condition{
				cond("Ready", "True", migrationv1alpha1.SucceededReason),
				cond("Stalled", "True", migrationv1alpha1.UnsupportedReason),
			},
		}},
		{name: "ready", generation: 3, want: "Healthy", status: migrationv1alpha1.StorageMigrationStatus{
			ObservedGeneration: 3, Conditions: []metav1.Condition{cond("Ready", "True", migrationv1alpha1.SucceededReason), cond("Stalled", "False", migrationv1alpha1.SucceededReason)},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sm := &migrationv1alpha1.StorageMigration{ObjectMeta: metav1.ObjectMeta{Name: "x", Generation: tt.generation}, Status: tt.status}
			got, msg, err := Health(sm)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("Argo CD health = %s (%q), want %s", got, msg, tt.want)
			}
		})
	}
}
