package controllers_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/testenv"
)

// TestAdmissionDenialStallsWithoutPruning: a ValidatingAdmissionPolicy
// denies updates to one object. The pass ends Stalled naming it, migrates
// every other object and prunes nothing; once the policy is gone, the retry
// succeeds and prunes.
func TestAdmissionDenialStallsWithoutPruning(t *testing.T) {
	ctx := t.Context()
	f := fixture{group: "vap.controllers.restow.dev", kind: "Gizmo", plural: "gizmos", namespaced: true}
	f.install(t, "v1beta1", "v1")
	f.createObjects(t, 200, "vap")
	const denied = "obj-00013"

	// In force before the storage switch, so the probe's own write keeps
	// the object at v1beta1.
	allow, err := env.DenyUpdates(ctx, f.object("v1beta1", "vap", denied, nil), f.plural)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = allow(context.Background()) })
	f.switchStorage(t, "v1")

	startManager(t, nil)
	sm := f.createMigration(t, nil)
	sm = waitFor(t, sm.Name, time.Minute, "Stalled", hasCondition(migrationv1alpha1.StalledCondition, migrationv1alpha1.ObjectsFailedReason))
	if len(sm.Status.FailedObjects) != 1 || sm.Status.FailedObjects[0].Name != denied || sm.Status.FailedObjects[0].Namespace != "vap" {
		t.Fatalf("failedObjects = %+v, want only vap/%s", sm.Status.FailedObjects, denied)
	}
	assertHealth(t, sm, kstatus.FailedStatus)
	if msg := sm.Status.FailedObjects[0].Message; !strings.Contains(msg, testenv.FrozenMessage) {
		t.Errorf("failedObjects[0].message = %q, want the policy's message", msg)
	}
	f.fx().AssertStored(t, map[string]int{"v1": 199, "v1beta1": 1})
	if stored, err := env.ReadStored(ctx, f.group, f.plural, "vap", denied); err != nil || stored.APIVersion != f.group+"/v1beta1" {
		t.Fatalf("denied object stored as %q (%v), want v1beta1", stored.APIVersion, err)
	}
	f.assertStoredVersions(t, "v1beta1", "v1")

	if err := allow(ctx); err != nil {
		t.Fatal(err)
	}
	sm = waitFor(t, sm.Name, time.Minute, "Ready", readyAt("v1"))
	assertHealth(t, sm, kstatus.CurrentStatus)
	f.assertStored(t, "v1", 200)
	f.assertStoredVersions(t, "v1")
	if len(sm.Status.FailedObjects) != 0 {
		t.Errorf("failedObjects = %+v after success, want none", sm.Status.FailedObjects)
	}
}

// TestConcurrentWritersLoseNothing: writers update and delete objects while
// a pass runs. Every writer's last write is what etcd holds, deleted objects
// stay deleted, and everything ends at v1.
func TestConcurrentWritersLoseNothing(t *testing.T) {
	ctx := t.Context()
	f := fixture{group: "writers.controllers.restow.dev", kind: "Doohickey", plural: "doohickeys", namespaced: true}
	f.install(t, "v1beta1", "v1")
	keys := f.createObjects(t, 1500, "w-0", "w-1", "w-2")
	f.switchStorage(t, "v1")

	// Each writer owns a disjoint slice of the objects, so "last write" is defined.
	const writers = 4
	lastWrite := make([]int64, len(keys)) // 0: untouched, -1: deleted, n: spec.size = n
	writerCtx, stopWriters := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var writes atomic.Int64
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for n := int64(2); writerCtx.Err() == nil; n++ {
				i := w + writers*rng.IntN(len(keys)/writers)
				if lastWrite[i] == -1 {
					continue
				}
				k := keys[i]
				if rng.IntN(20) == 0 {
					if err := env.Client.Delete(ctx, f.object("v1", k.Namespace, k.Name, nil)); err != nil {
						t.Errorf("deleting %v: %v", k, err)
						return
					}
					lastWrite[i] = -1
					continue
				}
				patch := fmt.Appendf(nil, `{"spec":{"size":%d}}`, n)
				if err := env.Client.Patch(ctx, f.object("v1", k.Namespace, k.Name, nil), client.RawPatch(types.MergePatchType, patch)); err != nil {
					t.Errorf("updating %v: %v", k, err)
					return
				}
				lastWrite[i] = n
				writes.Add(1)
			}
		})
	}

	startManager(t, nil)
	sm := f.createMigration(t, func(sm *migrationv1alpha1.StorageMigration) {
		sm.Spec.Concurrency = ptr.To[int32](2)
		sm.Spec.PageSize = ptr.To[int32](50)
	})
	sm = waitFor(t, sm.Name, 2*time.Minute, "Ready", readyAt("v1"))
	stopWriters()
	wg.Wait()
	if writes.Load() == 0 {
		t.Fatal("the writers wrote nothing during the pass")
	}
	t.Logf("writers made %d updates during the pass; lastPass %+v", writes.Load(), sm.Status.LastPass.ObjectCounts)

	deleted := 0
	for i, k := range keys {
		u := f.object("v1", k.Namespace, k.Name, nil)
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(u), u)
		switch want := lastWrite[i]; {
		case want == -1:
			deleted++
			if !apierrors.IsNotFound(err) {
				t.Errorf("%v was deleted but reads back: %v", k, err)
			}
		case err != nil:
			t.Errorf("reading %v: %v", k, err)
		default:
			size, _, _ := unstructured.NestedInt64(u.Object, "spec", "size")
			if want == 0 {
				want = 1
			}
			if size != want {
				t.Errorf("%v has spec.size %d, want the last write %d", k, size, want)
			}
		}
	}
	f.assertStored(t, "v1", len(keys)-deleted)
	f.assertStoredVersions(t, "v1")
}

