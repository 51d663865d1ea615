//go:build e2e

// Package scenario is the end-to-end suite's common ground: one CRD with
// objects at v1beta1 on a control plane, the manager binary run as a
// process of its own to migrate it, writers that change it meanwhile, and
// the proof read from etcd at the end. The suite's packages (failover,
// faults, churn, ha, intree) each inject their own faults; `make test-e2e`
// runs them side by side.
package scenario

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/cli"
	"github.com/restow/restow/internal/operator"
	"github.com/restow/restow/internal/testenv"
)

// CRDDirectory holds restow's own CRDs, from a package of the suite.
const CRDDirectory = "../../config/crd/bases"

// CompactionInterval is the etcd compaction interval of the control plane
// Main starts: short, so that a slow pass outlives its continue token.
const CompactionInterval = 5 * time.Second

// Main runs a package's tests on a control plane of its own, with restow's
// CRDs installed and etcd compacted every CompactionInterval, and sets *env.
func Main(m *testing.M, env **testenv.Env) {
	testenv.Main(m, testenv.Options{
		CRDDirectoryPaths: []string{CRDDirectory},
		APIServerArgs:     map[string]string{"etcd-compaction-interval": CompactionInterval.String()},
	}, env)
}

// ObjectCount is the number of objects per scenario: RESTOW_E2E_OBJECTS, by
// default 5,000.
func ObjectCount(t *testing.T) int {
	return CountFromEnv(t, "RESTOW_E2E_OBJECTS", 5000, 100)
}

// CountFromEnv is the number the environment variable name gives, at least
// least, or def when it is unset.
func CountFromEnv(t *testing.T, name string, def, least int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < least {
		t.Fatalf("%s=%q: want a number of at least %d", name, s, least)
	}
	return n
}

// Scenario is one CRD with objects at v1beta1, the managers that migrate it,
// the writers that change it meanwhile and an observer of its
// status.storedVersions.
type Scenario struct {
	// Env is the control plane the scenario runs on.
	Env *testenv.Env
	// Group is the CRD's API group, CRDName its name.
	Group, CRDName string
	// N is the number of objects created at v1beta1.
	N int
	// Namespaces hold the objects, object i in Namespaces[i%5].
	Namespaces []string
	// Observer records storedVersions seen as one version while etcd
	// still held objects at another: a prune before the pass was complete.
	Observer *testenv.PruneObserver

	t          *testing.T
	name       string
	versions   []string
	conversion *apiextensionsv1.CustomResourceConversion
	// fx is the scenario's CRD as the shared test fixture.
	fx testenv.Fixture
	// kubeconfig is the managers' kubeconfig for Env.
	kubeconfig string
	// writers, when started, update and delete objects during the pass.
	writers *writers
}

const (
	// Kind is every scenario's custom resource's kind.
	Kind = "Widget"
	// Plural is its resource name.
	Plural = "widgets"
	// Label marks a scenario's CRD; each manager migrates its own only.
	Label = "e2e.restow.dev/scenario"
)

// Option changes a scenario before New installs it.
type Option func(*Scenario)

// WithVersions serves these versions, v1beta1 being the storage version at
// the start.
func WithVersions(versions ...string) Option {
	return func(s *Scenario) { s.versions = versions }
}

// WithConversion converts between versions with a webhook.
func WithConversion(c *apiextensionsv1.CustomResourceConversion) Option {
	return func(s *Scenario) { s.conversion = c }
}

// WithObjects makes the scenario's object count n instead of ObjectCount's.
func WithObjects(n int) Option {
	return func(s *Scenario) { s.N = n }
}

