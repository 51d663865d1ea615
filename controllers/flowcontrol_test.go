package controllers_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/controllers"
	"github.com/restow/restow/internal/migrator"
)

// TestThrottledByPriorityAndFairness: the operator's requests land in an API
// Priority and Fairness level with a handful of seats that rejects what it
// cannot run at once, so the API server answers many of the pass's requests
// with 429 and Retry-After. The pass slows down and completes: no object
// fails, every object is at v1 in etcd, and storedVersions is pruned.
func TestThrottledByPriorityAndFairness(t *testing.T) {
	ctx := t.Context()
	const user = "restow-throttled"
	f := fixture{group: "apf.controllers.restow.dev", kind: "Gizmo", plural: "gizmos", namespaced: true}
	f.install(t, "v1beta1", "v1")
	f.createObjects(t, 500, "apf-a", "apf-b")
	f.switchStorage(t, "v1")

	// The operator's user: an administrator, so the test is about
	// throttling and not permissions, but not in system:masters, whose
	// requests are exempt from priority and fairness.
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	level := &flowcontrolv1.PriorityLevelConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		Spec: flowcontrolv1.PriorityLevelConfigurationSpec{
			Type: flowcontrolv1.PriorityLevelEnablementLimited,
			Limited: &flowcontrolv1.LimitedPriorityLevelConfiguration{
				// One share of the server's ~250: two or three seats.
				NominalConcurrencyShares: ptr.To[int32](1),
				LendablePercent:          ptr.To[int32](0),
				BorrowingLimitPercent:    ptr.To[int32](0),
				LimitResponse:            flowcontrolv1.LimitResponse{Type: flowcontrolv1.LimitResponseTypeReject},
			},
		},
	}
	schema := &flowcontrolv1.FlowSchema{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		Spec: flowcontrolv1.FlowSchemaSpec{
			PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: user},
			MatchingPrecedence:         500,
			DistinguisherMethod:        &flowcontrolv1.FlowDistinguisherMethod{Type: flowcontrolv1.FlowDistinguisherMethodByUserType},
			Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
				Subjects: []flowcontrolv1.Subject{{Kind: flowcontrolv1.SubjectKindUser, User: &flowcontrolv1.UserSubject{Name: user}}},
				ResourceRules: []flowcontrolv1.ResourcePolicyRule{{
					Verbs: []string{"patch", "update", "list"}, APIGroups: []string{f.group}, Resources: []string{f.plural},
					Namespaces: []string{flowcontrolv1.NamespaceEvery},
				}},
			}},
		},
	}
	for _, obj := range []client.Object{binding, level, schema} {
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
	}

	// Count what the operator's clients are told.
	var throttled, retryAfter, requests atomic.Int64
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(r)
			requests.Add(1)
			if err == nil && resp.StatusCode == http.StatusTooManyRequests {
				throttled.Add(1)
				if resp.Header.Get("Retry-After") != "" {
					retryAfter.Add(1)
				}
			}
			return resp, err
		})
	}
	// The default retry backoff, as the manager runs it.
	startManagerWith(t, cfg, controllers.Options{RetryBackoff: migrator.DefaultRetryBackoff})
	start := time.Now()
	sm := f.createMigration(t, nil)
	sm = waitFor(t, sm.Name, 5*time.Minute, "Ready", readyAt("v1"))

	t.Logf("%d objects in %s; %d of %d requests answered 429, %d of them with Retry-After",
		500, time.Since(start).Round(time.Millisecond), throttled.Load(), requests.Load(), retryAfter.Load())
	if throttled.Load() == 0 {
		t.Fatal("the API server never answered 429: the priority level did not throttle the operator, so this test shows nothing")
	}
	if retryAfter.Load() != throttled.Load() {
		t.Errorf("%d of %d 429 answers had Retry-After", retryAfter.Load(), throttled.Load())
	}
	if sm.Status.LastPass == nil || sm.Status.LastPass.Failed != 0 || len(sm.Status.FailedObjects) != 0 {
		t.Errorf("last pass %+v, failed objects %+v: want none failed", sm.Status.LastPass, sm.Status.FailedObjects)
	}
	f.assertStored(t, "v1", 500)
	f.assertStoredVersions(t, "v1")
	assertNoStalled(t, sm)
}

// assertNoStalled fails if the migration was ever reported Stalled, as far as
// its conditions still show.
func assertNoStalled(t *testing.T, sm *migrationv1alpha1.StorageMigration) {
	t.Helper()
	for _, c := range sm.Status.Conditions {
		if c.Type == migrationv1alpha1.StalledCondition && c.Status == metav1.ConditionTrue {
			t.Errorf("condition %s=True: %s", c.Type, c.Message)
		}
	}
}