// TestResumeFromContinueToken: a manager stopped mid-pass leaves a continue
// token in status; the next manager resumes from it instead of starting
// over. Counts and failures stay exact across the resume: an object that
// admission refuses on a page done before the stop is still named, once.
func TestResumeFromContinueToken(t *testing.T) {
	ctx := t.Context()
	f := fixture{group: "resume.controllers.restow.dev", kind: "Thingamajig", plural: "thingamajigs", namespaced: true}
	f.install(t, "v1beta1", "v1")
	const total = 2000
	f.createObjects(t, total, "r-0", "r-1")
	// On the first page (r-0, obj-00000 to obj-00198), in force before the
	// switch so it stays at v1beta1.
	const denied = "obj-00010"
	allow, err := env.DenyUpdates(ctx, f.object("v1beta1", "r-0", denied, nil), f.plural)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = allow(context.Background()) })
	f.switchStorage(t, "v1")

	stop := startManager(t, nil)
	sm := f.createMigration(t, func(sm *migrationv1alpha1.StorageMigration) {
		sm.Spec.Concurrency = ptr.To[int32](1)
		sm.Spec.PageSize = ptr.To[int32](100)
	})
	sm = waitFor(t, sm.Name, time.Minute, "part-way", func(sm *migrationv1alpha1.StorageMigration) bool {
		return sm.Status.Progress != nil && sm.Status.Progress.ContinueToken != "" && sm.Status.Progress.Migrated >= 500
	})
	assertHealth(t, sm, kstatus.InProgressStatus)
	stop()
	// Read what the stopped manager persisted last.
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(sm), sm); err != nil {
		t.Fatal(err)
	}
	done := sm.Status.Progress.Migrated
	if sm.Status.Progress.ContinueToken == "" || done >= total || sm.Status.Progress.Failed != 1 {
		t.Fatalf("the first manager left progress %+v, want a continue token part-way and the denied object failed", sm.Status.Progress)
	}

	var patches atomic.Int64
	cfg := rest.CopyConfig(env.Config)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if (req.Method == http.MethodPatch || req.Method == http.MethodPut) && strings.Contains(req.URL.Path, "/"+f.plural+"/") {
				patches.Add(1)
			}
			return rt.RoundTrip(req)
		})
	}
	startManager(t, cfg)
	sm = waitFor(t, sm.Name, 2*time.Minute, "Stalled", hasCondition(migrationv1alpha1.StalledCondition, migrationv1alpha1.ObjectsFailedReason))
	if got := patches.Load(); got > total-done+100 {
		t.Errorf("the second manager patched %d objects; resuming after %d done it should patch at most %d", got, done, total-done+100)
	}
	last := sm.Status.LastPass
	if last.Listed != total || last.Migrated+last.AlreadyStored+last.Skipped != total-1 || last.Failed != 1 {
		t.Errorf("lastPass = %+v, want %d listed, %d rewritten or skipped and 1 failed across both managers", last.ObjectCounts, total, total-1)
	}
	if len(sm.Status.FailedObjects) != 1 || sm.Status.FailedObjects[0].Name != denied {
		t.Errorf("failedObjects = %+v, want only %s, found by the first manager", sm.Status.FailedObjects, denied)
	}
	t.Logf("first manager persisted %d done; second manager patched %d", done, patches.Load())

	if err := allow(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, sm.Name, 2*time.Minute, "Ready", readyAt("v1"))
	f.assertStored(t, "v1", total)
	f.assertStoredVersions(t, "v1")
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// TestStorageVersionChangesMidPass: the storage version switches again
// (v1 -> v2) while a pass to v1 runs. Nothing is pruned to the stale target;
// the end state is every object at v2 and storedVersions [v2].
func TestStorageVersionChangesMidPass(t *testing.T) {
	ctx := t.Context()
	f := fixture{group: "twice.controllers.restow.dev", kind: "Whatsit", plural: "whatsits", namespaced: true}
	f.install(t, "v1beta1", "v1", "v2")
	const total = 1500
	f.createObjects(t, total, "t-0")
	f.switchStorage(t, "v1")

	startManager(t, nil)
	sm := f.slowPassUnderWay(t, nil)
	f.switchStorage(t, "v2")
	// storedVersions must never be pruned to [v1] now that v2 is the storage version.
	prunedToStale := make(chan []string, 1)
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go func() {
		for watchCtx.Err() == nil {
			if got := f.storedVersions(t); len(got) == 1 && got[0] == "v1" {
				prunedToStale <- got
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	sm = waitFor(t, sm.Name, 2*time.Minute, "Ready", readyAt("v2"))
	stopWatch()
	select {
	case got := <-prunedToStale:
		t.Fatalf("storedVersions was pruned to the stale target: %v", got)
	default:
	}
	f.assertStored(t, "v2", total)
	f.assertStoredVersions(t, "v2")
	if sm.Status.TargetVersion != "v2" {
		t.Errorf("status.targetVersion = %q, want v2", sm.Status.TargetVersion)
	}
}