// New installs the scenario's CRD on env with ObjectCount objects at
// v1beta1 in 5 namespaces and starts observing its storedVersions.
func New(t *testing.T, env *testenv.Env, name string, opts ...Option) *Scenario {
	t.Helper()
	s := &Scenario{
		t: t, name: name, N: ObjectCount(t), Env: env,
		Group:    name + ".e2e.restow.dev",
		versions: []string{"v1beta1", "v1"},
	}
	for _, o := range opts {
		o(s)
	}
	s.kubeconfig = filepath.Join(t.TempDir(), "kubeconfig")
	if err := s.Env.WriteKubeconfig(s.kubeconfig); err != nil {
		t.Fatal(err)
	}
	s.fx = testenv.Fixture{Env: s.Env, Group: s.Group, Kind: Kind, Plural: Plural, Namespaced: true,
		Labels: map[string]string{Label: name}, Conversion: s.conversion}
	s.CRDName = s.fx.CRDName()
	s.fx.Install(t, s.versions...)
	t.Cleanup(func() {
		// Before the CRD's deletion (cleanups run last first).
		_ = s.Env.Client.Delete(context.Background(), &migrationv1alpha1.StorageMigration{ObjectMeta: metav1.ObjectMeta{Name: s.CRDName}})
	})
	for i := range 5 {
		s.Namespaces = append(s.Namespaces, fmt.Sprintf("%s-%d", name, i))
	}
	if err := s.Env.EnsureNamespaces(t.Context(), s.Namespaces...); err != nil {
		t.Fatal(err)
	}
	payload := strings.Repeat("x", 512)
	err := s.Env.CreateObjects(t.Context(), s.N, func(i int) client.Object {
		u := s.Object("v1beta1", i)
		u.Object["spec"] = map[string]any{"n": int64(i), "payload": payload, "writer": "created"}
		return u
	})
	if err != nil {
		t.Fatal(err)
	}
	s.AssertStored("v1beta1", s.N)
	s.Observer = s.Env.ObservePrunes(t, s.Group, Plural, 100*time.Millisecond)
	return s
}

// Object is object i at version, as a client sends it.
func (s *Scenario) Object(version string, i int) *unstructured.Unstructured {
	return s.fx.Object(version, s.Namespaces[i%len(s.Namespaces)], fmt.Sprintf("widget-%05d", i), nil)
}

// StartManager runs the manager binary for this scenario: automatic
// migration for this scenario's CRD only, leader election in its own
// namespace, short stalled retries.
func (s *Scenario) StartManager(name string, args ...string) *operator.Process {
	s.t.Helper()
	p := operator.StartProcess(s.t, operator.ProcessOptions{
		Name:       name,
		Kubeconfig: s.kubeconfig,
		Args: append([]string{
			"--auto-migrate-selector=" + Label + "=" + s.name,
			"--leader-election-namespace=" + s.Namespaces[0],
			"--stalled-retry-base=1s",
			"--stalled-retry-max=5s",
			"--status-interval=1s",
			// Short: no scenario holds a write on the old storage for long.
			// TestHeldWriteDuringSwitch (controllers) proves the window.
			"--settle-window=3s",
		}, args...),
	})
	logFile(s.t, p)
	return p
}

// SwitchStorage makes version the storage version.
func (s *Scenario) SwitchStorage(version string) { s.t.Helper(); s.fx.SwitchStorage(s.t, version) }

// StoredCounts reads etcd: objects of the scenario's resource by the
// version they are stored at.
func (s *Scenario) StoredCounts(ctx context.Context) (map[string]int, error) {
	return s.fx.StoredCounts(ctx)
}

// WaitMidPass waits until etcd holds at least a fifth of the objects at v1
// (the first switch's target) and at least a fifth at others: the pass is
// under way. It fails once etcd's counts have not moved for two minutes.
func (s *Scenario) WaitMidPass() {
	s.t.Helper()
	const version = "v1"
	var counts map[string]int
	testenv.WaitProgress(s.t, "the pass to be under way", 2*time.Minute, func(ctx context.Context) (bool, string, error) {
		var err error
		counts, err = s.StoredCounts(ctx)
		if err != nil {
			return false, "", err
		}
		return counts[version] >= s.N/5 && s.N-counts[version] >= s.N/5, fmt.Sprintf("etcd holds %v", counts), nil
	})
	s.t.Logf("mid-pass: etcd holds %v", counts)
}

// WaitMigrated waits until storedVersions is [version] and the
// StorageMigration named after the CRD is Ready, for as long as its status
// shows progress: it fails once it has shown none for two minutes (a fault
// the scenario injected may hold the pass back that long).
func (s *Scenario) WaitMigrated(version string) {
	s.t.Helper()
	const stall = 2 * time.Minute
	crd := &apiextensionsv1.CustomResourceDefinition{}
	storedVersions := func() string { return fmt.Sprintf("storedVersions %v", crd.Status.StoredVersions) }
	s.Env.WaitForMigration(s.t, s.CRDName, stall, "migrated to "+version, func(sm *migrationv1alpha1.StorageMigration) bool {
		if err := s.Env.Client.Get(s.t.Context(), client.ObjectKey{Name: s.CRDName}, crd); err != nil {
			s.t.Logf("reading CRD %s: %v", s.CRDName, err)
			return false
		}
		return slices.Equal(crd.Status.StoredVersions, []string{version}) && sm.ReadyAt(version)
	}, storedVersions)
}

