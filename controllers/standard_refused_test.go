package controllers_test

import (
	"context"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	eventsv1 "k8s.io/api/events/v1"
	svmv1 "k8s.io/api/storagemigration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/controllers"
	"github.com/restow/restow/internal/svm"
)

// TestServedStandardMigrationWhoseEndIsRefused: an admission policy refuses
// every status of a served StorageVersionMigration that says Succeeded. The
// run rewrites the 300 objects once; restow's Succeeded is refused, and
// restow says so (a StatusRefused Warning event, and Running's message,
// which the policy lets through) and tries again with backoff, recording
// the same end, not running the migration again. Once the policy is gone
// the object ends Succeeded, after one run in all. (Before, the run was
// forgotten before its end was written, and the object, still claimed,
// started a full run on every reconcile: 87 in 120 s, each with its own
// Succeeded event.)
func TestServedStandardMigrationWhoseEndIsRefused(t *testing.T) {
	version := env.StandardVersion(t)
	const name = "gadgets-end-refused"
	f := fixture{group: "refused.svm.restow.dev", kind: "Gadget", plural: "gadgets", namespaced: true}
	f.install(t, "v1beta1", "v1")
	f.createObjects(t, 300, "svm-refused")
	f.switchStorage(t, "v1")
	env.CreateStandardMigration(t, version, name, f.groupResource())
	allow := refuseSucceeded(t, version, name)

	const retryMax = 4 * time.Second
	startManagerWith(t, nil, controllers.Options{ServeStandard: true, StalledRetryBase: time.Second, StalledRetryMax: retryMax})
	refusal := env.WaitEvent(t, svm.Kind, name, controllers.StatusRefusedEventReason)
	for _, want := range []string{"restow's run ended, Succeeded: All 300 objects are stored at v1", "The run is not repeated", succeededRefused} {
		if !strings.Contains(refusal.Note, want) {
			t.Errorf("StatusRefused event %q does not say %q", refusal.Note, want)
		}
	}
	// Several retries of the refused write, each of which started a whole
	// run before: the backoff doubles from 1 s to retryMax.
	time.Sleep(3 * retryMax)
	m, err := env.StandardMigration(t.Context(), version, name)
	if err != nil {
		t.Fatal(err)
	}
	running := meta.FindStatusCondition(m.Status.Conditions, string(svmv1.MigrationRunning))
	if s := svm.StateOf(m); s != svm.Running || running == nil || !strings.Contains(running.Message, "The API server refused to record it") {
		t.Errorf("state %s, Running %+v; want Running, its message saying the end was refused", s, running)
	}
	if n := eventCount(t, svm.Kind, name, "PassStarted"); n != 1 {
		t.Fatalf("%d runs started while restow's end was refused, want 1", n)
	}

	if err := allow(t.Context()); err != nil {
		t.Fatal(err)
	}
	m = waitForStandard(t, version, name, time.Minute, "finished", func(m *svmv1.StorageVersionMigration) bool { return svm.StateOf(m).Final() })
	if s := svm.StateOf(m); s != svm.Succeeded {
		t.Fatalf("state %s, want Succeeded; conditions %+v", s, m.Status.Conditions)
	}
	f.assertStored(t, "v1", 300)
	f.assertStoredVersions(t, "v1")
	for reason, want := range map[string]int{"PassStarted": 1, migrationv1alpha1.SucceededReason: 1} {
		if n := eventCount(t, svm.Kind, name, reason); n != want {
			t.Errorf("%d %s events, want %d", n, reason, want)
		}
	}
	if got := metricValue(t, "restow_passes_total", map[string]string{"resource": f.crdName(), "result": "succeeded"}); got != 1 {
		t.Errorf("restow_passes_total{result=succeeded} = %v, want 1", got)
	}
}

// succeededRefused is the message of refuseSucceeded's policy.
const succeededRefused = "this StorageVersionMigration may not succeed"

