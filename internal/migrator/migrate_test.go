package migrator_test

// The engine's own tests against the source-built API server and etcd: a
// whole migration, resuming from a checkpoint, the 410 path and the errors
// that stop a migration. Every storage claim is read from etcd.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	admissionv1 "k8s.io/api/admission/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	testenv.Main(m, testenv.Options{}, &env)
}

// newMigrator builds a migrator on the test control plane; sent counts the
// rewrites it sends.
func newMigrator(t *testing.T) (m *migrator.Migrator, sent *rewrites) {
	t.Helper()
	return newMigratorFor(t, env.Config)
}

// newMigratorFor builds a migrator whose object requests go through cfg.
func newMigratorFor(t *testing.T, cfg *rest.Config) (m *migrator.Migrator, sent *rewrites) {
	t.Helper()
	sent = &rewrites{}
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			switch req.Method {
			case http.MethodPatch:
				sent.patches.Add(1)
			case http.MethodPut:
				sent.updates.Add(1)
			}
			return rt.RoundTrip(req)
		})
	})
	m, err := migrator.NewForConfig(cfg, env.Client)
	if err != nil {
		t.Fatal(err)
	}
	return m, sent
}

// rewrites counts the rewrites a migrator sent: merge patches, and updates
// of objects written back as listed.
type rewrites struct{ patches, updates atomic.Int64 }

func (r *rewrites) Load() int64 { return r.patches.Load() + r.updates.Load() }

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// switched installs a fixture with n objects at v1beta1 and switches its
// storage version to v1.
func switched(t *testing.T, group string, n int) testenv.Fixture {
	t.Helper()
	fx := testenv.Fixture{Env: env, Group: group, Kind: "Widget", Plural: "widgets", Namespaced: true}
	fx.Install(t, "v1beta1", "v1")
	fx.CreateObjects(t, "v1beta1", n, func(i int) map[string]any { return map[string]any{"n": int64(i)} }, "m-0", "m-1")
	fx.SwitchStorage(t, "v1")
	return fx
}

func resolve(t *testing.T, m *migrator.Migrator, fx testenv.Fixture) migrator.Target {
	t.Helper()
	target, err := m.Resolve(t.Context(), schema.GroupResource{Group: fx.Group, Resource: fx.Plural})
	if err != nil {
		t.Fatal(err)
	}
	return target
}

