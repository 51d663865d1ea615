package migrator_test

// Bad input and big input: a CRD change while a write waits, answers the
// API server's own validation would refuse to keep, objects that cannot be
// listed at all. Every claim about storage is read from etcd.

import (
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

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
