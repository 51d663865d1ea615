package controllers_test

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/config/argocd"
)

// assertHealth checks what the GitOps tools make of a StorageMigration:
// kstatus (Flux's wait: true, kubectl wait) and Argo CD's health check, which
// must agree.
func assertHealth(t *testing.T, sm *migrationv1alpha1.StorageMigration, want kstatus.Status) {
	t.Helper()
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(sm)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: obj}
	u.SetGroupVersionKind(migrationv1alpha1.GroupVersion.WithKind("StorageMigration"))
	res, err := kstatus.Compute(u)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != want {
		t.Errorf("kstatus = %s (%s), want %s", res.Status, res.Message, want)
	}
	wantArgo := map[kstatus.Status]string{
		kstatus.CurrentStatus:    "Healthy",
		kstatus.InProgressStatus: "Progressing",
		kstatus.FailedStatus:     "Degraded",
	}[want]
	status, message, err := argocd.Health(sm)
	if err != nil {
		t.Fatal(err)
	}
	if status != wantArgo || message == "" {
		t.Errorf("Argo CD health = %s (%q), want %s with a message", status, message, wantArgo)
	}
}
