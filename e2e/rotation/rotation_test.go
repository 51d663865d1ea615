//go:build e2e

// Package rotation runs restow's manager across encryption key rotations:
// Secrets written under one key are re-encrypted under the next once the
// API server reports it loaded it, and kubectl restow verify shows every
// one under the new key from etcd. Run with `make test-e2e`.
package rotation

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/e2e/scenario"
	"github.com/restow/restow/internal/cli"
	"github.com/restow/restow/internal/testenv"
	"github.com/restow/restow/internal/testenv/kmsplugin"
)

const (
	// name is the StorageMigration restow creates for Secrets.
	name      = "secrets"
	namespace = "vault"
	// n Secrets are written before the rotation.
	n = 200
	// planted is every Secret's value: verify must never print it.
	planted = "rotation-e2e-planted-value"
)

// TestMain gives controller-runtime's clients, which kubectl restow verify
// makes, a logger.
func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	os.Exit(m.Run())
}

// TestAESCBCKeyRotation: Secrets under aescbc key1; restow, started then,
// records the encryption configuration as its baseline and rewrites
// nothing. The configuration is reloaded with key2 first (key1 still
// reads): restow sees the API server report the new configuration's hash
// in its metrics and re-encrypts every Secret under key2, which kubectl
// restow verify --expect-key aescbc:key2 confirms from etcd. Then key1 is removed,
// and every Secret still reads after the API server restarted.
func TestAESCBCKeyRotation(t *testing.T) {
	config := filepath.Join(t.TempDir(), "encryption.yaml")
	writeConfig(t, config, aescbc("key1", "key2"))
	cp := testenv.Start(t, testenv.Options{CRDDirectoryPaths: []string{scenario.CRDDirectory}, APIServerArgs: map[string]string{
		"encryption-provider-config": config, "encryption-provider-config-automatic-reload": "true",
	}})
	createSecrets(t, cp)
	// The defaults users run: the built-in discovery interval of 10
	// minutes, and the encryption check every 30 s.
	startManager(t, cp, "--builtin-discovery-interval=10m0s")
	baseline := waitEncryption(t, cp, migrationv1alpha1.EncryptionRecordedByBaseline, scenario.ConfigHash(t, config))
	if baseline.Status.LastPass != nil {
		t.Fatalf("a pass ran at first sight: %+v", baseline.Status.LastPass)
	}
	verifyKey(t, cp, "aescbc:key1", 0)
	verifyKey(t, cp, "aescbc:key2", cli.ExitMismatch)

	before := scenario.APIRequests(t, cp, "", "secrets")
	rotated := time.Now()
	writeConfig(t, config, aescbc("key2", "key1"))
	reloaded := waitReloaded(t, cp, scenario.ConfigHash(t, config))
	sm := waitEncryption(t, cp, migrationv1alpha1.EncryptionRecordedByPass, scenario.ConfigHash(t, config))
	logPass(t, sm, rotated)
	if took := sm.Status.LastPass.CompletionTime.Sub(reloaded); took > 90*time.Second {
		t.Errorf("with the default flags every Secret was re-encrypted %s after the API server's reload, want within 90 s", took.Round(time.Second))
	} else {
		t.Logf("With the default flags: every Secret re-encrypted %s after the API server's reload (%s after the file changed)",
			took.Round(100*time.Millisecond), sm.Status.LastPass.CompletionTime.Sub(rotated).Round(100*time.Millisecond))
	}
	logRequests(t, before, scenario.APIRequests(t, cp, "", "secrets"))
	verifyKey(t, cp, "aescbc:key2", 0)

	// key1 is no longer needed: remove it, and restart the API server so
	// that it reads every Secret from etcd again (its watch cache holds
	// them decrypted): each still reads.
	writeConfig(t, config, aescbc("key2"))
	if _, _, err := cp.RestartAPIServer(t.Context(), 0); err != nil {
		t.Fatal(err)
	}
	assertSecretsRead(t, cp)
	verifyKey(t, cp, "aescbc:key2", 0)
}

