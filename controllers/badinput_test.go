package controllers_test

// Bad input the API server or a cluster's admission hands back: a webhook's
// sentence where a reason belongs, and a status the API server refuses. Each
// must end in a state a user can read, never in a loop. (Answers that quote
// what they refuse, and the manager process keeping them out of its status,
// events and log: internal/operator's TestNoContentsLeak.)

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/testenv"
)

// passesOf is how many passes of resource have ended, by the manager's metric.
func passesOf(t *testing.T, resource string) float64 {
	t.Helper()
	return metricValue(t, "restow_passes_total", map[string]string{"resource": resource})
}

// assertNoLoop checks that within window, no more than most passes of
// resource end: a migration that cannot record its end must not be started
// again at once, and again.
func assertNoLoop(t *testing.T, resource string, window time.Duration, most float64) {
	t.Helper()
	before := passesOf(t, resource)
	time.Sleep(window)
	if n := passesOf(t, resource) - before; n > most {
		t.Errorf("%v passes of %s ended within %s, want at most %v: the migration loops", n, resource, window, most)
	}
}

// TestWebhookSentenceAsReasonStalls: a validating webhook refuses two
// objects with a 300-character Status.Reason (as webhooks built on older
// controller-runtime and Gatekeeper do), one with 422 and one with 403.
// status.failedObjects holds at most 64 characters of reason, so the
// migration must end Stalled naming both with the reason of the HTTP code,
// its last pass recorded, and no pass started again and again (with the
// reason copied as it came and no fallback for a refused status, it stayed
// Progressing, resuming again and again, and never named them: tried).
func TestWebhookSentenceAsReasonStalls(t *testing.T) {
	f := fixture{group: "sentence.controllers.restow.dev", kind: "Flange", plural: "flanges", namespaced: true}
	f.install(t, "v1beta1", "v1")
	keys := f.createObjects(t, 300, "sentence")
	sentence := metav1.StatusReason(strings.Repeat("this object may not change ", 12)[:300])
	refusals := map[string]int32{"obj-00007": http.StatusUnprocessableEntity, "obj-00011": http.StatusForbidden}
	hook := testenv.StartAdmissionWebhook(t, func(_ *admissionv1.AdmissionRequest, obj, _ *unstructured.Unstructured) *admissionv1.AdmissionResponse {
		if code, ok := refusals[obj.GetName()]; ok {
			return &admissionv1.AdmissionResponse{Result: &metav1.Status{Code: code, Reason: sentence, Message: "refused by the test's policy"}}
		}
		return &admissionv1.AdmissionResponse{Allowed: true}
	})
	hook.Register(t, env, f.group, f.plural, map[string]string{}, f.object("v1beta1", keys[299].Namespace, keys[299].Name, nil))
	f.switchStorage(t, "v1")

	startManager(t, nil)
	sm := f.createMigration(t, nil)
	sm = waitFor(t, sm.Name, time.Minute, "Stalled", hasCondition(migrationv1alpha1.StalledCondition, migrationv1alpha1.ObjectsFailedReason))
	want := map[string]string{"obj-00007": "Invalid", "obj-00011": "Forbidden"}
	if len(sm.Status.FailedObjects) != len(want) {
		t.Errorf("failedObjects = %+v, want %v", sm.Status.FailedObjects, want)
	}
	for _, fo := range sm.Status.FailedObjects {
		if want[fo.Name] != fo.Reason || !strings.Contains(fo.Message, "refused by the test's policy") {
			t.Errorf("failedObjects has %s with reason %q and message %q, want reason %q and the webhook's message", fo.Name, fo.Reason, fo.Message, want[fo.Name])
		}
	}
	if sm.Status.LastPass == nil || sm.Status.LastPass.Failed != 2 {
		t.Errorf("lastPass = %+v, want it recorded with 2 failed", sm.Status.LastPass)
	}
	f.fx().AssertStored(t, map[string]int{"v1": 298, "v1beta1": 2})
	f.assertStoredVersions(t, "v1beta1", "v1")
	// The tests' stalled backoff is 0.5 s doubling to 2 s: 3 retries in 5 s.
	assertNoLoop(t, "flanges."+f.group, 5*time.Second, 4)
}

