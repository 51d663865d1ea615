package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// The yield measurement: a steady writer, another client of the same API
// server, writes ConfigMaps at a fixed rate; its latency is measured alone
// and while a pass runs. The pass runs as restow's service account, which
// the shipped FlowSchema (config/flowcontrol) puts in restow's own priority
// level; the writer is another service account, in the built-in
// workload-low level. The administrator the other rows run as is exempt
// from API Priority and Fairness.

const (
	// writerInterval is the steady writer's pace: 50 writes a second.
	writerInterval = 20 * time.Millisecond
	// writerAlone is how long the writer runs alone before each pass.
	writerAlone     = 10 * time.Second
	writerNamespace = "bench-writer"
	// restowUser is the service account the shipped FlowSchema matches,
	// named as config/default names it.
	restowNamespace = "restow-system"
	restowAccount   = "restow-controller-manager"
)

var yield struct {
	once    sync.Once
	err     error
	clients *clients
	writer  kubernetes.Interface
}

// yieldClients installs the shipped API Priority and Fairness objects and
// returns clients that authenticate as restow's service account.
func yieldClients(b *testing.B) *clients {
	yield.once.Do(func() {
		yield.err = installFlowControl(b.Context())
		if yield.err != nil {
			return
		}
		var restowCfg, writerCfg *rest.Config
		if restowCfg, yield.err = serviceAccountConfig(b.Context(), restowNamespace, restowAccount); yield.err != nil {
			return
		}
		if writerCfg, yield.err = serviceAccountConfig(b.Context(), writerNamespace, "writer"); yield.err != nil {
			return
		}
		yield.clients = newClients(b, env, restowCfg)
		yield.writer, yield.err = kubernetes.NewForConfig(writerCfg)
	})
	if yield.err != nil {
		b.Fatal(yield.err)
	}
	return yield.clients
}

// installFlowControl creates the PriorityLevelConfiguration and FlowSchema
// of config/flowcontrol, the FlowSchema's subject named as config/default
// names restow's service account.
func installFlowControl(ctx context.Context) error {
	level := &flowcontrolv1.PriorityLevelConfiguration{}
	schema := &flowcontrolv1.FlowSchema{}
	for file, obj := range map[string]any{"priority_level.yaml": level, "flow_schema.yaml": schema} {
		raw, err := os.ReadFile(filepath.Join("..", "..", "..", "config", "flowcontrol", file))
		if err != nil {
			return err
		}
		if err := yaml.UnmarshalStrict(raw, obj); err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
	}
	level.Name = "restow-migrations"
	schema.Name = "restow-migrations"
	schema.Spec.PriorityLevelConfiguration.Name = level.Name
	for i := range schema.Spec.Rules {
		for j := range schema.Spec.Rules[i].Subjects {
			if sa := schema.Spec.Rules[i].Subjects[j].ServiceAccount; sa != nil {
				sa.Namespace, sa.Name = restowNamespace, restowAccount
			}
		}
	}
	for _, obj := range []client.Object{level, schema} {
		if err := env.Client.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return nil
}

// serviceAccountConfig returns a configuration that authenticates as the
// service account namespace/name, bound to cluster-admin: what it may do
// is not measured here, only how API Priority and Fairness treats it.
func serviceAccountConfig(ctx context.Context, namespace, name string) (*rest.Config, error) {
	if err := env.EnsureNamespaces(ctx, namespace); err != nil {
		return nil, err
	}
	user := "system:serviceaccount:" + namespace + ":" + name
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "bench-" + namespace + "-" + name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	if err := env.Client.Create(ctx, binding); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	return env.ConfigAs(user, "system:serviceaccounts", "system:serviceaccounts:"+namespace, "system:authenticated")
}

// steadyWriter patches one of ten ConfigMaps every writerInterval and
// records how long each write took.
type steadyWriter struct {
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	mu        sync.Mutex
	latencies []time.Duration
	err       error
}

func startWriter(b *testing.B) *steadyWriter {
	ctx, cancel := context.WithCancel(b.Context())
	w := &steadyWriter{cancel: cancel}
	configMaps := yield.writer.CoreV1().ConfigMaps(writerNamespace)
	for i := range 10 {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("steady-%d", i)}}
		if _, err := configMaps.Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			b.Fatal(err)
		}
	}
	w.wg.Go(func() {
		ticker := time.NewTicker(writerInterval)
		defer ticker.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
			patch := fmt.Appendf(nil, `{"data":{"n":"%d"}}`, i)
			start := time.Now()
			_, err := configMaps.Patch(ctx, fmt.Sprintf("steady-%d", i%10), types.MergePatchType, patch, metav1.PatchOptions{})
			took := time.Since(start)
			w.mu.Lock()
			if err != nil && ctx.Err() == nil && w.err == nil {
				w.err = err
			}
			if err == nil {
				w.latencies = append(w.latencies, took)
			}
			w.mu.Unlock()
		}
	})
	b.Cleanup(w.cancel)
	return w
}

