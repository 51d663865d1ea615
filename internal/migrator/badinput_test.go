package migrator_test

// Bad input and big input: a CRD change while a write waits, answers the
// API server's own validation would refuse to keep, objects that cannot be
// listed at all. Every claim about storage is read from etcd.

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/testenv"
)

// withExtra gives every version of a CRD a schema whose spec has n and, when
// extra is set, the field extra: without it, the API server prunes extra from
// what it reads out of etcd, and from what it is sent.
func withExtra(extra bool) func(*apiextensionsv1.CustomResourceDefinition) {
	return func(crd *apiextensionsv1.CustomResourceDefinition) {
		spec := apiextensionsv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{"n": {Type: "integer"}}}
		if extra {
			spec.Properties["extra"] = apiextensionsv1.JSONSchemaProps{Type: "string"}
		}
		for i := range crd.Spec.Versions {
			crd.Spec.Versions[i].Schema = &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
				Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{"spec": spec},
			}}
		}
	}
}

// TestSchemaChangeWhileWriteQueued: a body listed before a CRD schema change
// and sent after it would store what the old schema pruned, so a body's age
// is checked when its write is sent, not when a worker takes it up. Objects
// are created with spec.extra, the schema then drops extra (etcd keeps it;
// reads prune it), the storage switches and the pass lists the pruned
// bodies. An admission webhook holds every write that arrives in the first
// 12 s (past maxBodyAge) until then; the pass has 64 workers at a pace of 16,
// so 16 writes are held and the other workers wait for a slot; the test puts
// extra back into the schema meanwhile. Every object whose write was not
// held must keep extra in etcd (with the age checked before the wait for a
// slot, 44 of 44 lost it: tried).
func TestSchemaChangeWhileWriteQueued(t *testing.T) {
	const n = 60
	fx := testenv.Fixture{Env: env, Group: "queued.migrator.restow.dev", Kind: "Widget", Plural: "widgets", Namespaced: true, Mutate: withExtra(true)}
	fx.Install(t, "v1beta1", "v1")
	keys := fx.CreateObjects(t, "v1beta1", n, func(i int) map[string]any {
		return map[string]any{"n": int64(i), "extra": "keep-me"}
	}, "m-0", "m-1")

	held := make(chan struct{})
	var holdOnce sync.Once
	var releaseAt atomic.Pointer[time.Time]
	var heldNames sync.Map
	hook := testenv.StartAdmissionWebhook(t, func(_ *admissionv1.AdmissionRequest, obj, _ *unstructured.Unstructured) *admissionv1.AdmissionResponse {
		holdOnce.Do(func() {
			at := time.Now().Add(12 * time.Second)
			releaseAt.Store(&at)
			close(held)
		})
		if at := *releaseAt.Load(); time.Now().Before(at) {
			heldNames.Store(obj.GetNamespace()+"/"+obj.GetName(), true)
			time.Sleep(time.Until(at))
		}
		return &admissionv1.AdmissionResponse{Allowed: true}
	})
	// Registered before the hold starts: the probe is let through at once.
	hook.Register(t, env, fx.Group, fx.Plural, map[string]string{}, fx.Object("v1beta1", keys[n-1].Namespace, keys[n-1].Name, map[string]any{"n": int64(n - 1), "extra": "keep-me"}))

	ctx := t.Context()
	if err := env.UpdateCRD(ctx, fx.CRDName(), withExtra(false)); err != nil {
		t.Fatal(err)
	}
	fx.SwitchStorage(t, "v1")
	restored := make(chan error, 1)
	go func() {
		select {
		case <-held:
			restored <- env.UpdateCRD(ctx, fx.CRDName(), withExtra(true))
		case <-ctx.Done():
			restored <- ctx.Err()
		}
	}()

	m, sent := newMigrator(t)
	// The pass ends without a prune: the CRD changed since it began.
	result, err := m.Migrate(ctx, resolve(t, m, fx), migrator.Options{Concurrency: 64, Prune: true, SettleWindow: time.Second}, nil)
	if rerr := <-restored; rerr != nil {
		t.Fatal(rerr)
	}
	t.Logf("result %+v, %v; %d updates, %d patches", result.Counts, err, sent.updates.Load(), sent.patches.Load())
	heldCount, lost := 0, 0
	heldNames.Range(func(any, any) bool { heldCount++; return true })
	if heldCount == 0 || heldCount >= n/2 {
		t.Fatalf("the webhook held %d writes: this test shows nothing", heldCount)
	}
	for _, key := range keys {
		if _, ok := heldNames.Load(key.String()); ok {
			// Sent before the schema came back: what it stores is not the point.
			continue
		}
		stored, err := env.ReadStored(ctx, fx.Group, fx.Plural, key.Namespace, key.Name)
		if err != nil {
			t.Fatal(err)
		}
		var obj struct {
			Spec map[string]any `json:"spec"`
		}
		if err := json.Unmarshal(stored.Raw, &obj); err != nil {
			t.Fatal(err)
		}
		if obj.Spec["extra"] != "keep-me" {
			lost++
			if lost <= 3 {
				t.Errorf("etcd holds %s without spec.extra: %s", key, fmt.Sprint(obj.Spec))
			}
		}
	}
	t.Logf("%d writes held", heldCount)
	if lost > 0 {
		t.Errorf("%d of the %d objects whose write was not held lost spec.extra", lost, n-heldCount)
	}
	fx.AssertAllStoredAt(t, "v1", n)
}

