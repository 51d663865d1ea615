package controllers_test

import (
	"encoding/json"
	"os"
	"testing"

	lua "github.com/yuin/gopher-lua"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
)

// argoCDHealthScript is the health check restow ships for Argo CD.
const argoCDHealthScript = "../config/argocd/storagemigration-health.lua"

// argoCDHealth runs the shipped health check on the StorageMigration's JSON
// the way Argo CD does: the object is the global obj, and the script returns
// a table with status and message.
func argoCDHealth(t *testing.T, sm *migrationv1alpha1.StorageMigration) (status, message string) {
	t.Helper()
	script, err := os.ReadFile(argoCDHealthScript)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(sm)
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil {
		t.Fatal(err)
	}
	state := lua.NewState()
	defer state.Close()
	state.SetGlobal("obj", toLua(state, obj))
	if err := state.DoString(string(script)); err != nil {
		t.Fatalf("%s: %v", argoCDHealthScript, err)
	}
	hs, ok := state.Get(-1).(*lua.LTable)
	if !ok {
		t.Fatalf("%s returned %s, want a table", argoCDHealthScript, state.Get(-1).Type())
	}
	return lua.LVAsString(hs.RawGetString("status")), lua.LVAsString(hs.RawGetString("message"))
}

// toLua converts decoded JSON to Lua values, as Argo CD hands objects to its
// health checks: objects and arrays become tables, arrays indexed from 1.
func toLua(state *lua.LState, v any) lua.LValue {
	switch v := v.(type) {
	case map[string]any:
		t := state.NewTable()
		for k, e := range v {
			t.RawSetString(k, toLua(state, e))
		}
		return t
	case []any:
		t := state.NewTable()
		for _, e := range v {
			t.Append(toLua(state, e))
		}
		return t
	case string:
		return lua.LString(v)
	case float64:
		return lua.LNumber(v)
	case bool:
		return lua.LBool(v)
	}
	return lua.LNil
}

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
	status, message := argoCDHealth(t, sm)
	if status != wantArgo || message == "" {
		t.Errorf("Argo CD health = %s (%q), want %s with a message", status, message, wantArgo)
	}
}

// TestArgoCDHealthEdgeCases covers the statuses the envtest scenarios do not
// stop at: before restow looked, and after a spec change it has not seen.
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
			if got, msg := argoCDHealth(t, sm); got != tt.want {
				t.Errorf("Argo CD health = %s (%q), want %s", got, msg, tt.want)
			}
		})
	}
}