// stop ends the writer and returns its latencies; a failed write fails the benchmark.
func (w *steadyWriter) stop(b *testing.B) []time.Duration {
	b.Helper()
	w.cancel()
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		b.Fatalf("the steady writer failed: %v", w.err)
	}
	return w.latencies
}

// writerFigures are the steady writer's latency percentiles, alone and
// during the pass, in milliseconds, over this many writes.
type writerFigures struct {
	alone, during []time.Duration
	AloneP50Ms    float64 `json:"aloneP50Ms"`
	AloneP99Ms    float64 `json:"aloneP99Ms"`
	DuringP50Ms   float64 `json:"duringP50Ms"`
	DuringP99Ms   float64 `json:"duringP99Ms"`
	AloneWrites   int     `json:"aloneWrites"`
	DuringWrites  int     `json:"duringWrites"`
}

func (w *writerFigures) figures() *writerFigures {
	w.AloneP50Ms, w.AloneP99Ms = percentileMs(w.alone, 0.50), percentileMs(w.alone, 0.99)
	w.DuringP50Ms, w.DuringP99Ms = percentileMs(w.during, 0.50), percentileMs(w.during, 0.99)
	w.AloneWrites, w.DuringWrites = len(w.alone), len(w.during)
	return w
}

// percentileMs is the q-quantile of latencies (nearest rank), in milliseconds.
func percentileMs(latencies []time.Duration, q float64) float64 {
	if len(latencies) == 0 {
		return 0
	}
	sorted := slices.Clone(latencies)
	slices.SortFunc(sorted, cmp.Compare)
	i := min(len(sorted)-1, int(q*float64(len(sorted))))
	return float64(sorted[i].Microseconds()) / 1000
}

// profileSeconds is how long the CPU profiles of a profiled pass run: the
// first ten seconds of the pass, at 10,000 objects most of it.
const profileSeconds = 10

// startProfiles records, for a profiled strategy at sweepObjects when
// RESTOW_BENCH_PROFILE names a directory, the CPU profiles of this process
// and of the API server over the first profileSeconds of the pass, and
// writes each with its top functions as text (go tool pprof -top). The
// returned function waits for both.
func (f *compareFixture) startProfiles(b *testing.B, s strategy) func() {
	dir := os.Getenv("RESTOW_BENCH_PROFILE")
	if dir == "" || !s.profile || f.n != sweepObjects || f.round > 0 {
		return func() {}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	var errs [2]error
	benchFile := filepath.Join(dir, s.name+"-process.pprof")
	apiserverFile := filepath.Join(dir, s.name+"-apiserver.pprof")
	out, err := os.Create(benchFile)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		b.Fatal(err)
	}
	wg.Go(func() {
		time.Sleep(profileSeconds * time.Second)
		pprof.StopCPUProfile()
		errs[0] = out.Close()
	})
	wg.Go(func() { errs[1] = apiServerProfile(b.Context(), apiserverFile) })
	return func() {
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
		for _, file := range []string{benchFile, apiserverFile} {
			top, err := exec.Command("go", "tool", "pprof", "-top", "-cum", "-nodecount=80", file).CombinedOutput()
			if err != nil {
				b.Fatalf("go tool pprof %s: %v\n%s", file, err, top)
			}
			if err := os.WriteFile(file+".txt", top, 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// apiServerProfile writes the API server's CPU profile of the next
// profileSeconds to file, from its /debug/pprof endpoint.
func apiServerProfile(ctx context.Context, file string) error {
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		return err
	}
	profile, err := cs.Discovery().RESTClient().Get().AbsPath("/debug/pprof/profile").
		Param("seconds", strconv.Itoa(profileSeconds)).Stream(ctx)
	if err != nil {
		return fmt.Errorf("API server profile: %w", err)
	}
	defer profile.Close()
	out, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, profile); err != nil {
		return err
	}
	return out.Close()
}
