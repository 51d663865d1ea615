package operator_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/operator"
	"github.com/restow/restow/internal/testenv"
)

// TestCleanStop: a manager stopped with SIGTERM (a rollout, a lost node)
// in the middle of its work, with the default flags (built-in resources
// watched, a CRD's pass under way), exits cleanly and logs no error for
// the requests it cancelled itself: a user's alert on error logs must not
// fire on every rollout. Requests cut short by the stop are debug lines.
func TestCleanStop(t *testing.T) {
	fx := testenv.Fixture{Env: env, Group: "stop.restow.dev", Kind: "Pebble", Plural: "pebbles", Namespaced: true}
	fx.Install(t, "v1beta1", "v1")
	fx.CreateObjects(t, "v1beta1", 5000, func(i int) map[string]any { return map[string]any{"n": int64(i)} }, "clean-stop")
	fx.SwitchStorage(t, "v1")
	t.Cleanup(func() {
		var list migrationv1alpha1.StorageMigrationList
		if err := env.Client.List(context.Background(), &list); err != nil {
			return
		}
		for i := range list.Items {
			if sm := &list.Items[i]; sm.Labels[migrationv1alpha1.BuiltInLabel] == "true" || sm.Name == fx.CRDName() {
				_ = env.Client.Delete(context.Background(), sm)
			}
		}
	})

	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	manager := operator.StartProcess(t, operator.ProcessOptions{Kubeconfig: kubeconfig, Args: []string{
		// As users run it: StartProcess turns this off for other tests.
		"--auto-migrate-builtins=true",
	}})
	testenv.WaitProgress(t, "the pass to rewrite objects", time.Minute, func(ctx context.Context) (bool, string, error) {
		sm := &migrationv1alpha1.StorageMigration{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: fx.CRDName()}, sm); err != nil {
			return false, "no StorageMigration yet", client.IgnoreNotFound(err)
		}
		p := sm.Status.Progress
		if p == nil {
			return false, "no progress yet", nil
		}
		return p.Done() > 0, "rewriting", nil
	})
	if err := manager.Stop(); err != nil {
		t.Fatalf("the manager did not stop cleanly: %v", err)
	}
	var errorLines []string
	for line := range strings.SplitSeq(manager.Logs(), "\n") {
		if strings.Contains(line, `"level":"error"`) {
			errorLines = append(errorLines, line)
		}
	}
	if len(errorLines) > 0 {
		t.Errorf("the manager logged %d errors while it stopped, first: %s", len(errorLines), errorLines[0])
	}
}
