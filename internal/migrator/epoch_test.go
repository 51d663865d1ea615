package migrator_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/testenv"
)

// TestReEncryptionAcrossARollBackIsMoved: secrets are re-encrypted from
// key1 to key2; within the pass the API server is rolled back to the old
// configuration (key1 writes) and forward again. The pass ends under the
// state it began with, yet wrote some Secrets under key1 meanwhile (read
// from etcd): its end says the state moved (the server restarted), and a
// second pass leaves every Secret under key2.
func TestReEncryptionAcrossARollBackIsMoved(t *testing.T) {
	config := filepath.Join(t.TempDir(), "encryption.yaml")
	testenv.WriteAESCBCConfig(t, config, "key1", "key2")
	cp := testenv.Start(t, testenv.Options{APIServerArgs: map[string]string{"encryption-provider-config": config}})
	const ns, n = "vault", 400
	if err := cp.EnsureNamespaces(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	err := cp.CreateObjects(t.Context(), n, func(i int) client.Object {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("s-%04d", i), Namespace: ns}, StringData: map[string]string{"k": "v"}}
	})
	if err != nil {
		t.Fatal(err)
	}
	// The rotation: key2 writes.
	testenv.WriteAESCBCConfig(t, config, "key2", "key1")
	if _, _, err := cp.RestartAPIServer(t.Context(), 0); err != nil {
		t.Fatal(err)
	}

	m, err := migrator.NewForConfig(cp.Config, cp.Client)
	if err != nil {
		t.Fatal(err)
	}
	secrets := schema.GroupResource{Resource: "secrets"}
	m.ReEncrypt = []schema.GroupResource{secrets}
	target, err := m.Resolve(t.Context(), secrets)
	if err != nil || target.Encryption == nil {
		t.Fatalf("Resolve: %+v, %v; want an encryption state", target.Encryption, err)
	}
	// After the first page: back to key1; after the fourth: key2 again.
	// The observer runs in the pass, which waits for it.
	var mu sync.Mutex
	var last migrator.Progress
	rolledBack, rolledForward := false, false
	roll := func(p migrator.Progress) {
		mu.Lock()
		defer mu.Unlock()
		last = p
		switch {
		case !rolledBack && p.Done() >= 25:
			rolledBack = true
			testenv.WriteAESCBCConfig(t, config, "key1", "key2")
		case rolledBack && !rolledForward && p.Done() >= 100:
			rolledForward = true
			testenv.WriteAESCBCConfig(t, config, "key2", "key1")
		default:
			return
		}
		if _, _, err := cp.RestartAPIServer(context.Background(), 0); err != nil {
			t.Error(err)
		}
	}
	opts := migrator.Options{PageSize: 25, Concurrency: 4, FixedConcurrency: true}
	result, err := m.Migrate(t.Context(), target, opts, roll)
	for resumes := 0; err != nil && resumes < 5; resumes++ {
		// A restart can outlast the retries of a request in flight: the
		// migration pauses, and resumes from its checkpoint.
		var transient *migrator.TransientError
		if !errors.As(err, &transient) {
			t.Fatal(err)
		}
		t.Logf("Resuming after %v", migrator.Message(err))
		mu.Lock()
		saved := last.Checkpoint
		mu.Unlock()
		opts.Resume = &saved
		if target, err = m.Resolve(t.Context(), secrets); err != nil {
			t.Fatal(err)
		}
		result, err = m.Migrate(t.Context(), target, opts, roll)
	}
	if err != nil {
		t.Fatal(err)
	}
	underKey1 := storedUnder(t, cp, ns, "key1")
	t.Logf("First pass: %d listed, %d under key1 in etcd at its end; moved: %q", result.Listed, underKey1, result.EncryptionMoved)
	if underKey1 == 0 {
		t.Fatal("no Secret was written under key1 during the roll-back: the test did not roll back within the pass")
	}
	if !strings.Contains(result.EncryptionMoved, "the API server restarted") {
		t.Errorf("the pass that wrote %d Secrets under key1 ends with EncryptionMoved %q, want the restart named", underKey1, result.EncryptionMoved)
	}

	target, err = m.Resolve(t.Context(), secrets)
	if err != nil {
		t.Fatal(err)
	}
	result, err = m.Migrate(t.Context(), target, migrator.Options{}, func(migrator.Progress) {})
	if err != nil || result.EncryptionMoved != "" {
		t.Fatalf("second pass: %v, moved %q", err, result.EncryptionMoved)
	}
	if left := storedUnder(t, cp, ns, "key1"); left != 0 {
		t.Errorf("after the second pass %d Secrets are under key1", left)
	}
}

// storedUnder counts the Secrets of ns that etcd holds under aescbc key.
func storedUnder(t *testing.T, cp *testenv.Env, ns, key string) int {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{cp.EtcdURL()}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	resp, err := c.Get(t.Context(), "/registry/secrets/"+ns+"/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, kv := range resp.Kvs {
		if bytes.HasPrefix(kv.Value, []byte("k8s:enc:aescbc:v1:"+key+":")) {
			n++
		}
	}
	return n
}
