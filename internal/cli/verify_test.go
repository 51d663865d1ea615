package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/restow/restow/internal/cli"
	"github.com/restow/restow/internal/testenv"
	"github.com/restow/restow/internal/verify"
)

// planted is a value that verify must never print.
const planted = "planted-value-7d3e9b"

// verifyJSON is verify's -o json output, as a user's script reads it.
type verifyJSON struct {
	Resources []struct {
		Resource string `json:"resource"`
		Skipped  string `json:"skipped"`
		Etcd     *struct {
			Objects  int                      `json:"objects"`
			Versions map[string]*verify.Count `json:"versions"`
			Keys     map[string]*verify.Count `json:"keys"`
		} `json:"etcd"`
		Findings   []verify.Finding `json:"findings"`
		Mismatches []string         `json:"mismatches"`
	} `json:"resources"`
	Match *bool `json:"match"`
}

// verifyOn runs kubectl restow verify against e's etcd, and fails the test
// if anything it printed holds the planted value.
func verifyOn(t *testing.T, e *testenv.Env, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	args = append([]string{"verify", "--etcd-endpoints", e.EtcdURL()}, args...)
	stdout, stderr, code = restowOn(t.Context(), t, e, args...)
	if strings.Contains(stdout+stderr, planted) {
		t.Fatalf("verify printed the planted value:\n%s%s", stdout, stderr)
	}
	return stdout, stderr, code
}

func verifyParsed(t *testing.T, e *testenv.Env, args ...string) (verifyJSON, int) {
	t.Helper()
	stdout, _, code := verifyOn(t, e, append(args, "-o", "json")...)
	var out verifyJSON
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatalf("verify -o json: %v\n%s", err, stdout)
	}
	return out, code
}

// counts are a resource's counts by version as verify -o json gives them.
func counts(c map[string]*verify.Count) map[string]int {
	out := map[string]int{}
	for k, v := range c {
		out[k] = v.Objects
	}
	return out
}

func findingsText(fs []verify.Finding) string {
	lines := make([]string, 0, len(fs))
	for _, f := range fs {
		lines = append(lines, string(f.Severity)+": "+f.Message)
	}
	return strings.Join(lines, "\n")
}

