package config_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/controllers"
	"github.com/restow/restow/internal/operator"
	"github.com/restow/restow/internal/testenv"
)

// TestManagerRBAC runs restow with nothing but the RBAC that
// config/default installs, as its service account, on the test control
// plane, which authorizes with RBAC:
//
//   - in-process, through a client impersonating the service account, it
//     migrates a CRD (automatically) and Secrets (asked for), and no response
//     it receives holds a Secret's data;
//   - with config/components/named-groups, a resource outside the named
//     groups stalls with reason Unsupported and the API server's refusal,
//     and is not retried in a tight loop; so do Secrets, whose core group
//     is not named;
//   - in-process, with automatic migration of built-in resources, it
//     records the baseline of one;
//   - the manager binary, authenticated as the service account, holds the
//     leader election lease and migrates a CRD.
func TestManagerRBAC(t *testing.T) {
	ctx := t.Context()
	objs := render(t, "default")
	apply(t, objs)
	var sa corev1.ServiceAccount
	into(t, find(t, objs, "ServiceAccount"), &sa)
	user := serviceaccount.MakeUsername(sa.Namespace, sa.Name)
	groups := serviceaccount.MakeGroupNames(sa.Namespace)

	// The group config/testdata/named-groups adds to the component, as
	// docs/install.md's overlay does.
	crontabs := installCRD(t, "stable.example.com", "CronTab", "crontabs", 300)
	canary := "restow-canary-" + randomHex(t)
	secrets := createSecrets(t, "rbac-secrets", 50, canary)

	// The operator's clients, as the service account, scanning every
	// response body for the Secrets' data, raw (protobuf) or base64 (JSON).
	var leaked atomic.Int64
	var scanned atomic.Int64
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	cfg.WrapTransport = scanResponses([][]byte{[]byte(canary), []byte(base64.StdEncoding.EncodeToString([]byte(canary)))}, &leaked, &scanned)
	assertScannerCatches(t, canary)

	// A webhook that, on the service account's first rewrite of one
	// crontab, writes that crontab as someone else: the rewrite answers 409
	// for a real change, which restow confirms with the verbs it holds.
	touched := conflictOnce(t, crontabs, "obj-00007", user)

	t.Run("migrates a CRD and Secrets as the service account", func(t *testing.T) {
		stop := operator.Start(t, cfg, env.Scheme, controllers.Options{AutoMigrate: true})
		defer stop()
		crontabs.SwitchStorage(t, "v1")
		// Every Secret in the cluster, the test's 50 and those other tests
		// left (Helm keeps its releases in Secrets): nothing creates one
		// while this migration runs.
		var all corev1.SecretList
		if err := env.Client.List(ctx, &all); err != nil {
			t.Fatal(err)
		}
		if len(all.Items) < len(secrets) {
			t.Fatalf("%d Secrets in the cluster, fewer than the test's %d", len(all.Items), len(secrets))
		}
		migrateSecrets(t, "secrets")

		crontabsMigration := waitCondition(t, crontabs.crdName, migrationv1alpha1.ReadyCondition, migrationv1alpha1.SucceededReason)
		crontabs.assertAllStoredAt(t, "v1")
		crontabs.assertStoredVersions(t, "v1")
		if last := crontabsMigration.Status.LastPass; !touched.Load() || last == nil || last.Skipped < 1 || last.Failed != 0 {
			t.Errorf("crontabs' last pass = %+v (conflict made: %v), want the conflicted object counted as changed by others, none failed", last, touched.Load())
		}
		sm := waitCondition(t, "secrets", migrationv1alpha1.ReadyCondition, migrationv1alpha1.SucceededReason)
		// Every Secret was patched, and found already stored: the API
		// server skips the etcd write when the encoding is unchanged, as
		// here without an encryption key rotation.
		if sm.Status.LastPass == nil || sm.Status.LastPass.AlreadyStored != int64(len(all.Items)) || sm.Status.LastPass.Failed != 0 {
			t.Errorf("secrets' last pass = %+v, want all %d secrets patched and already stored", sm.Status.LastPass, len(all.Items))
		}
		stop()
		if scanned.Load() == 0 {
			t.Fatal("no response was scanned: the scanner saw nothing")
		}
		if leaked.Load() != 0 {
			t.Errorf("%d responses the operator received held a Secret's data", leaked.Load())
		}
		t.Logf("%d responses scanned, none with a Secret's data", scanned.Load())
		deleteMigration(t, crontabs.crdName)
	})

	t.Run("records a built-in resource's baseline as the service account", func(t *testing.T) {
		stop := operator.Start(t, cfg, env.Scheme, controllers.Options{
			AutoMigrateBuiltIns: true, BuiltInExclude: env.BuiltInsExcept(t, "configmaps"),
		})
		defer stop()
		defer deleteMigration(t, "configmaps")
		// It watched the identity Leases, listed the APIServices, created
		// the StorageMigration and read every API server's discovery.
		sm := waitCondition(t, "configmaps", migrationv1alpha1.ReadyCondition, migrationv1alpha1.SucceededReason)
		if sm.Status.Baseline == nil || sm.Status.Baseline.StorageVersion != "v1" || sm.Status.LastPass != nil {
			t.Errorf("configmaps: baseline %+v, last pass %+v; want the baseline v1 and no pass", sm.Status.Baseline, sm.Status.LastPass)
		}
	})

	t.Run("a group outside named-groups stalls as Unsupported", func(t *testing.T) {
		narrowed := render(t, "testdata/named-groups")
		var role rbacv1.ClusterRole
		into(t, find(t, narrowed, "ClusterRole", "restow-manager-role"), &role)
		if got := role.Rules[1].APIGroups; !slices.Equal(got, []string{"stable.example.com", "migration.restow.dev"}) {
			t.Fatalf("named-groups rendered rule 0 for groups %v, want only stable.example.com and restow's own", got)
		}
		apply(t, narrowed)
		t.Cleanup(func() { apply(t, objs) })
		outside := installCRD(t, "outside.config.restow.dev", "Gadget", "gadgets", 20)
		outside.SwitchStorage(t, "v1")
		stop := operator.Start(t, cfg, env.Scheme, controllers.Options{AutoMigrate: true})
		defer stop()

		sm := waitCondition(t, outside.crdName, migrationv1alpha1.StalledCondition, migrationv1alpha1.UnsupportedReason)
		stalled := apimeta.FindStatusCondition(sm.Status.Conditions, migrationv1alpha1.StalledCondition)
		if !strings.Contains(stalled.Message, "forbidden") || !strings.Contains(stalled.Message, "gadgets") {
			t.Errorf("Stalled message %q, want the API server's refusal naming gadgets", stalled.Message)
		}
		// Not a tight loop: the Stalled retry backs off (here from 0.5 s to
		// 2 s), so in 3 s the StorageMigration changes a few times at most.
		changes := countChanges(t, outside.crdName, 3*time.Second)
		if changes > 5 {
			t.Errorf("the Stalled StorageMigration changed %d times in 3 s: a retry loop without backoff", changes)
		}
		outside.assertAllStoredAt(t, "v1beta1")
		outside.assertStoredVersions(t, "v1beta1", "v1")
		t.Logf("Stalled: %s; %d changes in 3 s", stalled.Message, changes)
		deleteMigration(t, outside.crdName)

		// Built-in resources are outside too unless "" is listed: the
		// restricted profile cannot read Secrets.
		secretsMigration := migrateSecrets(t, "restricted-secrets")
		sm = waitCondition(t, secretsMigration.Name, migrationv1alpha1.StalledCondition, migrationv1alpha1.UnsupportedReason)
		stalled = apimeta.FindStatusCondition(sm.Status.Conditions, migrationv1alpha1.StalledCondition)
		if !strings.Contains(stalled.Message, "forbidden") || !strings.Contains(stalled.Message, `"secrets"`) {
			t.Errorf("Stalled message %q, want the API server's refusal naming secrets", stalled.Message)
		}
		t.Logf("Stalled: %s", stalled.Message)
	})

	t.Run("the manager binary as the service account", func(t *testing.T) {
		assertDeployedManagerMigrates(t, objs, "stable.example.com", "Widget", "widgets")
	})
}