// TestKMSv2KeyIDChange: Secrets encrypted by a KMS v2 plugin over gRPC at
// key ID k1; the plugin's key ID changes to k2 without any change of the
// configuration. kube-apiserver sees it at its next Status call and says so
// in its metrics; restow re-encrypts every Secret, and verify shows each
// under the new key ID.
func TestKMSv2KeyIDChange(t *testing.T) {
	plugin, config, cp := startKMS(t)
	createSecrets(t, cp)
	startManager(t, cp)
	baseline := waitEncryption(t, cp, migrationv1alpha1.EncryptionRecordedByBaseline, scenario.ConfigHash(t, config))
	if len(baseline.Status.Encryption.KMSKeyIDHashes) != 1 {
		t.Fatalf("baseline %+v: want the key ID hash of one KMS v2 provider", baseline.Status.Encryption)
	}
	verifyKey(t, cp, "k1", 0)

	before := scenario.APIRequests(t, cp, "", "secrets")
	rotated := time.Now()
	plugin.SetKeyID("k2")
	// kube-apiserver asks a healthy plugin for its status once a minute.
	sm := cp.WaitForMigration(t, name, 3*time.Minute, "re-encrypted under a new KMS v2 key ID", func(sm *migrationv1alpha1.StorageMigration) bool {
		e := sm.Status.Encryption
		return e != nil && e.RecordedBy == migrationv1alpha1.EncryptionRecordedByPass && len(e.KMSKeyIDHashes) == 1 &&
			e.KMSKeyIDHashes[0] != baseline.Status.Encryption.KMSKeyIDHashes[0] && isReady(sm)
	})
	logPass(t, sm, rotated)
	logRequests(t, before, scenario.APIRequests(t, cp, "", "secrets"))
	verifyKey(t, cp, "k2", 0)
	assertSecretsRead(t, cp)
}

// TestVerifyKMSv2ProviderName: Secrets under KMS v2 key ID k1; the
// plugin's key ID becomes k2 and one Secret is written again under it.
// verify --expect-key kmsv2:testkms, a provider whose objects are now under
// two key IDs, is a mismatch naming both, not a pass; once kubectl restow
// run rewrote every Secret, it passes, as does the key ID k2.
func TestVerifyKMSv2ProviderName(t *testing.T) {
	plugin, _, cp := startKMS(t)
	createSecrets(t, cp)
	verifyKey(t, cp, "kmsv2:testkms", 0)

	// The API server asks the plugin for its key ID at start.
	plugin.SetKeyID("k2")
	if _, _, err := cp.RestartAPIServer(t.Context(), 0); err != nil {
		t.Fatal(err)
	}
	rewritten := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s-0000", Namespace: namespace}}
	testenv.WaitProgress(t, "a Secret written under key ID k2", time.Minute, func(ctx context.Context) (bool, string, error) {
		patch := client.RawPatch(types.MergePatchType, []byte(fmt.Sprintf(`{"metadata":{"annotations":{"written":"%d"}}}`, time.Now().UnixNano())))
		// A write that fails right after the restart is tried again.
		said := "not yet"
		if err := cp.Client.Patch(ctx, rewritten, patch); err != nil {
			said = "writing: " + err.Error()
		} else if out, _, _ := scenario.Restow(t, cp, "verify", name, "--etcd-endpoints", cp.EtcdURL(), "--names", "0"); strings.Contains(out, "(key ID k2) 1") {
			return true, "", nil
		}
		return false, said, nil
	})
	out, _, code := scenario.Restow(t, cp, "verify", name, "--etcd-endpoints", cp.EtcdURL(), "--expect-key", "kmsv2:testkms")
	if want := fmt.Sprintf("the objects under kmsv2:testkms are under 2 KMS v2 key IDs (k1 %d, k2 1)", n-1); code != cli.ExitMismatch || !strings.Contains(out, want) || strings.Contains(out, planted) {
		t.Errorf("--expect-key kmsv2:testkms mid-rotation exited %d, want %d saying %q", code, cli.ExitMismatch, want)
	}
	verifyKey(t, cp, "k2", cli.ExitMismatch)
	if _, _, code := scenario.Restow(t, cp, "run", name); code != 0 {
		t.Fatalf("kubectl restow run %s exited %d", name, code)
	}
	verifyKey(t, cp, "kmsv2:testkms", 0)
	verifyKey(t, cp, "k2", 0)
}