// AssertStored checks in etcd that want objects are stored, all at version.
func (s *Scenario) AssertStored(version string, want int) {
	s.t.Helper()
	s.fx.AssertAllStoredAt(s.t, version, want)
}

// AssertDone is every scenario's end: all objects (less those the writers
// deleted) at version in etcd, storedVersions [version], never pruned early,
// and every writer's last write is what etcd holds.
func (s *Scenario) AssertDone(version string) {
	s.t.Helper()
	s.Observer.AssertNoEarlyPrune(s.t, true)
	want := s.N
	if s.writers != nil {
		want -= len(s.writers.deleted())
	}
	s.AssertStored(version, want)
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := s.Env.Client.Get(s.t.Context(), client.ObjectKey{Name: s.CRDName}, crd); err != nil {
		s.t.Fatal(err)
	}
	if !slices.Equal(crd.Status.StoredVersions, []string{version}) {
		s.t.Errorf("status.storedVersions = %v, want [%s]", crd.Status.StoredVersions, version)
	}
	if s.writers != nil {
		s.writers.assertLastWritesStored()
	}
}

// writers update and delete the scenario's objects concurrently with the
// pass, each writer owning a disjoint share of them, and record the last
// confirmed write of each object.
type writers struct {
	s      *Scenario
	stop   context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	last   map[int]string
	gone   map[int]bool
	writes atomic.Int64
}

// StartWriters starts k writers; each update sets spec.writer to a value
// never used before, with no resourceVersion precondition, as a careless
// client would. A write whose outcome is unknown (an error) is repeated
// with a new value until it is confirmed.
func (s *Scenario) StartWriters(k int) {
	ctx, cancel := context.WithCancel(context.Background())
	w := &writers{s: s, stop: cancel, last: map[int]string{}, gone: map[int]bool{}}
	s.writers = w
	for id := range k {
		w.wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(id), 42))
			for seq := 0; ctx.Err() == nil; seq++ {
				i := id + k*rng.IntN(s.N/k)
				w.mu.Lock()
				deleted := w.gone[i]
				w.mu.Unlock()
				if deleted {
					continue
				}
				if rng.IntN(50) == 0 {
					w.deleteObject(ctx, i)
					continue
				}
				w.update(ctx, i, fmt.Sprintf("w%d-%d", id, seq))
				time.Sleep(time.Duration(rng.IntN(10)) * time.Millisecond)
			}
		})
	}
	s.t.Cleanup(w.finish)
}