// refuseSucceeded puts in force a ValidatingAdmissionPolicy that refuses any
// status of the StorageVersionMigration name saying Succeeded, and returns
// once a dry run of such a write is refused; the returned function removes
// the policy.
func refuseSucceeded(t *testing.T, version, name string) (allow func(context.Context) error) {
	t.Helper()
	rule := admissionregistrationv1.NamedRuleWithOperations{
		ResourceNames: []string{name},
		RuleWithOperations: admissionregistrationv1.RuleWithOperations{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{svm.Group}, APIVersions: []string{"*"}, Resources: []string{"storageversionmigrations/status"}},
		},
	}
	allow, err := env.EnforcePolicy(t.Context(), "refuse-succeeded-"+name, rule,
		"!has(object.status) || !has(object.status.conditions) || !object.status.conditions.exists(c, c.type == 'Succeeded' && c.status == 'True')", succeededRefused)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = allow(context.Background()) })
	err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		m, err := env.StandardMigration(ctx, version, name)
		if err != nil {
			return false, err
		}
		m.Status.ResourceVersion = m.ResourceVersion
		meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{Type: string(svmv1.MigrationSucceeded), Status: metav1.ConditionTrue, Reason: "Probe", Message: "probe"})
		u, err := svm.ToUnstructured(m, version)
		if err != nil {
			return false, err
		}
		err = env.Client.Status().Update(ctx, u, client.DryRunAll)
		return apierrors.IsInvalid(err) || apierrors.IsForbidden(err), nil
	})
	if err != nil {
		t.Fatalf("the policy never refused Succeeded: %v", err)
	}
	return allow
}

// eventCount is how many times events of reason were recorded about the
// object of kind and name, repeats in an event's series included.
func eventCount(t *testing.T, kind, name, reason string) int {
	t.Helper()
	var list eventsv1.EventList
	if err := env.Client.List(t.Context(), &list); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range list.Items {
		if e.Regarding.Kind != kind || e.Regarding.Name != name || e.Reason != reason {
			continue
		}
		n++
		if e.Series != nil {
			n += int(e.Series.Count) - 1
		}
		t.Logf("event of %s: %s %s (series %+v): %s", name, e.Type, e.Reason, e.Series, e.Note)
	}
	return n
}

// TestServedStandardMigrationTakenUpByTheInTreeRunner: a
// kube-controller-manager that was down when the StorageVersionMigration was
// created comes up, finds restow's claim and migrates it too. Its writes to
// the object's status may change nothing, and leave no field manager; what
// it leaves is the CRD's StorageMigrating condition naming the migration,
// which its migration runner applies as "migration-runner-controller" (here
// applied the same way, as no kube-controller-manager runs in this control
// plane). restow must step back within --status-interval: a ControllerConflict
// event, its run stopped, nothing more written, nothing pruned.
func TestServedStandardMigrationTakenUpByTheInTreeRunner(t *testing.T) {
	version := env.StandardVersion(t)
	const name, settle = "gadgets-taken-up", 10 * time.Second
	f := fixture{group: "takenup.svm.restow.dev", kind: "Gadget", plural: "gadgets", namespaced: true}
	f.install(t, "v1beta1", "v1")
	f.createObjects(t, 200, "svm-taken-up")
	f.switchStorage(t, "v1")
	startManagerWith(t, nil, controllers.Options{ServeStandard: true, SettleWindow: settle})
	env.CreateStandardMigration(t, version, name, f.groupResource())
	env.WaitEvent(t, svm.Kind, name, "PassStarted")

	crd := f.crd(t)
	original := crd.DeepCopy()
	crd.Status.Conditions = append(crd.Status.Conditions, apiextensionsv1.CustomResourceDefinitionCondition{
		Type: apiextensionsv1.StorageMigrating, Status: apiextensionsv1.ConditionTrue, Reason: "MigrationRunning",
		Message: "Migration " + name + " is running", LastTransitionTime: metav1.Now(),
	})
	if err := env.Client.Status().Patch(t.Context(), crd, client.MergeFrom(original), client.FieldOwner("migration-runner-controller")); err != nil {
		t.Fatal(err)
	}
	marked := time.Now()
	conflict := env.WaitEvent(t, svm.Kind, name, controllers.ControllerConflictReason)
	t.Logf("%s after the CRD was marked: %s", time.Since(marked).Round(time.Millisecond), conflict.Note)
	if !strings.Contains(conflict.Note, "StorageMigrating") {
		t.Errorf("ControllerConflict %q does not say what showed the other controller", conflict.Note)
	}
	// Past the end of the settle window restow's run would have reached.
	time.Sleep(settle + 2*time.Second)
	m, err := env.StandardMigration(t.Context(), version, name)
	if err != nil {
		t.Fatal(err)
	}
	if s := svm.StateOf(m); s.Final() {
		t.Errorf("state %s: restow wrote an end after another controller took the migration up", s)
	}
	f.assertStoredVersions(t, "v1beta1", "v1")
	if got := metricValue(t, "restow_passes_total", map[string]string{"resource": f.crdName(), "result": "succeeded"}); got != 0 {
		t.Errorf("restow_passes_total{result=succeeded} = %v, want 0", got)
	}
}