// TestUnconvertibleWithOldVersionUnserved: once the old version is unserved
// (the documented next step after a switch), an object the conversion
// webhook refuses fails every list page that holds it, through every served
// version. The pass must isolate it by its key, name it, migrate every other
// object, and prune nothing; once the webhook converts it, a new pass heals
// and prunes. Refused: the very first object (nothing listed before it), one
// in the middle of a page, and two neighbours in key order (m-1/obj-00401
// and m-1/obj-00403: one is named, both are counted). Without isolation the
// pass ended TransientError with 0 of the other objects migrated: tried.
func TestUnconvertibleWithOldVersionUnserved(t *testing.T) {
	const n = 600
	hook := testenv.StartConversionWebhook(t, func(*unstructured.Unstructured, string) error { return nil })
	fx := testenv.Fixture{Env: env, Group: "unlisted.migrator.restow.dev", Kind: "Widget", Plural: "widgets", Namespaced: true, Conversion: hook.Conversion()}
	fx.Install(t, "v1beta1", "v1")
	fx.CreateObjects(t, "v1beta1", n, func(i int) map[string]any { return map[string]any{"n": int64(i)} }, "m-0", "m-1")
	refused := []string{"obj-00000", "obj-00250", "obj-00401", "obj-00403"}
	hook.Refuse(true, refused...)
	// Deleting the CRD at the end deletes its objects, which needs them
	// converted: a test that fails early must not hang there.
	t.Cleanup(func() { hook.Refuse(false, refused...) })
	fx.SwitchStorage(t, "v1")
	ctx := t.Context()
	if err := env.UpdateCRD(ctx, fx.CRDName(), func(crd *apiextensionsv1.CustomResourceDefinition) {
		for i := range crd.Spec.Versions {
			crd.Spec.Versions[i].Served = crd.Spec.Versions[i].Name == "v1"
		}
	}); err != nil {
		t.Fatal(err)
	}

	m, _ := newMigrator(t)
	opts := migrator.Options{Prune: true, SettleWindow: time.Second, PageSize: 100,
		RetryBackoff: wait.Backoff{Duration: 10 * time.Millisecond, Factor: 2, Steps: 3}}
	result, err := m.Migrate(ctx, resolve(t, m, fx), opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	named := map[string]string{}
	for _, f := range result.Failures {
		named[f.Namespace+"/"+f.Name] = f.Message
	}
	t.Logf("result %+v; failures %v", result.Counts, named)
	for _, key := range []string{"m-0/obj-00000", "m-0/obj-00250", "m-1/obj-00403"} {
		if !strings.Contains(named[key], "found by its key") {
			t.Errorf("%s not named as passed over: %q", key, named[key])
		}
	}
	if result.Failed != 4 || result.Listed != n || len(result.Pruned) != 0 {
		t.Errorf("result = %+v, pruned %v; want %d listed, 4 failed, nothing pruned", result.Counts, result.Pruned, n)
	}
	fx.AssertStored(t, map[string]int{"v1": n - 4, "v1beta1": 4})
	fx.AssertStoredVersions(t, "v1beta1", "v1")

	hook.Refuse(false, refused...)
	result, err = m.Migrate(ctx, resolve(t, m, fx), opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	if result.Failed != 0 || !slices.Equal(result.Pruned, []string{"v1beta1"}) {
		t.Errorf("healed: result = %+v, pruned %v; want none failed, v1beta1 pruned", result.Counts, result.Pruned)
	}
	fx.AssertAllStoredAt(t, "v1", n)
}

// TestRecheckIsolatesAnUnconvertibleObject: an object written at the old
// version within the settle window (here its value rewritten in etcd, as a
// write that began on the old storage leaves it), that the conversion
// webhook then refuses, once the old version is unserved: the re-check
// lists it through v1 only, and its page fails there on every try. The
// re-check must isolate it as the first pass does: name it as failed,
// re-check the rest, prune nothing. (Without isolation in the re-check the
// migration ended TransientError, the object never named: tried.)
func TestRecheckIsolatesAnUnconvertibleObject(t *testing.T) {
	const n, ns, late = 200, "m-1", "obj-00123"
	hook := testenv.StartConversionWebhook(t, func(*unstructured.Unstructured, string) error { return nil })
	fx := testenv.Fixture{Env: env, Group: "recheckunlisted.migrator.restow.dev", Kind: "Widget", Plural: "widgets", Namespaced: true, Conversion: hook.Conversion()}
	fx.Install(t, "v1beta1", "v1")
	fx.CreateObjects(t, "v1beta1", n, func(i int) map[string]any { return map[string]any{"n": int64(i)} }, "m-0", ns)
	t.Cleanup(func() { hook.Refuse(false, late) })
	fx.SwitchStorage(t, "v1")
	ctx := t.Context()

	m, _ := newMigrator(t)
	opts := migrator.Options{Prune: true, SettleWindow: 15 * time.Second, PageSize: 50,
		RetryBackoff: wait.Backoff{Duration: 10 * time.Millisecond, Factor: 2, Steps: 3}}
	settling := make(chan migrator.Progress, 1)
	type ended struct {
		result migrator.Result
		err    error
	}
	done := make(chan ended, 1)
	go func() {
		var once sync.Once
		result, err := m.Migrate(ctx, resolve(t, m, fx), opts, func(p migrator.Progress) {
			if p.Phase == migrator.PhaseSettling {
				once.Do(func() { settling <- p })
			}
		})
		done <- ended{result, err}
	}()
	var p migrator.Progress
	select {
	case p = <-settling:
	case e := <-done:
		t.Fatalf("the migration ended (%+v, %v) without settling", e.result.Counts, e.err)
	}
	if left := time.Until(p.SettleUntil); left < 5*time.Second {
		t.Fatalf("the first pass took all but %s of the settle window: this test needs the write within it", left)
	}
	if err := env.StoreAt(ctx, fx.Group, fx.Plural, ns, late, fx.Group+"/v1beta1"); err != nil {
		t.Fatal(err)
	}
	hook.Refuse(true, late)
	if err := env.UpdateCRD(ctx, fx.CRDName(), func(crd *apiextensionsv1.CustomResourceDefinition) {
		for i := range crd.Spec.Versions {
			crd.Spec.Versions[i].Served = crd.Spec.Versions[i].Name == "v1"
		}
	}); err != nil {
		t.Fatal(err)
	}
	if time.Now().After(p.SettleUntil) {
		t.Fatal("the settle window ended before the late write was in place: this test shows nothing")
	}
	e := <-done
	if e.err != nil {
		t.Fatalf("Migrate: %v (result %+v)", e.err, e.result.Counts)
	}
	t.Logf("result %+v; failures %+v", e.result.Counts, e.result.Failures)
	if e.result.Failed != 1 || len(e.result.Failures) != 1 || e.result.Failures[0].Name != late ||
		!strings.Contains(e.result.Failures[0].Message, "found by its key") || len(e.result.Pruned) != 0 {
		t.Errorf("result = %+v, failures %+v, pruned %v; want %s/%s named as failed, nothing pruned", e.result.Counts, e.result.Failures, e.result.Pruned, ns, late)
	}
	fx.AssertStored(t, map[string]int{"v1": n - 1, "v1beta1": 1})
	fx.AssertStoredVersions(t, "v1beta1", "v1")
}