// scanResponses wraps a transport so every response body is scanned, as it
// is read, for any of needles: found counts responses that held one,
// scanned counts responses.
func scanResponses(needles [][]byte, found, scanned *atomic.Int64) func(http.RoundTripper) http.RoundTripper {
	return func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(r)
			if err == nil && resp.Body != nil {
				scanned.Add(1)
				resp.Body = &scanningBody{ReadCloser: resp.Body, needles: needles, found: found}
			}
			return resp, err
		})
	}
}

// scanningBody looks for needles in a body as it streams (watches never
// end), keeping enough of each chunk's end to catch a needle split between
// chunks.
type scanningBody struct {
	io.ReadCloser
	needles [][]byte
	found   *atomic.Int64
	window  []byte
	counted bool
}

func (b *scanningBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 && !b.counted {
		b.window = append(b.window, p[:n]...)
		longest := 0
		for _, needle := range b.needles {
			if bytes.Contains(b.window, needle) {
				b.found.Add(1)
				b.counted = true
			}
			longest = max(longest, len(needle))
		}
		if keep := longest - 1; len(b.window) > keep {
			b.window = append(b.window[:0], b.window[len(b.window)-keep:]...)
		}
	}
	return n, err
}

// assertScannerCatches shows the scanner is not blind: an administrator's
// read of the Secrets through it is caught.
func assertScannerCatches(t *testing.T, canary string) {
	t.Helper()
	var found, scanned atomic.Int64
	cfg := rest.CopyConfig(env.Config)
	cfg.WrapTransport = scanResponses([][]byte{[]byte(canary), []byte(base64.StdEncoding.EncodeToString([]byte(canary)))}, &found, &scanned)
	clientset, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := clientset.CoreV1().Secrets("rbac-secrets").List(t.Context(), metav1.ListOptions{Limit: 1}); err != nil {
		t.Fatal(err)
	}
	if found.Load() != 1 {
		t.Fatalf("the scanner missed a Secret's data in an administrator's list (%d found)", found.Load())
	}
}