// TestRotationWaitsForEveryServer: two API servers on addresses of their
// own, without automatic reload. The configuration file gets key2 first,
// and only the first server restarts and loads it: the second still
// encrypts with key1, and a Secret rewritten through it stays under key1.
// While they disagree restow rewrites nothing (no Secret's key in etcd
// moves) and says which server loaded which configuration; once the second
// restarts too, it re-encrypts every Secret under key2.
func TestRotationWaitsForEveryServer(t *testing.T) {
	config := filepath.Join(t.TempDir(), "encryption.yaml")
	writeConfig(t, config, aescbc("key1", "key2"))
	cp := testenv.Start(t, testenv.Options{CRDDirectoryPaths: []string{scenario.CRDDirectory}, APIServers: 2, OwnAddresses: true,
		APIServerArgs: map[string]string{"encryption-provider-config": config}})
	cp.WaitForSignals(t, 2, 2)
	createSecrets(t, cp)
	startManager(t, cp)
	old := scenario.ConfigHash(t, config)
	waitEncryption(t, cp, migrationv1alpha1.EncryptionRecordedByBaseline, old)

	writeConfig(t, config, aescbc("key2", "key1"))
	if err := cp.RestartOwnAPIServer(t.Context(), 0); err != nil {
		t.Fatal(err)
	}
	// The restarted server's address is back in the EndpointSlices first:
	// until then restow cannot read each server, and says that instead.
	cp.WaitForSignals(t, 2, 2)
	// While the servers disagree: no Secret written, no pass, and the
	// StorageMigration names the server that still has the old key, at
	// its next look: within the servers' backoff cap (30 s) and a check,
	// after at least 20 s of holding.
	lagging := strings.TrimPrefix(cp.ServerConfig(1).Host, "https://")
	written := lastWrite(t, cp)
	sm := &migrationv1alpha1.StorageMigration{}
	said := false
	start := time.Now()
	for time.Since(start) < 20*time.Second || !said && time.Since(start) < 90*time.Second {
		time.Sleep(time.Second)
		if now := lastWrite(t, cp); now != written {
			t.Fatalf("a Secret was written (etcd revision %d, %d before) while one API server still encrypted with key1", now, written)
		}
		if err := cp.Client.Get(t.Context(), client.ObjectKey{Name: name}, sm); err != nil {
			t.Fatal(err)
		}
		if sm.Status.Progress != nil || sm.Status.Encryption.RecordedBy != migrationv1alpha1.EncryptionRecordedByBaseline {
			t.Fatalf("a pass ran while one API server still encrypted with key1: progress %+v, encryption %+v", sm.Status.Progress, sm.Status.Encryption)
		}
		c := apimeta.FindStatusCondition(sm.Status.Conditions, migrationv1alpha1.ReconcilingCondition)
		if c != nil && c.Status == metav1.ConditionTrue && strings.Contains(c.Message, lagging+" has loaded encryption configuration "+old) && !said {
			said = true
			t.Logf("While the servers disagree: %s: %s", c.Reason, c.Message)
		}
	}
	if !said {
		t.Errorf("in %s of disagreement restow never said that %s has loaded %s", time.Since(start).Round(time.Second), lagging, old)
	}
	verifyKey(t, cp, "aescbc:key1", 0)

	rotated := time.Now()
	if err := cp.RestartOwnAPIServer(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	sm = waitEncryption(t, cp, migrationv1alpha1.EncryptionRecordedByPass, scenario.ConfigHash(t, config))
	logPass(t, sm, rotated)
	verifyKey(t, cp, "aescbc:key2", 0)
}

// logRequests logs the requests for Secrets between two counts, per
// Secret: what a re-encryption costs the API server.
func logRequests(t *testing.T, before, after map[string]float64) {
	t.Helper()
	var parts []string
	total := 0.0
	for verb, v := range after {
		if d := v - before[verb]; d > 0 {
			parts = append(parts, fmt.Sprintf("%s %.0f", verb, d))
			total += d
		}
	}
	slices.Sort(parts)
	t.Logf("Requests for Secrets from the rotation to the recorded pass: %s; %.3f per Secret", strings.Join(parts, ", "), total/n)
}

// lastWrite is the etcd revision of the last write of any Secret in the
// test's namespace: it moves when one is rewritten, whatever key it is
// stored under.
func lastWrite(t *testing.T, cp *testenv.Env) int64 {
	t.Helper()
	etcd, err := clientv3.New(clientv3.Config{Endpoints: []string{cp.EtcdURL()}, DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	resp, err := etcd.Get(t.Context(), "/registry/secrets/"+namespace+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) < n {
		t.Fatalf("etcd holds %d Secrets in %s, want %d", len(resp.Kvs), namespace, n)
	}
	var last int64
	for _, kv := range resp.Kvs {
		last = max(last, kv.ModRevision)
	}
	return last
}

// aescbc is the providers of an EncryptionConfiguration with aescbc keys in
// order (the first writes, all read), then identity.
func aescbc(keys ...string) string {
	// Fixed test keys of 32 bytes each, base64: each name keeps its key.
	secrets := map[string]string{"key1": "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=", "key2": "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA="}
	var b strings.Builder
	b.WriteString("  - aescbc:\n      keys:\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "      - name: %s\n        secret: %s\n", k, secrets[k])
	}
	return b.String()
}

// startKMS starts a KMS v2 plugin over gRPC at key ID k1, and a control
// plane that encrypts Secrets with it (provider testkms).
func startKMS(t *testing.T) (plugin *kmsplugin.Plugin, config string, cp *testenv.Env) {
	t.Helper()
	plugin, err := kmsplugin.Start("k1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(plugin.Stop)
	config = filepath.Join(t.TempDir(), "encryption.yaml")
	writeConfig(t, config, fmt.Sprintf("  - kms:\n      apiVersion: v2\n      name: testkms\n      endpoint: %s\n      timeout: 5s\n", plugin.Endpoint))
	cp = testenv.Start(t, testenv.Options{CRDDirectoryPaths: []string{scenario.CRDDirectory}, APIServerArgs: map[string]string{"encryption-provider-config": config}})
	return plugin, config, cp
}

// writeConfig writes an EncryptionConfiguration of Secrets with providers
// and identity last, replacing the file at once (a rename), so that a
// reload never reads half of it.
func writeConfig(t *testing.T, path, providers string) {
	t.Helper()
	text := "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n" + providers + "  - identity: {}\n"
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func createSecrets(t *testing.T, cp *testenv.Env) {
	t.Helper()
	if err := cp.EnsureNamespaces(t.Context(), namespace); err != nil {
		t.Fatal(err)
	}
	err := cp.CreateObjects(t.Context(), n, func(i int) client.Object {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("s-%04d", i), Namespace: namespace}, StringData: map[string]string{"password": planted}}
	})
	if err != nil {
		t.Fatal(err)
	}
}

// startManager runs the manager binary re-encrypting Secrets, with every
// other built-in resource left alone.
func startManager(t *testing.T, cp *testenv.Env, args ...string) {
	t.Helper()
	scenario.StartBuiltInManager(t, cp, append([]string{"--auto-migrate-builtins=false", "--reencrypt-resources=secrets"}, args...)...)
}

// waitEncryption waits until the StorageMigration of Secrets records the
// configuration of hash, by a pass or as its baseline, and is Ready.
func waitEncryption(t *testing.T, cp *testenv.Env, by migrationv1alpha1.EncryptionRecordSource, hash string) *migrationv1alpha1.StorageMigration {
	t.Helper()
	// A reload comes within a minute of the file's change.
	sm := cp.WaitForMigration(t, name, 3*time.Minute, fmt.Sprintf("recording %s by %s", hash, by), func(sm *migrationv1alpha1.StorageMigration) bool {
		e := sm.Status.Encryption
		return e != nil && e.RecordedBy == by && e.ConfigHash == hash && isReady(sm)
	})
	t.Logf("Recorded by %s: %+v; Ready: %s", by, sm.Status.Encryption.EncryptionState, apimeta.FindStatusCondition(sm.Status.Conditions, migrationv1alpha1.ReadyCondition).Message)
	return sm
}

// logPass logs the last pass: how long after the rotation it ended, and
// its requests (one list per page, one write per object).
func logPass(t *testing.T, sm *migrationv1alpha1.StorageMigration, rotated time.Time) {
	t.Helper()
	p := sm.Status.LastPass
	if p == nil || p.Failed > 0 || p.Listed < n {
		t.Fatalf("last pass %+v: want %d listed, no failure", p, n)
	}
	t.Logf("Re-encrypted: %d listed, %d migrated, %d already stored in %s; ended %s after the rotation",
		p.Listed, p.Migrated, p.AlreadyStored, p.CompletionTime.Sub(p.StartTime.Time).Round(100*time.Millisecond),
		p.CompletionTime.Sub(rotated).Round(100*time.Millisecond))
}

// verifyKey runs kubectl restow verify secrets --expect-key key, straight
// from etcd, and fails unless it exits want.
func verifyKey(t *testing.T, cp *testenv.Env, key string, want int) {
	t.Helper()
	out, errOut, code := scenario.Restow(t, cp, "verify", name, "--etcd-endpoints", cp.EtcdURL(), "--expect-key", key)
	if strings.Contains(out+errOut, planted) {
		t.Fatal("verify printed a Secret's value")
	}
	if code != want {
		t.Errorf("kubectl restow verify --expect-key %s exited %d, want %d", key, code, want)
	}
}

// assertSecretsRead lists the Secrets through the API: each decrypts to the
// value written.
func assertSecretsRead(t *testing.T, cp *testenv.Env) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var list corev1.SecretList
	if err := cp.Client.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		t.Fatal(err)
	}
	read := 0
	for _, s := range list.Items {
		if string(s.Data["password"]) == planted {
			read++
		}
	}
	if read != n {
		t.Fatalf("%d of %d Secrets read back their value", read, n)
	}
}

func isReady(sm *migrationv1alpha1.StorageMigration) bool {
	return apimeta.IsStatusConditionTrue(sm.Status.Conditions, migrationv1alpha1.ReadyCondition) &&
		sm.Status.ObservedGeneration == sm.Generation
}

// waitReloaded waits until the API server reports the configuration of
// hash, and returns when. It logs what one read of /metrics costs, as
// restow makes it once per server every --reencrypt-check-interval.
func waitReloaded(t *testing.T, cp *testenv.Env, hash string) time.Time {
	t.Helper()
	reloaded, size, took := scenario.WaitReloaded(t, cp, hash)
	t.Logf("The API server reloaded %s; one read of its /metrics: %d bytes in %s", hash, size, took.Round(time.Millisecond))
	return reloaded
}
