package cli_test

import (
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/restow/restow/internal/cli"
)

// TestRunWritesNothingWithoutEtcdsSize: a user with every right a pass
// needs but get on /metrics, where the pass reads etcd's database size
// before it writes, gets exit 2 naming the missing right, and etcd holds
// every object at the old version: a budget that read nothing is no budget.
func TestRunWritesNothingWithoutEtcdsSize(t *testing.T) {
	w := installSwitched(t, "nosize.cli.restow.dev", 20)
	const user = "restow-test-no-metrics"
	grant(t, user, []rbacv1.PolicyRule{
		{APIGroups: []string{w.group}, Resources: []string{"widgets"}, Verbs: []string{"list", "update", "patch"}},
		{APIGroups: []string{"apiextensions.k8s.io"}, Resources: []string{"customresourcedefinitions"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"apiextensions.k8s.io"}, Resources: []string{"customresourcedefinitions/status"}, Verbs: []string{"patch"}},
		// To count the API servers rather than wait --apiserver-lag-bound.
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"list"}},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list"}},
	})
	as := restowAs(t, user)
	// The authorizer sees the binding within moments.
	var errOut string
	code := -1
	for range 50 {
		if _, errOut, code = as("run", w.crdName(), "--settle-window", "1s"); !strings.Contains(errOut, "customresourcedefinitions") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code != cli.ExitPending || !strings.Contains(errOut, "/metrics") {
		t.Errorf("run without get on /metrics exited %d, want %d naming /metrics:\n%s", code, cli.ExitPending, errOut)
	}
	w.assertStored(t, map[string]int{"v1beta1": 20})
	w.assertStoredVersions(t, "v1beta1", "v1")
}