// TestRefusedStatusStalls: whatever makes the API server refuse the status
// a pass writes, here a ValidatingAdmissionPolicy that refuses any
// status.lastPass on this StorageMigration, the migration ends Stalled with
// StatusRefused and the API server's answer, and is retried with backoff,
// not at once (without the fallback, it stayed Progressing, resuming again
// and again, and never said why: tried), and the same end is written again:
// one run in all.
func TestRefusedStatusStalls(t *testing.T) {
	ctx := t.Context()
	f := fixture{group: "refusedstatus.controllers.restow.dev", kind: "Sprocket", plural: "sprockets", namespaced: true}
	f.install(t, "v1beta1", "v1")
	f.createObjects(t, 50, "refusedstatus")
	f.switchStorage(t, "v1")

	const message = "status.lastPass is refused by the test"
	probe := &migrationv1alpha1.StorageMigration{
		ObjectMeta: metav1.ObjectMeta{Name: "probe." + f.group},
		Spec:       migrationv1alpha1.StorageMigrationSpec{Resource: migrationv1alpha1.GroupResource{Group: "probe.invalid", Resource: "nothing"}},
	}
	if err := env.Client.Create(ctx, probe); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), probe) })
	refuseLastPass(t, []string{probe.Name, f.crdName()}, message, probe)

	startManager(t, nil)
	sm := f.createMigration(t, nil)
	sm = waitFor(t, sm.Name, time.Minute, "Stalled", hasCondition(migrationv1alpha1.StalledCondition, migrationv1alpha1.StatusRefusedReason))
	if msg := readyMessage(sm); !strings.Contains(msg, message) {
		t.Errorf("Ready message = %q, want the policy's message", msg)
	}
	assertNoLoop(t, f.crdName(), 5*time.Second, 4)
	// The run's end is written again from the same end, not from a new run
	// (before, each try resumed the migration from its checkpoint).
	if n := eventCount(t, "StorageMigration", sm.Name, "PassStarted"); n != 1 {
		t.Errorf("%d runs started while the run's end was refused, want 1", n)
	}
}

// refuseLastPass puts in force a ValidatingAdmissionPolicy that refuses any
// status.lastPass on the StorageMigrations named, and returns once it
// refuses one on probe (one of them).
func refuseLastPass(t *testing.T, names []string, message string, probe *migrationv1alpha1.StorageMigration) {
	t.Helper()
	ctx := t.Context()
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = fmt.Sprintf("'%s'", n)
	}
	rule := admissionregistrationv1.NamedRuleWithOperations{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
		Rule: admissionregistrationv1.Rule{APIGroups: []string{migrationv1alpha1.GroupVersion.Group}, APIVersions: []string{"*"},
			Resources: []string{"storagemigrations/status"}},
	}}
	remove, err := env.EnforcePolicy(ctx, "refuse-lastpass-"+probe.Name, rule,
		fmt.Sprintf("!(object.metadata.name in [%s]) || !has(object.status) || !has(object.status.lastPass)", strings.Join(quoted, ", ")), message)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = remove(context.Background()) })
	now := metav1.Now()
	patch := fmt.Appendf(nil, `{"status":{"lastPass":{"startTime":%q,"completionTime":%q,"targetVersion":"v1"}}}`, now.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := env.Client.Status().Patch(ctx, probe, client.RawPatch(types.MergePatchType, patch))
		if err == nil {
			// Taken before the policy: take it back, and try again.
			return false, env.Client.Status().Patch(ctx, probe, client.RawPatch(types.MergePatchType, []byte(`{"status":{"lastPass":null}}`)))
		}
		return apierrors.IsInvalid(err) || apierrors.IsForbidden(err), nil
	})
	if err != nil {
		t.Fatalf("the policy never refused a status.lastPass: %v", err)
	}
}