// TestVerifyCRDVersions follows a CRD from v1beta1 to v1 and checks what
// verify says at each step against an independent count from etcd: before
// the switch, mid-migration, after a hand-made early prune, and after
// restow's own migration and prune.
func TestVerifyCRDVersions(t *testing.T) {
	fx := testenv.Fixture{Env: env, Group: "verify.restow.dev", Kind: "Widget", Plural: "widgets", Namespaced: true}
	fx.Install(t, "v1beta1", "v1")
	const n = 60
	keys := fx.CreateObjects(t, "v1beta1", n, func(int) map[string]any { return map[string]any{"secret": planted} }, "verify-a", "verify-b")
	resource := fx.CRDName()
	group := fx.Group + "/"

	out, code := verifyParsed(t, env, resource, "--expect-version", "v1beta1")
	if code != 0 || !*out.Match {
		t.Fatalf("before the switch: exit %d, want 0 with every object at v1beta1", code)
	}

	fx.SwitchStorage(t, "v1")
	// Written again after the switch: 20 objects stored at v1.
	for _, key := range keys[:20] {
		patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"touched":true}}`))
		if err := env.Client.Patch(t.Context(), fx.Object("v1", key.Namespace, key.Name, nil), patch); err != nil {
			t.Fatal(err)
		}
	}
	independent, err := fx.StoredCounts(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	out, code = verifyParsed(t, env, resource, "--expect-version", "v1")
	got := counts(out.Resources[0].Etcd.Versions)
	want := map[string]int{group + "v1": independent["v1"], group + "v1beta1": independent["v1beta1"]}
	if fmt.Sprint(got) != fmt.Sprint(want) || independent["v1"] != 20 {
		t.Errorf("mid-migration: verify counts %v, etcd read independently holds %v", got, independent)
	}
	if code != cli.ExitMismatch || *out.Match {
		t.Errorf("mid-migration: --expect-version v1 exited %d, want %d", code, cli.ExitMismatch)
	}
	findings := findingsText(out.Resources[0].Findings)
	if !strings.Contains(findings, "pending: not safe to remove v1beta1: 40 objects still stored at it (verify-a/obj-00020, ") {
		t.Errorf("mid-migration verdict:\n%s", findings)
	}
	// The same as a user reads it (docs/cli.md shows this output).
	stdout, _, code := verifyOn(t, env, resource, "--expect-version", "v1")
	if code != cli.ExitMismatch || !strings.Contains(stdout, "MISMATCH: 40 objects stored at verify.restow.dev/v1beta1, not verify.restow.dev/v1 (verify-a/obj-00020, ") {
		t.Errorf("mid-migration, exit %d:\n%s", code, stdout)
	}

	// A hand-made early prune: status.storedVersions says v1 only while 40
	// objects are stored at v1beta1.
	setStoredVersions(t, resource, "v1")
	stdout, _, code = verifyOn(t, env, resource)
	if code != cli.ExitDanger || !strings.Contains(stdout, "danger: status.storedVersions no longer lists v1beta1 but etcd holds 40 objects at it: put it back before removing the version") {
		t.Errorf("after an early prune, exit %d:\n%s", code, stdout)
	}
	setStoredVersions(t, resource, "v1beta1", "v1")

	if _, _, code := restow(t, "run", resource, "--settle-window", "1s"); code != 0 {
		t.Fatalf("run exited %d", code)
	}
	fx.AssertStoredVersions(t, "v1")
	fx.AssertAllStoredAt(t, "v1", n)
	stdout, _, code = verifyOn(t, env, resource, "--expect-version", "v1")
	if code != 0 || !strings.Contains(stdout, "ok: safe to remove v1beta1: etcd holds no object at it and status.storedVersions does not list it") ||
		!strings.Contains(stdout, "stored at:    verify.restow.dev/v1 60") {
		t.Errorf("after restow's migration, exit %d:\n%s", code, stdout)
	}

	// What verify keeps in memory: counts and names, never the value.
	report, err := verify.Scan(t.Context(), etcdKV(t, env), schema.GroupResource{Group: fx.Group, Resource: "widgets"}, true, verify.ScanOptions{Names: n})
	if err != nil {
		t.Fatal(err)
	}
	held, err := json.Marshal(report)
	if err != nil {
		t.Fatal(err)
	}
	if dump := fmt.Sprintf("%s %+v", held, *report); strings.Contains(dump, planted) || !strings.Contains(dump, "verify-b/obj-00059") {
		t.Errorf("the report held in memory: %s", dump)
	}
}

// setStoredVersions writes a CRD's status.storedVersions by hand.
func setStoredVersions(t *testing.T, name string, versions ...string) {
	t.Helper()
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Name: name}, crd); err != nil {
		t.Fatal(err)
	}
	crd.Status.StoredVersions = versions
	if err := env.Client.Status().Update(t.Context(), crd); err != nil {
		t.Fatal(err)
	}
}

// TestVerifyKeyLayouts checks each built-in key layout verify ships against
// the API server: an object of each resource, created through the API, is
// found by verify where the API server stored it, stored as protobuf at
// the version the API server stores at.
func TestVerifyKeyLayouts(t *testing.T) {
	ctx := t.Context()
	const ns = "verify-layouts"
	if err := env.EnsureNamespaces(ctx, ns); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "verify"}
	template := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}},
	}
	objects := map[string]client.Object{
		"nodes":    &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "verify-node"}},
		"services": &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "verify-svc", Namespace: ns}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}},
		"endpoints": &corev1.Endpoints{ //nolint:staticcheck // Endpoints' own key layout is under test.
			ObjectMeta: metav1.ObjectMeta{Name: "verify-ep", Namespace: ns}},
		"replicationcontrollers": &corev1.ReplicationController{ObjectMeta: metav1.ObjectMeta{Name: "verify-rc", Namespace: ns}, Spec: corev1.ReplicationControllerSpec{Selector: labels, Template: &template}},
		"ingresses.networking.k8s.io": &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Name: "verify-ing", Namespace: ns},
			Spec: networkingv1.IngressSpec{DefaultBackend: &networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: "verify-svc", Port: networkingv1.ServiceBackendPort{Number: 80}}}}},
		"deployments.apps": &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "verify-deploy", Namespace: ns},
			Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](0), Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: template}},
		"configmaps": &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "verify-cm", Namespace: ns}, Data: map[string]string{"k": planted}},
	}
	for resource, obj := range objects {
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Fatalf("%s: %v", resource, err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
	}
	// Stored by the API server's own servers: a CRD, an APIService.
	names := map[string]string{
		"customresourcedefinitions.apiextensions.k8s.io": "storagemigrations.migration.restow.dev",
		"apiservices.apiregistration.k8s.io":             "v1.apps",
	}
	for resource, obj := range objects {
		name := obj.GetName()
		if obj.GetNamespace() != "" {
			name = obj.GetNamespace() + "/" + name
		}
		names[resource] = name
	}
	args := make([]string, 0, 2+len(names))
	args = append(args, "--names", "1000")
	for resource := range names {
		args = append(args, resource)
	}
	slices.Sort(args[2:])
	out, code := verifyParsed(t, env, args...)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for i, r := range out.Resources {
		resource := args[2+i]
		if r.Etcd == nil {
			t.Errorf("%s: %s", resource, r.Skipped)
			continue
		}
		found := false
		for version, c := range r.Etcd.Versions {
			found = found || slices.Contains(c.Names, names[resource])
			if strings.HasPrefix(version, "(") {
				t.Errorf("%s: %d objects unreadable: %s", resource, c.Objects, version)
			}
		}
		if !found {
			t.Errorf("%s: verify did not find %s in etcd: %+v", resource, names[resource], r.Etcd.Versions)
		}
		if f := findingsText(r.Findings); !strings.Contains(f, "the version the API server stores at") && !strings.Contains(f, "the storage version") {
			t.Errorf("%s: findings do not tie the stored version to the API server's:\n%s", resource, f)
		}
	}
}

// TestVerifyReadsOnly records every call verify's etcd client sends: all are
// range reads, for one resource and for --all.
func TestVerifyReadsOnly(t *testing.T) {
	var mu sync.Mutex
	calls := map[string]int{}
	record := func(method string) {
		mu.Lock()
		defer mu.Unlock()
		calls[method]++
	}
	restore := cli.SetEtcdDialOptions(
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			record(method)
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			record(method)
			return streamer(ctx, desc, cc, method, opts...)
		}),
	)
	defer restore()
	if _, _, code := verifyOn(t, env, "configmaps"); code != 0 {
		t.Fatalf("exit %d", code)
	}
	out, code := verifyParsed(t, env, "--all")
	if code != 0 {
		t.Fatalf("--all: exit %d", code)
	}
	covered := map[string]bool{}
	for _, r := range out.Resources {
		covered[r.Resource] = r.Etcd != nil
	}
	for _, want := range []string{"configmaps", "secrets", "deployments.apps", "storagemigrations.migration.restow.dev", "customresourcedefinitions.apiextensions.k8s.io"} {
		if !covered[want] {
			t.Errorf("--all did not read %s from etcd", want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("calls sent to etcd: %v", calls)
	if len(calls) != 1 || calls["/etcdserverpb.KV/Range"] == 0 {
		t.Errorf("verify sent %v to etcd, want range reads only", calls)
	}
}

// TestVerifySecretsKeyRotation encrypts Secrets with aescbc under key1,
// makes key2 the write key, and checks that verify --expect-key key2 fails
// naming the Secrets still under key1, until kubectl restow run rewrites
// them.
func TestVerifySecretsKeyRotation(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "encryption.yaml")
	testenv.WriteAESCBCConfig(t, config, "key1", "key2")
	cp := testenv.Start(t, testenv.Options{APIServerArgs: map[string]string{"encryption-provider-config": config}})
	const n = 30
	if err := cp.EnsureNamespaces(t.Context(), "vault"); err != nil {
		t.Fatal(err)
	}
	err := cp.CreateObjects(t.Context(), n, func(i int) client.Object {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("s-%03d", i), Namespace: "vault"}, StringData: map[string]string{"password": planted}}
	})
	if err != nil {
		t.Fatal(err)
	}
	out, code := verifyParsed(t, cp, "secrets", "--expect-key", "aescbc:key1")
	if code != 0 || counts(out.Resources[0].Etcd.Keys)["aescbc:key1"] < n {
		t.Fatalf("before the rotation: exit %d, keys %v", code, counts(out.Resources[0].Etcd.Keys))
	}

	// The rotation: key2 writes, key1 still reads.
	testenv.WriteAESCBCConfig(t, config, "key2", "key1")
	if _, _, err := cp.RestartAPIServer(t.Context(), 0); err != nil {
		t.Fatal(err)
	}
	// A key's name alone is no key: refused, with the keys so named.
	_, stderr, code := verifyOn(t, cp, "secrets", "--expect-key", "key1")
	if code != 1 || !regexp.MustCompile(`error: --expect-key key1 is read as a KMS v2 key ID, and no object is under that key ID, but etcd holds \d+ objects under aescbc:key1: name a key with its provider`).MatchString(stderr) {
		t.Errorf("--expect-key key1: exit %d, want 1 naming aescbc:key1:\n%s", code, stderr)
	}
	stdout, _, code := verifyOn(t, cp, "secrets", "--expect-key", "aescbc:key2")
	if code != cli.ExitMismatch || !regexp.MustCompile(`MISMATCH: \d+ objects not stored under key aescbc:key2 \(vault/s-000, `).MatchString(stdout) {
		t.Errorf("after the rotation, before the migration: exit %d, want %d naming the Secrets under key1:\n%s", code, cli.ExitMismatch, stdout)
	}
	if _, _, code := restowOn(t.Context(), t, cp, "run", "secrets"); code != 0 {
		t.Fatalf("run secrets exited %d", code)
	}
	out, code = verifyParsed(t, cp, "secrets", "--expect-key", "aescbc:key2")
	if code != 0 || counts(out.Resources[0].Etcd.Keys)["aescbc:key1"] != 0 {
		t.Errorf("after kubectl restow run secrets: exit %d, keys %v", code, counts(out.Resources[0].Etcd.Keys))
	}
	// As a user reads it (docs/prove-it.md shows this output).
	if stdout, _, code := verifyOn(t, cp, "secrets", "--expect-key", "aescbc:key2"); code != 0 || !strings.Contains(stdout, "--expect-key aescbc:key2: every object matches") {
		t.Errorf("after kubectl restow run secrets: exit %d:\n%s", code, stdout)
	}
}

// etcdKV is an etcd client of e's own, for the test to call verify.Scan
// directly.
func etcdKV(t *testing.T, e *testenv.Env) clientv3.KV {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{e.EtcdURL()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c.KV
}

// TestVerifyUnaccounted points verify where the API server does not keep
// the resource: a prefix that holds nothing, a prefix that holds other keys,
// and another cluster's etcd (as a resource in --etcd-servers-overrides
// would be). Each read finds fewer objects than the API lists, and none
// says "ok".
func TestVerifyUnaccounted(t *testing.T) {
	fx := testenv.Fixture{Env: env, Group: "unaccounted.restow.dev", Kind: "Widget", Plural: "widgets", Namespaced: true}
	fx.Install(t, "v1beta1", "v1")
	fx.CreateObjects(t, "v1beta1", 3, plain, "unaccounted")
	fx.SwitchStorage(t, "v1")
	resource := fx.CRDName()

	stdout, stderr, code := verifyOn(t, env, resource, "--expect-version", "v1", "--etcd-prefix", "/kubernetes.io")
	if code != cli.ExitUnaccounted || !strings.Contains(stderr, "holds no key under /kubernetes.io/: that is not where this API server stores anything. Give --etcd-prefix the API server's --etcd-prefix") ||
		strings.Contains(stdout, "ok") {
		t.Errorf("a prefix that holds nothing: exit %d, want %d:\n%s%s", code, cli.ExitUnaccounted, stdout, stderr)
	}
	// Keys, but not this resource's: its objects are not under this prefix.
	stdout, stderr, code = verifyOn(t, env, resource, "--etcd-prefix", "/registry/apiextensions.k8s.io")
	if code != cli.ExitUnaccounted || !strings.Contains(stdout, "unaccounted: etcd holds 0 keys under /registry/apiextensions.k8s.io/unaccounted.restow.dev/widgets/ at revision ") ||
		!strings.Contains(stdout, "but the API lists 3 objects at that revision: this read does not see them all. Check --etcd-prefix") || strings.Contains(stdout, "ok:") {
		t.Errorf("a prefix without the resource: exit %d, want %d:\n%s%s", code, cli.ExitUnaccounted, stdout, stderr)
	}
	// Another cluster's etcd, with env's API server.
	other := testenv.Start(t, testenv.Options{})
	stdout, stderr, code = restowOn(t.Context(), t, env, "verify", resource, "--expect-version", "v1", "--etcd-endpoints", other.EtcdURL())
	if code != cli.ExitUnaccounted || !strings.Contains(stdout, "unaccounted: ") || strings.Contains(stdout, "ok:") ||
		strings.Contains(stdout, "every object matches") {
		t.Errorf("another etcd: exit %d, want %d:\n%s%s", code, cli.ExitUnaccounted, stdout, stderr)
	}
}

// TestVerifyDangerExits: a danger verdict exits non-zero without --expect-*,
// and so does an API that cannot list the resource (no version served).
func TestVerifyDangerExits(t *testing.T) {
	fx := testenv.Fixture{Env: env, Group: "danger.restow.dev", Kind: "Widget", Plural: "widgets", Namespaced: true}
	fx.Install(t, "v1beta1", "v1")
	fx.CreateObjects(t, "v1beta1", 2, plain, "danger")
	fx.SwitchStorage(t, "v1")
	resource := fx.CRDName()
	setStoredVersions(t, resource, "v1")
	stdout, stderr, code := verifyOn(t, env, resource)
	if code != cli.ExitDanger || !strings.Contains(stdout, "danger: status.storedVersions no longer lists v1beta1 but etcd holds 2 objects at it") {
		t.Errorf("an early prune: exit %d, want %d:\n%s%s", code, cli.ExitDanger, stdout, stderr)
	}
}

// TestVerifyPlantedHeaders writes an object into etcd whose root holds, beside
// its own apiVersion and kind, fields a header reader could take for them
// ("apiversion", "APIVERSION", "Kind", a nested kind), each holding the
// planted value: verify counts it at its own version and prints none of
// them, in text or JSON.
func TestVerifyPlantedHeaders(t *testing.T) {
	fx := testenv.Fixture{Env: env, Group: "headers.restow.dev", Kind: "Widget", Plural: "widgets", Namespaced: true}
	fx.Install(t, "v1beta1", "v1")
	fx.SwitchStorage(t, "v1")
	fx.CreateObjects(t, "v1", 2, plain, "headers")
	value := fmt.Sprintf(`{"apiVersion":"headers.restow.dev/v1","kind":"Widget","apiversion":%[1]q,"APIVERSION":%[1]q,"Kind":%[1]q,`+
		`"metadata":{"name":"planted","namespace":"headers","uid":"0d3c1e52-4a4b-4b9e-9a0e-6c1b2f3d4e5f","creationTimestamp":"2026-11-27T00:00:00Z"},"spec":{"kind":%[1]q,"apiVersion":%[1]q}}`, planted)
	if _, err := etcdKV(t, env).Put(t.Context(), "/registry/headers.restow.dev/widgets/headers/planted", value); err != nil {
		t.Fatal(err)
	}
	out, code := verifyParsed(t, env, fx.CRDName(), "--expect-version", "v1")
	if got := counts(out.Resources[0].Etcd.Versions); code != 0 || fmt.Sprint(got) != "map[headers.restow.dev/v1:3]" {
		t.Errorf("exit %d, counted %v, want 3 objects at headers.restow.dev/v1", code, got)
	}
	verifyOn(t, env, fx.CRDName())
	report, err := verify.Scan(t.Context(), etcdKV(t, env), schema.GroupResource{Group: fx.Group, Resource: "widgets"}, true, verify.ScanOptions{Names: 10})
	if err != nil {
		t.Fatal(err)
	}
	if held := fmt.Sprintf("%+v %+v", *report, report.Versions); strings.Contains(held, planted) {
		t.Errorf("the report held in memory: %s", held)
	}
}

// TestVerifyEtcdUnreachable: an etcd that does not answer ends verify within
// --etcd-dial-timeout, with one line that names it.
func TestVerifyEtcdUnreachable(t *testing.T) {
	stdout, stderr, code := restowOn(t.Context(), t, env, "verify", "configmaps", "--etcd-endpoints", "127.0.0.1:1", "--etcd-dial-timeout", "1s")
	assertOneLine(t, stdout, stderr, code, "etcd at 127.0.0.1:1 did not answer a read of /registry/ within 1s")
}

// plain is an object's spec with nothing in it worth planting.
func plain(int) map[string]any { return map[string]any{"size": 1} }
