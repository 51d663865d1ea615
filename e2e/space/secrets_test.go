//go:build e2e && long

package space

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/e2e/scenario"
	"github.com/restow/restow/internal/operator"
	"github.com/restow/restow/internal/testenv"
)

const (
	// secrets Secrets of secretBytes each: about 100 MB, with etcd's own
	// pages 55% of the quota.
	secrets     = 200
	secretBytes = 500_000
	// secretsPrefix is where etcd keeps them.
	secretsPrefix = "/registry/secrets/" + namespace + "/"
)

// TestSecretsReencryptedWithinQuota: Secrets of about 500 KB fill 55% of
// etcd's quota of 192 MiB; the aescbc key rotates, and restow re-encrypts
// every one of them four times over: kubectl restow run secrets, then the
// manager with --reencrypt-resources=secrets, each reading etcd's room from
// the API server's metrics (with --etcd-quota) and from etcd itself. A pass
// that rewrote them at once would keep 100 MB more alive until the next
// compaction and pass the quota: etcd would raise NOSPACE and refuse every
// write in the cluster. Each pass keeps to its budget and waits for
// compactions; no alarm is ever raised, another client's writes are
// accepted throughout, and etcd holds every Secret under the new key.
func TestSecretsReencryptedWithinQuota(t *testing.T) {
	config := filepath.Join(t.TempDir(), "encryption.yaml")
	writeKeys(t, config, "key1", "key2")
	cp := smallEtcd(t, map[string]string{"encryption-provider-config": config, "encryption-provider-config-automatic-reload": "true"})
	etcd := etcdClient(t, cp)
	createBlobs(t, cp, secrets, secretBytes, func(i int, data []byte) client.Object {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("big-%03d", i), Namespace: namespace}, Data: map[string][]byte{"blob": data}}
	})
	dryRun(t, cp)
	keys := []string{"key1", "key2"}
	for _, tc := range []struct {
		name     string
		manager  bool
		withEtcd bool
	}{
		{"run reading the API server's metrics", false, false},
		{"run reading etcd", false, true},
		{"manager reading the API server's metrics", true, false},
		{"manager reading etcd", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fresh(t, cp, etcd)
			keys = []string{keys[1], keys[0]}
			args := []string{"--etcd-quota=192Mi"}
			if tc.withEtcd {
				args = append(args, "--etcd-endpoints="+cp.EtcdURL())
			}
			var manager *operator.Process
			if tc.manager {
				manager = scenario.StartBuiltInManager(t, cp, append([]string{"--auto-migrate-builtins=false", "--reencrypt-resources=secrets"}, args...)...)
				// A baseline, or the record of the last case's pass.
				waitRecorded(t, cp, "", scenario.ConfigHash(t, config))
			}
			writeKeys(t, config, keys...)
			scenario.WaitReloaded(t, cp, scenario.ConfigHash(t, config))
			w := watchEtcd(t, cp, etcd)
			start := time.Now()
			if tc.manager {
				sm := waitRecorded(t, cp, migrationv1alpha1.EncryptionRecordedByPass, scenario.ConfigHash(t, config))
				t.Logf("The manager re-encrypted %d Secrets in %s: %s", sm.Status.LastPass.Listed, time.Since(start).Round(time.Second), spaceMetrics(t, manager))
				if err := manager.Stop(); err != nil {
					t.Error(err)
				}
			} else if _, _, code := scenario.Restow(t, cp, append([]string{"run", "secrets"}, args...)...); code != 0 {
				t.Errorf("kubectl restow run secrets exited %d", code)
			}
			w.end(t)
			want := "k8s:enc:aescbc:v1:" + keys[0] + ":"
			if got := storedUnder(t, etcd, secretsPrefix, want); got[want] != secrets || got["all"] != secrets {
				t.Errorf("etcd holds %d Secrets, %d of them under %s; want all %d", got["all"], got[want], keys[0], secrets)
			}
		})
	}
}

// spaceMetrics says what the manager's budget did, from its metrics.
func spaceMetrics(t *testing.T, p *operator.Process) string {
	t.Helper()
	out := make([]any, 0, 8)
	for _, name := range []string{"restow_etcd_space_waits_total", "restow_etcd_compactions_seen_total", "restow_etcd_space_readings_total", "restow_etcd_budget_bytes"} {
		v, err := p.Metric(t.Context(), name, nil)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, name, v)
	}
	return fmt.Sprintf("%s %.0f, %s %.0f, %s %.0f, %s %.0f", out...)
}

// writeKeys writes an EncryptionConfiguration of Secrets with aescbc keys
// in order (the first writes), replacing the file at once so a reload never
// reads half of it.
func writeKeys(t *testing.T, path string, keys ...string) {
	t.Helper()
	tmp := path + ".new"
	testenv.WriteAESCBCConfig(t, tmp, keys...)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// waitRecorded waits until the StorageMigration of Secrets records the
// configuration of hash, by a pass or as its baseline (by, or either when
// ""), and is Ready. A pass
// waits for several compactions, each within two compaction intervals.
func waitRecorded(t *testing.T, cp *testenv.Env, by migrationv1alpha1.EncryptionRecordSource, hash string) *migrationv1alpha1.StorageMigration {
	t.Helper()
	return cp.WaitForMigration(t, "secrets", 10*time.Minute, fmt.Sprintf("recording %s by %s", hash, by), func(sm *migrationv1alpha1.StorageMigration) bool {
		e := sm.Status.Encryption
		return e != nil && (by == "" || e.RecordedBy == by) && e.ConfigHash == hash && isReady(sm)
	})
}

func isReady(sm *migrationv1alpha1.StorageMigration) bool {
	return apimeta.IsStatusConditionTrue(sm.Status.Conditions, migrationv1alpha1.ReadyCondition) && sm.Status.ObservedGeneration == sm.Generation
}

// dryRun: kubectl restow run --dry-run says what a pass would keep alive
// in etcd, from the API server's size estimate (refreshed every few
// seconds here), and that it waits for compactions.
func dryRun(t *testing.T, cp *testenv.Env) {
	t.Helper()
	testenv.WaitProgress(t, "the dry run to size the Secrets", time.Minute, func(ctx context.Context) (bool, string, error) {
		out, _, code := scenario.Restow(t, cp, "run", "secrets", "--dry-run", "--etcd-quota=192Mi")
		switch {
		case code != 0:
			return false, "", fmt.Errorf("kubectl restow run --dry-run exited %d", code)
		case !strings.Contains(out, "the API server's estimate"):
			return false, "no size estimate yet", nil
		case !strings.Contains(out, "It waits for at least"):
			return false, "", fmt.Errorf("the dry run of %s of Secrets under a 192 MiB quota says no compaction is needed:\n%s", mib(secrets*secretBytes), out)
		}
		return true, "", nil
	})
}
