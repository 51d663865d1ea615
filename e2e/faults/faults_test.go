//go:build e2e

// Package faults runs the manager binary against the source-built control
// plane while a part it depends on goes away: a restarted API server and a
// conversion webhook that refuses connections, beside the baseline with no
// fault. Every scenario ends with proof read from etcd. Run with
// `make test-e2e`.
package faults

import (
	"os"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/e2e/scenario"
	"github.com/restow/restow/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { scenario.Main(m, &env) }

// webhookDown is how long the conversion webhook stays away in
// TestConversionWebhookDown: RESTOW_E2E_WEBHOOK_DOWN, by default 30 s.
func webhookDown(t *testing.T) time.Duration {
	return durationFromEnv(t, "RESTOW_E2E_WEBHOOK_DOWN", 30*time.Second)
}

// TestBaseline: no fault. The automatic migration after a storage switch,
// with the manager binary, as every other scenario starts.
func TestBaseline(t *testing.T) {
	s := scenario.New(t, env, "baseline")
	s.StartManager("manager")
	start := time.Now()
	s.SwitchStorage("v1")
	s.WaitMigrated("v1")
	t.Logf("%d objects migrated in %s", s.N, time.Since(start).Round(time.Millisecond))
	s.AssertDone("v1")
}

// TestAPIServerRestartMidPass: kube-apiserver is stopped mid-pass and
// started again over the same etcd; the manager rides it out.
func TestAPIServerRestartMidPass(t *testing.T) {
	s := scenario.New(t, env, "restart")
	manager := s.StartManager("manager")
	s.SwitchStorage("v1")
	s.WaitMidPass()
	stopped, ready, err := env.RestartAPIServer(t.Context(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-apiserver stopped %s after SIGTERM and was ready again after %s", stopped.Round(time.Millisecond), ready.Round(time.Millisecond))
	s.WaitMigrated("v1")
	if manager.Exited() {
		t.Fatalf("the manager exited:\n%s", manager.Logs())
	}
	s.AssertDone("v1")
}

// TestConversionWebhookDown: the CRD converts through a webhook, which goes
// away mid-pass (connection refused) and comes back; meanwhile the
// migration says why it waits and nothing is pruned.
func TestConversionWebhookDown(t *testing.T) {
	webhook := testenv.StartConversionWebhook(t, func(*unstructured.Unstructured, string) error { return nil })
	s := scenario.New(t, env, "webhook", scenario.WithConversion(webhook.Conversion()))
	s.StartManager("manager")
	s.SwitchStorage("v1")
	s.WaitMidPass()
	webhook.Stop()
	down := time.Now()
	message := s.WaitCondition(migrationv1alpha1.ReconcilingCondition, migrationv1alpha1.TransientErrorReason, webhookDown(t))
	t.Logf("while the webhook is down: Reconciling/TransientError %q", message)
	if !strings.Contains(message, "conversion webhook") {
		t.Errorf("the reason does not name the conversion webhook: %q", message)
	}
	time.Sleep(webhookDown(t) - time.Since(down))
	counts, err := s.StoredCounts(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if counts["v1beta1"] == 0 {
		t.Fatalf("etcd holds %v: the pass finished without the webhook, so the fault hit nothing", counts)
	}
	t.Logf("webhook back after %s; etcd holds %v", time.Since(down).Round(time.Millisecond), counts)
	if err := webhook.Restart(); err != nil {
		t.Fatal(err)
	}
	s.WaitMigrated("v1")
	s.AssertDone("v1")
}

func durationFromEnv(t *testing.T, name string, def time.Duration) time.Duration {
	if v := strings.TrimSpace(os.Getenv(name)); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("%s=%q: %v", name, v, err)
		}
		return d
	}
	return def
}