func (w *writers) update(ctx context.Context, i int, value string) {
	for attempt := 0; ctx.Err() == nil; attempt++ {
		obj := w.s.Object("v1", i)
		patch := fmt.Appendf(nil, `{"spec":{"writer":%q}}`, fmt.Sprintf("%s.%d", value, attempt))
		err := w.s.Env.Client.Patch(ctx, obj, client.RawPatch(types.MergePatchType, patch))
		if err == nil {
			w.mu.Lock()
			w.last[i] = fmt.Sprintf("%s.%d", value, attempt)
			w.mu.Unlock()
			w.writes.Add(1)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Stopped with the outcome unknown: whatever etcd holds is the last write.
	w.mu.Lock()
	w.last[i] = "?"
	w.mu.Unlock()
}

func (w *writers) deleteObject(ctx context.Context, i int) {
	for ctx.Err() == nil {
		err := w.s.Env.Client.Delete(ctx, w.s.Object("v1", i))
		if err == nil || apierrors.IsNotFound(err) {
			w.mu.Lock()
			w.gone[i] = true
			w.mu.Unlock()
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	w.mu.Lock()
	w.last[i] = "?"
	w.mu.Unlock()
}

// finish stops the writers and waits for them.
func (w *writers) finish() {
	w.stop()
	w.wg.Wait()
}

func (w *writers) deleted() []int {
	w.finish()
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]int, 0, len(w.gone))
	for i := range w.gone {
		out = append(out, i)
	}
	// A delete cut off by the writers' stop may still have been carried
	// out: its outcome ("?") is what the API server says now.
	for i, last := range w.last {
		if last != "?" || w.gone[i] {
			continue
		}
		err := w.s.Env.Client.Get(context.Background(), client.ObjectKeyFromObject(w.s.Object("v1", i)), w.s.Object("v1", i))
		if apierrors.IsNotFound(err) {
			out = append(out, i)
		}
	}
	return out
}

// assertLastWritesStored reads every object from etcd: each written one
// holds its last confirmed write, and no deleted one is back.
func (w *writers) assertLastWritesStored() {
	t := w.s.t
	t.Helper()
	w.finish()
	w.mu.Lock()
	defer w.mu.Unlock()
	checked, unknown := 0, 0
	for i := range w.s.N {
		obj := w.s.Object("v1", i)
		want, written := w.last[i]
		if want == "?" {
			unknown++
			continue
		}
		stored, err := w.s.Env.ReadStored(t.Context(), w.s.Group, Plural, obj.GetNamespace(), obj.GetName())
		if w.gone[i] {
			if err == nil {
				t.Errorf("%s/%s was deleted but etcd holds it again", obj.GetNamespace(), obj.GetName())
			}
			continue
		}
		if err != nil {
			t.Errorf("%s/%s: %v", obj.GetNamespace(), obj.GetName(), err)
			continue
		}
		if !written {
			continue
		}
		var body struct {
			Spec struct {
				Writer string `json:"writer"`
			} `json:"spec"`
		}
		if err := json.Unmarshal(stored.Raw, &body); err != nil {
			t.Fatalf("%s: %v", stored.Key, err)
		}
		if body.Spec.Writer != want {
			t.Errorf("%s/%s: etcd holds writer %q, the last confirmed write was %q: a lost update", obj.GetNamespace(), obj.GetName(), body.Spec.Writer, want)
		}
		checked++
	}
	t.Logf("writers: %d updates confirmed, %d objects deleted; %d last writes checked in etcd (%d left unknown when the writers stopped)",
		w.writes.Load(), len(w.gone), checked, unknown)
	if checked == 0 {
		t.Error("no write was checked: the writers did nothing")
	}
}

// Migration reads the scenario's StorageMigration.
func (s *Scenario) Migration(ctx context.Context) (*migrationv1alpha1.StorageMigration, error) {
	sm := &migrationv1alpha1.StorageMigration{}
	return sm, s.Env.Client.Get(ctx, client.ObjectKey{Name: s.CRDName}, sm)
}

// WaitCondition waits until the scenario's StorageMigration has condition
// True with reason, and returns its message. It fails once the status has
// shown no progress for stall.
func (s *Scenario) WaitCondition(condition, reason string, stall time.Duration) string {
	s.t.Helper()
	sm := s.Env.WaitForMigration(s.t, s.CRDName, stall, condition+"="+reason, func(sm *migrationv1alpha1.StorageMigration) bool {
		c := apimeta.FindStatusCondition(sm.Status.Conditions, condition)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == reason
	})
	return apimeta.FindStatusCondition(sm.Status.Conditions, condition).Message
}

// logFile keeps a manager's log beside the test's other output when
// RESTOW_E2E_LOGS names a directory.
func logFile(t *testing.T, p *operator.Process) {
	dir := os.Getenv("RESTOW_E2E_LOGS")
	if dir == "" {
		return
	}
	t.Cleanup(func() {
		name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name() + "-" + p.Name + ".log")
		_ = os.WriteFile(filepath.Join(dir, name), []byte(p.Logs()), 0o644)
	})
}

// StartBuiltInManager runs the manager binary on e for built-in resources,
// with args after these defaults: short stalled retries, status every
// second, and discovery read every 2 s (a server restarted in place, or a
// reloaded encryption configuration, changes no Lease, so this period is
// what sees it).
func StartBuiltInManager(t *testing.T, e *testenv.Env, args ...string) *operator.Process {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := e.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	return operator.StartProcess(t, operator.ProcessOptions{Kubeconfig: kubeconfig, Args: append([]string{
		"--stalled-retry-base=1s", "--stalled-retry-max=5s", "--status-interval=1s", "--builtin-discovery-interval=2s",
	}, args...)})
}

// Restow runs kubectl restow against e (its own kubeconfig and discovery
// cache), logs what it printed, and returns its standard output and error
// and its exit code.
func Restow(t *testing.T, e *testenv.Env, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := e.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	code = cli.Execute(t.Context(), append([]string{"--kubeconfig", kubeconfig, "--cache-dir", filepath.Join(dir, "cache")}, args...),
		genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	t.Logf("kubectl restow %s: exit %d\n%s%s", strings.Join(args, " "), code, out.String(), errOut.String())
	return out.String(), errOut.String(), code
}