// TestMigrate: a whole migration rewrites every object, settles, re-checks
// nothing on a quiet resource, and prunes.
func TestMigrate(t *testing.T) {
	fx := switched(t, "whole.migrator.restow.dev", 300)
	m, sent := newMigrator(t)
	target := resolve(t, m, fx)
	var phases []migrator.Phase
	var mu sync.Mutex
	result, err := m.Migrate(t.Context(), target, migrator.Options{Prune: true, SettleWindow: 2 * time.Second}, func(p migrator.Progress) {
		mu.Lock()
		defer mu.Unlock()
		if len(phases) == 0 || phases[len(phases)-1] != p.Phase {
			phases = append(phases, p.Phase)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if result.Listed != 300 || result.Migrated != 300 || result.Failed != 0 || result.Rechecked != 0 || !slices.Equal(result.Pruned, []string{"v1beta1"}) {
		t.Errorf("result = %+v, want 300 listed and rewritten, none re-checked, v1beta1 pruned", result)
	}
	if want := []migrator.Phase{migrator.PhaseRewriting, migrator.PhaseSettling, migrator.PhaseRechecking}; !slices.Equal(phases, want) {
		t.Errorf("phases = %v, want %v", phases, want)
	}
	if sent.updates.Load() != 300 || sent.patches.Load() != 0 {
		t.Errorf("%d updates and %d patches for 300 objects on a quiet resource, want each written back as listed once", sent.updates.Load(), sent.patches.Load())
	}
	fx.AssertAllStoredAt(t, "v1", 300)
	fx.AssertStoredVersions(t, "v1")
}

// TestMigrateWithoutUpdatePermission: a user who may list and patch a
// resource, but not update it, still migrates it. The API server answers the
// first updates of objects written back as listed with 403, and the pass
// patches every object instead: none fails, every one is stored at v1 in
// etcd, and v1beta1 is pruned.
func TestMigrateWithoutUpdatePermission(t *testing.T) {
	ctx := t.Context()
	fx := switched(t, "noupdate.migrator.restow.dev", 300)
	const user = "restow-list-and-patch"
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{fx.Group}, Resources: []string{fx.Plural}, Verbs: []string{"list", "patch"}},
			// etcd's size, read before the pass writes (package quota).
			{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}},
		},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	for _, obj := range []client.Object{role, binding} {
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
	m, sent := newMigratorFor(t, cfg)
	gvr := schema.GroupVersionResource{Group: fx.Group, Version: "v1", Resource: fx.Plural}
	// The authorizer sees the binding within moments.
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := m.Metadata.Resource(gvr).List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil, nil
	}); err != nil {
		t.Fatalf("%s cannot list %s: %v", user, gvr.GroupResource(), err)
	}

	result, err := m.Migrate(ctx, resolve(t, m, fx), migrator.Options{Prune: true, SettleWindow: time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if result.Migrated != 300 || result.Failed != 0 || !slices.Equal(result.Pruned, []string{"v1beta1"}) {
		t.Errorf("result = %+v, failures %+v; want 300 rewritten, none failed, v1beta1 pruned", result.Counts, result.Failures)
	}
	if sent.updates.Load() == 0 {
		t.Error("the migration never tried to write an object back as listed: this test shows nothing")
	}
	if sent.patches.Load() != 300 {
		t.Errorf("%d patches, want one for each of the 300 objects", sent.patches.Load())
	}
	t.Logf("%d updates refused, then %d patches", sent.updates.Load(), sent.patches.Load())
	fx.AssertAllStoredAt(t, "v1", 300)
	fx.AssertStoredVersions(t, "v1")
}

// TestRefusedAsListedIsPatched: an object the API server refuses to take
// back as listed, with 422 (invalid) or 413 (too large), is patched instead,
// object by object: the refusal does not send the rest of the migration to
// patches, as a 403 does, and the patch answers for itself. Here a validating
// admission webhook refuses the first write of every other object, half of
// them with 422 and half with 413, and lets every later one through. Every
// object must end up stored at v1 in etcd with none failed, and v1beta1
// pruned (without the 422/413 case in the migrator's write, the refused
// objects fail and nothing is pruned: tried).
func TestRefusedAsListedIsPatched(t *testing.T) {
	const n = 200
	fx := testenv.Fixture{Env: env, Group: "refused.migrator.restow.dev", Kind: "Widget", Plural: "widgets", Namespaced: true}
	fx.Install(t, "v1beta1", "v1")
	keys := fx.CreateObjects(t, "v1beta1", n, func(i int) map[string]any { return map[string]any{"n": int64(i)} }, "m-0", "m-1")

	var seen sync.Map
	var refused422, refused413 atomic.Int64
	hook := testenv.StartAdmissionWebhook(t, func(_ *admissionv1.AdmissionRequest, obj, _ *unstructured.Unstructured) *admissionv1.AdmissionResponse {
		var i int
		if _, err := fmt.Sscanf(obj.GetName(), "obj-%05d", &i); err != nil || i%2 == 1 {
			return &admissionv1.AdmissionResponse{Allowed: true}
		}
		if _, again := seen.LoadOrStore(obj.GetNamespace()+"/"+obj.GetName(), true); again {
			return &admissionv1.AdmissionResponse{Allowed: true}
		}
		if i%4 == 0 {
			refused422.Add(1)
			return &admissionv1.AdmissionResponse{Result: &metav1.Status{Code: http.StatusUnprocessableEntity, Reason: metav1.StatusReasonInvalid, Message: "refused as listed by the test"}}
		}
		refused413.Add(1)
		return &admissionv1.AdmissionResponse{Result: &metav1.Status{Code: http.StatusRequestEntityTooLarge, Reason: metav1.StatusReasonRequestEntityTooLarge, Message: "refused as listed by the test"}}
	})
	// The webhook's probe writes the last object (odd, never refused) before the switch.
	hook.Register(t, env, fx.Group, fx.Plural, map[string]string{}, fx.Object("v1beta1", keys[n-1].Namespace, keys[n-1].Name, nil))
	fx.SwitchStorage(t, "v1")

	m, sent := newMigrator(t)
	result, err := m.Migrate(t.Context(), resolve(t, m, fx), migrator.Options{Prune: true, SettleWindow: time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d refused with 422 and %d with 413; %d updates, %d patches", refused422.Load(), refused413.Load(), sent.updates.Load(), sent.patches.Load())
	if refused422.Load() != n/4 || refused413.Load() != n/4 {
		t.Fatalf("the webhook refused %d objects with 422 and %d with 413, want %d each: this test shows nothing", refused422.Load(), refused413.Load(), n/4)
	}
	if result.Migrated != n || result.Failed != 0 || !slices.Equal(result.Pruned, []string{"v1beta1"}) {
		t.Errorf("result = %+v, failures %+v; want %d rewritten, none failed, v1beta1 pruned", result.Counts, result.Failures, n)
	}
	if sent.updates.Load() != n || sent.patches.Load() != n/2 {
		t.Errorf("%d updates and %d patches, want every object written back as listed first (%d) and each refused one patched (%d)", sent.updates.Load(), sent.patches.Load(), n, n/2)
	}
	fx.AssertAllStoredAt(t, "v1", n)
	fx.AssertStoredVersions(t, "v1")
}

// TestMigrateOneNamespaceThenAll: a migration limited to one namespace
// rewrites only that namespace and never prunes, since the other namespaces
// are not proven; a whole migration then re-encodes the rest and counts the
// objects already stored at the target apart, without writing them (etcd
// keeps their resourceVersion, so a third pass writes nothing at all).
func TestMigrateOneNamespaceThenAll(t *testing.T) {
	fx := switched(t, "namespace.migrator.restow.dev", 200)
	m, sent := newMigrator(t)
	opts := migrator.Options{Prune: true, SettleWindow: time.Second}

	target := resolve(t, m, fx)
	target.Namespace = "m-0"
	result, err := m.Migrate(t.Context(), target, opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	if result.Listed != 100 || result.Migrated != 100 || result.AlreadyStored != 0 || len(result.Pruned) != 0 {
		t.Errorf("one namespace: result = %+v, want 100 listed and re-encoded, nothing pruned", result)
	}
	fx.AssertStored(t, map[string]int{"v1": 100, "v1beta1": 100})
	fx.AssertStoredVersions(t, "v1beta1", "v1")

	result, err = m.Migrate(t.Context(), resolve(t, m, fx), opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	if result.Listed != 200 || result.Migrated != 100 || result.AlreadyStored != 100 || !slices.Equal(result.Pruned, []string{"v1beta1"}) {
		t.Errorf("all namespaces: result = %+v, want 200 listed, 100 re-encoded, 100 already stored, v1beta1 pruned", result)
	}
	fx.AssertAllStoredAt(t, "v1", 200)
	fx.AssertStoredVersions(t, "v1")

	before := sent.Load()
	result, err = m.Migrate(t.Context(), resolve(t, m, fx), opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	if result.Listed != 200 || result.Migrated != 0 || result.AlreadyStored != 200 {
		t.Errorf("again: result = %+v, want all 200 already stored", result)
	}
	if sent := sent.Load() - before; sent != 200 {
		t.Errorf("again: %d rewrites, want 200", sent)
	}
}

// TestMigrateResumesAfterTheFirstPass: when reading the CRD fails just after
// the first pass, the checkpoint says the first pass is over, and the resumed
// migration goes on to the finish without rewriting or counting any object
// again.
func TestMigrateResumesAfterTheFirstPass(t *testing.T) {
	fx := switched(t, "afterpass.migrator.restow.dev", 200)
	m, sent := newMigrator(t)
	target := resolve(t, m, fx)
	reader := &failOnce{Reader: m.Reader}
	m.Reader = reader
	var last migrator.Progress
	var mu sync.Mutex
	opts := migrator.Options{Prune: true, SettleWindow: time.Second}
	_, err := m.Migrate(t.Context(), target, opts, func(p migrator.Progress) {
		mu.Lock()
		defer mu.Unlock()
		last = p
	})
	if err == nil || !reader.failed.Load() {
		t.Fatalf("Migrate = %v, want the injected error from reading the CRD", err)
	}
	checkpoint := last.Checkpoint
	if checkpoint.Phase != migrator.PhaseSettling || checkpoint.Listed != 200 {
		t.Fatalf("checkpoint after the first pass: phase %s, %d listed; want Settling, 200", checkpoint.Phase, checkpoint.Listed)
	}
	before := sent.Load()
	opts.Resume = &checkpoint
	result, err := m.Migrate(t.Context(), resolve(t, m, fx), opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	if result.Listed != 200 || result.Done() != 200 || !slices.Equal(result.Pruned, []string{"v1beta1"}) {
		t.Errorf("resumed result = %+v, want 200 listed and done once, v1beta1 pruned", result)
	}
	if sent := sent.Load() - before; sent != 0 {
		t.Errorf("the resumed migration sent %d rewrites, want none: the first pass was over", sent)
	}
	fx.AssertAllStoredAt(t, "v1", 200)
	fx.AssertStoredVersions(t, "v1")
}

// failOnce fails its first read of a CRD.
type failOnce struct {
	client.Reader
	failed atomic.Bool
}

func (r *failOnce) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*apiextensionsv1.CustomResourceDefinition); ok && r.failed.CompareAndSwap(false, true) {
		return apierrors.NewServiceUnavailable("injected: reading the CRD failed")
	}
	return r.Reader.Get(ctx, key, obj, opts...)
}

// TestMigrateResumes: a migration cancelled part-way resumes from the
// checkpoint of its last progress: it rewrites only what was left, and its
// counts match a migration that was never interrupted.
func TestMigrateResumes(t *testing.T) {
	fx := switched(t, "resume.migrator.restow.dev", 500)
	m, sent := newMigrator(t)
	target := resolve(t, m, fx)
	opts := migrator.Options{Concurrency: 1, PageSize: 50, Prune: true, SettleWindow: time.Second}
	ctx, cancel := context.WithCancel(t.Context())
	var last migrator.Progress
	var mu sync.Mutex
	_, err := m.Migrate(ctx, target, opts, func(p migrator.Progress) {
		mu.Lock()
		defer mu.Unlock()
		last = p
		if p.Migrated >= 150 {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Migrate = %v, want cancelled", err)
	}
	mu.Lock()
	checkpoint := last.Checkpoint
	mu.Unlock()
	done := checkpoint.Migrated
	if checkpoint.Continue == "" || done < 150 || done >= 500 {
		t.Fatalf("checkpoint %+v, want a token part-way", checkpoint)
	}
	before := sent.Load()

	opts.Resume = &checkpoint
	result, err := m.Migrate(t.Context(), resolve(t, m, fx), opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	if result.Listed != 500 || result.Migrated+result.AlreadyStored+result.Skipped != 500 || result.Failed != 0 {
		t.Errorf("result = %+v, want exactly 500 listed and rewritten or skipped", result.Counts)
	}
	if !result.StartTime.Equal(checkpoint.StartTime) {
		t.Errorf("the migration started at %v, not at the checkpoint's %v: it did not resume", result.StartTime, checkpoint.StartTime)
	}
	// The resumed list starts after the last page done (the page under way
	// is listed again). The re-check may rewrite again what the first
	// process wrote within the window: its own writes are not known here.
	if first := sent.Load() - before - result.Rechecked; first > 500-done+50 {
		t.Errorf("the resumed first pass sent %d rewrites; %d objects were left", first, 500-done)
	}
	fx.AssertAllStoredAt(t, "v1", 500)
	fx.AssertStoredVersions(t, "v1")
}

// TestMigrateAfterContinueTokenExpired: etcd is compacted after the first
// page, so the next page's continue token answers 410 Expired. The list
// goes on with the token the error offers and every object is rewritten.
// The control plane is the test's own, with lists served from etcd: since
// 1.34 a warm watch cache serves a continued list from its own snapshot,
// which a compaction the API server did not make does not expire (the
// package's control plane did so once the storage switch waited for a
// canary write).
func TestMigrateAfterContinueTokenExpired(t *testing.T) {
	own := testenv.Start(t, testenv.Options{APIServerArgs: map[string]string{"feature-gates": "ListFromCacheSnapshot=false"}})
	fx := testenv.Fixture{Env: own, Group: "expired.migrator.restow.dev", Kind: "Widget", Plural: "widgets", Namespaced: true}
	fx.Install(t, "v1beta1", "v1")
	fx.CreateObjects(t, "v1beta1", 400, func(i int) map[string]any { return map[string]any{"n": int64(i)} }, "m-0", "m-1")
	fx.SwitchStorage(t, "v1")
	m, err := migrator.NewForConfig(own.Config, own.Client)
	if err != nil {
		t.Fatal(err)
	}
	target := resolve(t, m, fx)
	var compacted, expired atomic.Bool
	// The engine logs the 410 at V(2): that is how the test knows it happened.
	log := funcr.New(func(_, args string) {
		if strings.Contains(args, "Continue token expired") {
			expired.Store(true)
		}
	}, funcr.Options{Verbosity: 2})
	result, err := m.Migrate(klog.NewContext(t.Context(), log), target, migrator.Options{Concurrency: 1, PageSize: 50, Prune: true, SettleWindow: time.Second}, func(p migrator.Progress) {
		if p.Listed > 0 && compacted.CompareAndSwap(false, true) {
			if err := own.CompactEtcd(context.Background()); err != nil {
				t.Error(err)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if !expired.Load() {
		t.Error("no list answered 410 Expired after the compaction")
	}
	if !compacted.Load() || result.Listed < 400 || result.Failed != 0 || len(result.Pruned) != 1 {
		t.Errorf("result = %+v (compacted %v), want every object listed and v1beta1 pruned", result, compacted.Load())
	}
	fx.AssertAllStoredAt(t, "v1", 400)
	fx.AssertStoredVersions(t, "v1")
}

// TestMigrateStops: what stops a migration before it rewrites anything, and
// says what the user must change.
func TestMigrateStops(t *testing.T) {
	m, _ := newMigrator(t)
	var stalled *migrator.StalledError
	_, err := m.Resolve(t.Context(), schema.GroupResource{Group: "nowhere.migrator.restow.dev", Resource: "ghosts"})
	if !errors.As(err, &stalled) || !strings.Contains(stalled.Message, "serves no resource") {
		t.Errorf("Resolve of a missing resource = %v, want stalled", err)
	}

	fx := testenv.Fixture{Env: env, Group: "nostatus.migrator.restow.dev", Kind: "Widget", Plural: "widgets", Namespaced: true,
		Mutate: func(crd *apiextensionsv1.CustomResourceDefinition) {
			for i := range crd.Spec.Versions {
				crd.Spec.Versions[i].Subresources = nil
			}
		}}
	fx.Install(t, "v1beta1", "v1")
	fx.CreateObjects(t, "v1beta1", 10, func(int) map[string]any { return nil }, "m-0")
	fx.SwitchStorage(t, "v1")
	_, err = m.Migrate(t.Context(), resolve(t, m, fx), migrator.Options{ViaStatus: true, Prune: true}, nil)
	if !errors.As(err, &stalled) || !strings.Contains(stalled.Message, "subresources.status") {
		t.Errorf("Migrate --via-status without /status = %v, want stalled naming subresources.status", err)
	}
	fx.AssertAllStoredAt(t, "v1beta1", 10)
	fx.AssertStoredVersions(t, "v1beta1", "v1")
}

// TestCheckpointWaitsForEarlierPages: workers move on to later pages while
// an object of an earlier one is still in flight, but the checkpoint never
// passes that object. Here the first object listed hangs until the
// migration is cancelled, after every later page was rewritten: the last
// checkpoint holds nothing done, and the migration resumed from it rewrites
// the hung object (etcd). A checkpoint that committed later pages first
// would count them done, with a token past the hung object (this test then
// fails: tried).
func TestCheckpointWaitsForEarlierPages(t *testing.T) {
	fx := switched(t, "order.migrator.restow.dev", 40)
	var rewritten atomic.Int64
	hung := "/namespaces/m-0/widgets/obj-00000"
	cfg := rest.CopyConfig(env.Config)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if req.Method != http.MethodPatch && req.Method != http.MethodPut {
				return rt.RoundTrip(req)
			}
			if strings.HasSuffix(req.URL.Path, hung) {
				<-req.Context().Done()
				return nil, req.Context().Err()
			}
			resp, err := rt.RoundTrip(req)
			rewritten.Add(1)
			return resp, err
		})
	}
	m, err := migrator.NewForConfig(cfg, env.Client)
	if err != nil {
		t.Fatal(err)
	}
	target := resolve(t, m, fx)
	// Four pages of ten, whether listed as metadata or whole (whose first
	// page holds ten): all held at once (maxPagesAhead).
	opts := migrator.Options{Concurrency: 8, PageSize: 10, Prune: true, SettleWindow: time.Second}
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		// Every object but the hung one: all four pages were handed out.
		_ = wait.PollUntilContextCancel(ctx, 10*time.Millisecond, true, func(context.Context) (bool, error) {
			return rewritten.Load() >= 39, nil
		})
		cancel()
	}()
	var last migrator.Progress
	var mu sync.Mutex
	_, err = m.Migrate(ctx, target, opts, func(p migrator.Progress) {
		mu.Lock()
		defer mu.Unlock()
		last = p
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Migrate = %v, want cancelled", err)
	}
	if got := rewritten.Load(); got < 39 {
		t.Fatalf("%d objects rewritten before the cancel, want every one but the hung one", got)
	}
	if held := migrator.HeldBodyBytes(m); held != 0 {
		t.Errorf("the cancelled migration still holds %d bytes of listed objects", held)
	}
	mu.Lock()
	checkpoint := last.Checkpoint
	mu.Unlock()
	if checkpoint.Continue != "" || checkpoint.Done() != 0 {
		t.Errorf("checkpoint: token %q, %d done; want no page committed while its first object hung", checkpoint.Continue, checkpoint.Done())
	}
	fx.AssertStored(t, map[string]int{"v1": 39, "v1beta1": 1})

	m2, _ := newMigrator(t)
	opts.Resume = &checkpoint
	result, err := m2.Migrate(t.Context(), resolve(t, m2, fx), opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	if result.Listed != 40 || result.Failed != 0 || !slices.Equal(result.Pruned, []string{"v1beta1"}) {
		t.Errorf("resumed result = %+v, want 40 listed, v1beta1 pruned", result)
	}
	fx.AssertAllStoredAt(t, "v1", 40)
	fx.AssertStoredVersions(t, "v1")
}

// TestStaleBodyIsPatched: an object written back as listed is stored as the
// API server decoded it when it listed the page, so a body older than ten
// seconds is patched instead, from the object as it is then. Here v1's
// schema lacks a field the objects hold in etcd, so the list prunes it from
// every body; the first rewrite is held for eleven seconds, during which the
// field comes back into the schema. Every object must keep the field in
// etcd. Written back as listed, each would lose it (this test then fails:
// tried, with the age check removed).
func TestStaleBodyIsPatched(t *testing.T) {
	ctx := t.Context()
	spec := func(props ...string) *apiextensionsv1.JSONSchemaProps {
		s := &apiextensionsv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{}}
		for _, p := range props {
			s.Properties[p] = apiextensionsv1.JSONSchemaProps{Type: "string"}
		}
		return &apiextensionsv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{"spec": *s}}
	}
	fx := testenv.Fixture{Env: env, Group: "stale.migrator.restow.dev", Kind: "Widget", Plural: "widgets", Namespaced: true,
		Mutate: func(crd *apiextensionsv1.CustomResourceDefinition) {
			// v1 as first published, without the field kept.
			crd.Spec.Versions[1].Schema = &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: spec("n")}
		}}
	fx.Install(t, "v1beta1", "v1")
	const n = 10
	fx.CreateObjects(t, "v1beta1", n, func(i int) map[string]any { return map[string]any{"n": "x", "kept": "yes"} }, "m-0")
	fx.SwitchStorage(t, "v1")

	var held atomic.Bool
	cfg := rest.CopyConfig(env.Config)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if req.Method != http.MethodPut || held.Swap(true) {
				return rt.RoundTrip(req)
			}
			// The schema is mended while the first rewrite is held, and
			// the rewrite fails as if the API server were busy.
			if err := env.UpdateCRD(req.Context(), fx.CRDName(), func(crd *apiextensionsv1.CustomResourceDefinition) {
				for i := range crd.Spec.Versions {
					if crd.Spec.Versions[i].Name == "v1" {
						crd.Spec.Versions[i].Schema = &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: spec("n", "kept")}
					}
				}
			}); err != nil {
				return nil, err
			}
			select {
			case <-time.After(11 * time.Second):
			case <-req.Context().Done():
				return nil, req.Context().Err()
			}
			return &http.Response{StatusCode: http.StatusServiceUnavailable, Header: http.Header{"Content-Type": {"text/plain"}},
				Body: io.NopCloser(strings.NewReader("held by the test")), Request: req}, nil
		})
	}
	m, sent := newMigratorFor(t, cfg)
	result, err := m.FirstPass(ctx, resolve(t, m, fx), migrator.Options{Concurrency: 1, FixedConcurrency: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if result.Migrated != n || result.Failed != 0 {
		t.Errorf("result = %+v, failures %+v; want %d rewritten", result.Counts, result.Failures, n)
	}
	t.Logf("%d updates, %d patches", sent.updates.Load(), sent.patches.Load())
	fx.AssertAllStoredAt(t, "v1", n)
	for i := range n {
		name := fmt.Sprintf("obj-%05d", i)
		stored, err := env.ReadStored(ctx, fx.Group, fx.Plural, "m-0", name)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(stored.Raw), `"kept":"yes"`) {
			t.Errorf("%s lost spec.kept in etcd: %s", name, stored.Raw)
		}
	}
}

// TestBodyBudget: the objects a Migrator's passes hold to write back as
// listed stay within Migrator.BodyBytes. A page beyond it is patched, and a
// pass gives back what it held when it ends, so the next one writes back as
// listed again. Every object is at v1 in etcd either way.
func TestBodyBudget(t *testing.T) {
	const n = 100
	m, sent := newMigrator(t)
	for _, tc := range []struct {
		group            string
		budget           int64
		updates, patches int64
	}{
		{"budget1.migrator.restow.dev", 1, 0, n},
		{"budget2.migrator.restow.dev", 0, n, 0},
	} {
		fx := switched(t, tc.group, n)
		m.BodyBytes = tc.budget
		updates, patches := sent.updates.Load(), sent.patches.Load()
		result, err := m.FirstPass(t.Context(), resolve(t, m, fx), migrator.Options{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if result.Migrated != n || result.Failed != 0 {
			t.Errorf("budget %d: result = %+v, want %d rewritten", tc.budget, result.Counts, n)
		}
		if u, p := sent.updates.Load()-updates, sent.patches.Load()-patches; u != tc.updates || p != tc.patches {
			t.Errorf("budget %d: %d updates and %d patches, want %d and %d", tc.budget, u, p, tc.updates, tc.patches)
		}
		if held := migrator.HeldBodyBytes(m); held != 0 {
			t.Errorf("budget %d: %d bytes of listed objects still held after the pass", tc.budget, held)
		}
		fx.AssertAllStoredAt(t, "v1", n)
	}
}