func randomHex(t *testing.T) string {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func createSecrets(t *testing.T, namespace string, n int, value string) []string {
	t.Helper()
	if err := env.EnsureNamespaces(t.Context(), namespace); err != nil {
		t.Fatal(err)
	}
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("secret-%03d", i)
	}
	err := env.CreateObjects(t.Context(), n, func(i int) client.Object {
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: names[i], Namespace: namespace},
			Data:       map[string][]byte{"token": []byte(value)},
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// crd is a test CRD with objects created at v1beta1.
type crd struct {
	testenv.Fixture
	crdName string
	objects int
}

func installCRD(t *testing.T, group, kind, plural string, objects int) crd {
	t.Helper()
	c := crd{Fixture: testenv.Fixture{Env: env, Group: group, Kind: kind, Plural: plural, Namespaced: true}, objects: objects}
	c.crdName = c.CRDName()
	c.Install(t, "v1beta1", "v1")
	c.CreateObjects(t, "v1beta1", objects, func(i int) map[string]any { return map[string]any{"n": int64(i)} }, "rbac-"+plural)
	return c
}

func (c crd) assertAllStoredAt(t *testing.T, version string) {
	t.Helper()
	c.AssertAllStoredAt(t, version, c.objects)
}

func (c crd) assertStoredVersions(t *testing.T, want ...string) {
	t.Helper()
	c.AssertStoredVersions(t, want...)
}

// waitCondition waits until the named StorageMigration has the condition
// True with the reason, for as long as its status shows progress.
func waitCondition(t *testing.T, name, condition, reason string) *migrationv1alpha1.StorageMigration {
	t.Helper()
	return env.WaitForMigration(t, name, time.Minute, condition+"="+reason, func(sm *migrationv1alpha1.StorageMigration) bool {
		c := apimeta.FindStatusCondition(sm.Status.Conditions, condition)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == reason && c.ObservedGeneration == sm.Generation
	})
}

// countChanges watches the named StorageMigration for d and counts its updates.
func countChanges(t *testing.T, name string, d time.Duration) int {
	t.Helper()
	watcher, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	w, err := watcher.Watch(ctx, &migrationv1alpha1.StorageMigrationList{}, client.MatchingFields{"metadata.name": name})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	changes := 0
	for {
		select {
		case event, ok := <-w.ResultChan():
			if !ok {
				return changes
			}
			if event.Type == watch.Modified {
				changes++
			}
		case <-ctx.Done():
			return changes
		}
	}
}

// migrateSecrets asks for a migration of Secrets, a built-in resource
// (nothing creates one automatically), deleted when the test ends.
func migrateSecrets(t *testing.T, name string) *migrationv1alpha1.StorageMigration {
	t.Helper()
	sm := &migrationv1alpha1.StorageMigration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       migrationv1alpha1.StorageMigrationSpec{Resource: migrationv1alpha1.GroupResource{Resource: "secrets"}},
	}
	if err := env.Client.Create(t.Context(), sm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), sm) })
	return sm
}

// deleteMigration removes an automatic StorageMigration: the test control
// plane runs no garbage collector.
func deleteMigration(t *testing.T, name string) {
	t.Helper()
	sm := &migrationv1alpha1.StorageMigration{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := client.IgnoreNotFound(env.Client.Delete(context.Background(), sm)); err != nil {
		t.Error(err)
	}
}

// conflictOnce registers an admission webhook that, on user's first update
// of the crontab name, writes that crontab as the test's administrator
// before allowing the update, so the update answers 409 Conflict. It reports
// whether it did.
func conflictOnce(t *testing.T, c crd, name, user string) *atomic.Bool {
	t.Helper()
	ctx := t.Context()
	obj := c.Object("v1beta1", "rbac-"+c.Plural, name, nil)
	label := map[string]string{"restow.dev/conflict": "true"}
	if err := env.Client.Patch(ctx, obj, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"restow.dev/conflict":"true"}}}`))); err != nil {
		t.Fatal(err)
	}
	var done atomic.Bool
	hook := testenv.StartAdmissionWebhook(t, func(req *admissionv1.AdmissionRequest, _, _ *unstructured.Unstructured) *admissionv1.AdmissionResponse {
		if req.UserInfo.Username == user && done.CompareAndSwap(false, true) {
			patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"restow.dev/touched":"true"}}}`))
			if err := env.Client.Patch(context.Background(), c.Object("v1beta1", req.Namespace, req.Name, nil), patch); err != nil {
				t.Errorf("the webhook's own write: %v", err)
			}
		}
		return &admissionv1.AdmissionResponse{Allowed: true}
	})
	hook.Register(t, env, c.Group, c.Plural, label, obj)
	return &done
}
