//go:build e2e && gitops

package gitops

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/restow/restow/internal/testenv"
)

const (
	// fluxNamespace holds Flux's objects, as a Flux installation does.
	fluxNamespace = "flux-system"
	// repository is the GitRepository every Kustomization reads.
	repository = "platform"
	// sourceCRDs are source-controller's CRDs, GitRepository among them,
	// from a release kustomize-controller v1.9 reads.
	sourceCRDs = "../releases/testdata/fluxcd-source-controller/v1.9.1/crds"
)

// kustomizeCRDs is the directory of kustomize-controller's own CRD in its
// module, which make test-gitops gives.
func kustomizeCRDs(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("RESTOW_KUSTOMIZE_CRDS")
	if dir == "" {
		t.Fatal("RESTOW_KUSTOMIZE_CRDS is not set: run make test-gitops, which builds kustomize-controller and gives its CRDs")
	}
	return dir
}

// flux is kustomize-controller running against a control plane, and the
// artifacts of the GitRepository it reads, served by the test in the
// place of source-controller.
type flux struct {
	cp  *testenv.Env
	srv *httptest.Server

	mu        sync.Mutex
	artifacts map[string][]byte
}

// startFlux serves artifacts on a loopback address and runs the
// kustomize-controller that make test-gitops built, with its defaults
// but for loopback addresses and a shorter wait between checks of a
// dependency.
func startFlux(t *testing.T, cp *testenv.Env) *flux {
	t.Helper()
	bin := os.Getenv("RESTOW_KUSTOMIZE_CONTROLLER")
	if bin == "" {
		t.Fatal("RESTOW_KUSTOMIZE_CONTROLLER is not set: run make test-gitops, which builds it")
	}
	f := &flux{cp: cp, artifacts: map[string][]byte{}}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	if err := cp.EnsureNamespaces(t.Context(), fluxNamespace); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	health := freeAddress(t)
	logs := &testenv.LockedBuffer{}
	cmd := exec.Command(bin, "--metrics-addr="+freeAddress(t), "--health-addr="+health,
		"--watch-all-namespaces=true", "--requeue-dependency=5s", "--log-level=debug")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "RUNTIME_NAMESPACE="+fluxNamespace)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("kustomize-controller's log:\n%s", logs.String())
		}
	})
	testenv.WaitProgress(t, "kustomize-controller to be ready", time.Minute, func(ctx context.Context) (bool, string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+health+"/readyz", nil)
		if err != nil {
			return false, "", err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			// Not listening yet: no answer is progress to wait on.
			return false, "no answer: " + err.Error(), nil //nolint:nilerr // the wait goes on
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status, nil
	})
	return f
}

// freeAddress is a loopback address with a port free now.
func freeAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String()
}

func (f *flux) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	body, ok := f.artifacts[r.URL.Path]
	f.mu.Unlock()
	if !ok {
		http.NotFound(w, r)
		return
	}
	_, _ = w.Write(body)
}

// publish makes files (path to content) the GitRepository's artifact at
// revision rev, as source-controller does after a commit: a tarball served
// over HTTP, and the GitRepository's status naming it with its digest. It
// returns the revision as Flux writes it.
func (f *flux) publish(t *testing.T, rev string, files map[string][]byte) string {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(files[name])), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(files[name]); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(buf.Bytes())
	commit := sha1.Sum([]byte(rev))
	revision := "main@sha1:" + hex.EncodeToString(commit[:])
	path := "/gitrepository/" + fluxNamespace + "/" + repository + "/" + hex.EncodeToString(sum[:]) + ".tar.gz"
	f.mu.Lock()
	f.artifacts[path] = buf.Bytes()
	f.mu.Unlock()
	f.setArtifact(t, map[string]any{
		"path": strings.TrimPrefix(path, "/"), "url": f.srv.URL + path, "revision": revision,
		"digest": "sha256:" + hex.EncodeToString(sum[:]), "size": int64(buf.Len()),
		"lastUpdateTime": time.Now().UTC().Format(time.RFC3339),
	})
	t.Logf("published %s as %s", rev, revision)
	return revision
}

// setArtifact creates the GitRepository if there is none and writes its
// status as source-controller would: Ready, with artifact.
func (f *flux) setArtifact(t *testing.T, artifact map[string]any) {
	t.Helper()
	repo := &unstructured.Unstructured{}
	repo.SetAPIVersion("source.toolkit.fluxcd.io/v1")
	repo.SetKind("GitRepository")
	key := client.ObjectKey{Namespace: fluxNamespace, Name: repository}
	if err := f.cp.Client.Get(t.Context(), key, repo); err != nil {
		repo.SetNamespace(fluxNamespace)
		repo.SetName(repository)
		repo.Object["spec"] = map[string]any{"interval": "10m", "url": f.srv.URL + "/platform.git", "ref": map[string]any{"branch": "main"}}
		if err := f.cp.Client.Create(t.Context(), repo); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().UTC().Format(time.RFC3339)
	repo.Object["status"] = map[string]any{
		"observedGeneration": repo.GetGeneration(),
		"artifact":           artifact,
		"conditions": []any{
			map[string]any{"type": "Ready", "status": "True", "reason": "Succeeded", "message": "stored artifact for revision " + artifact["revision"].(string),
				"observedGeneration": repo.GetGeneration(), "lastTransitionTime": now},
			map[string]any{"type": "ArtifactInStorage", "status": "True", "reason": "Succeeded", "message": "stored artifact",
				"observedGeneration": repo.GetGeneration(), "lastTransitionTime": now},
		},
	}
	if err := f.cp.Client.Status().Update(t.Context(), repo); err != nil {
		t.Fatal(err)
	}
}

// kustomization creates a Kustomization of the GitRepository with spec
// (sourceRef added).
func (f *flux) kustomization(t *testing.T, name string, spec map[string]any) {
	t.Helper()
	k := &unstructured.Unstructured{}
	k.SetAPIVersion("kustomize.toolkit.fluxcd.io/v1")
	k.SetKind("Kustomization")
	k.SetNamespace(fluxNamespace)
	k.SetName(name)
	spec["sourceRef"] = map[string]any{"kind": "GitRepository", "name": repository}
	k.Object["spec"] = spec
	if err := f.cp.Client.Create(t.Context(), k); err != nil {
		t.Fatal(err)
	}
}

// status is what a Kustomization's status says.
type status struct {
	ready, reason, message         string
	readySince                     time.Time
	lastApplied, lastAttempted     string
	observedGeneration, generation int64
}

func (s status) String() string {
	return fmt.Sprintf("Ready=%s %s: %s (last applied %s, last attempted %s)", s.ready, s.reason, s.message, s.lastApplied, s.lastAttempted)
}

// read reads Kustomization name's status.
func (f *flux) read(ctx context.Context, name string) (status, error) {
	k := &unstructured.Unstructured{}
	k.SetAPIVersion("kustomize.toolkit.fluxcd.io/v1")
	k.SetKind("Kustomization")
	if err := f.cp.Client.Get(ctx, client.ObjectKey{Namespace: fluxNamespace, Name: name}, k); err != nil {
		return status{}, err
	}
	s := status{generation: k.GetGeneration()}
	s.lastApplied, _, _ = unstructured.NestedString(k.Object, "status", "lastAppliedRevision")
	s.lastAttempted, _, _ = unstructured.NestedString(k.Object, "status", "lastAttemptedRevision")
	s.observedGeneration, _, _ = unstructured.NestedInt64(k.Object, "status", "observedGeneration")
	conditions, _, _ := unstructured.NestedSlice(k.Object, "status", "conditions")
	for _, c := range conditions {
		c, _ := c.(map[string]any)
		if c["type"] != "Ready" {
			continue
		}
		s.ready, _ = c["status"].(string)
		s.reason, _ = c["reason"].(string)
		s.message, _ = c["message"].(string)
		since, _ := c["lastTransitionTime"].(string)
		s.readySince, _ = time.Parse(time.RFC3339, since)
	}
	return s, nil
}

// awaitReady waits until Kustomization name is Ready with revision
// applied; stall bounds a wait on which its status does not change.
func (f *flux) awaitReady(t *testing.T, name, revision string, stall time.Duration) {
	t.Helper()
	var last status
	testenv.WaitProgress(t, "Kustomization "+name+" Ready at "+revision, stall, func(ctx context.Context) (bool, string, error) {
		s, err := f.read(ctx, name)
		last = s
		done := err == nil && s.ready == "True" && s.lastApplied == revision && s.observedGeneration == s.generation
		return done, s.String() + f.migrations(ctx), err
	})
	t.Logf("Kustomization %s: %s", name, last)
}

// awaitFailed waits until Kustomization name has attempted revision and
// is not Ready, saying want.
func (f *flux) awaitFailed(t *testing.T, name, revision, want string, stall time.Duration) {
	t.Helper()
	var last status
	testenv.WaitProgress(t, "Kustomization "+name+" failed at "+revision, stall, func(ctx context.Context) (bool, string, error) {
		s, err := f.read(ctx, name)
		last = s
		return err == nil && s.ready == "False" && s.lastAttempted == revision && strings.Contains(s.message, want), s.String(), err
	})
	t.Logf("Kustomization %s: %s", name, last)
}

// migrations sums up restow's StorageMigrations, where restow is installed,
// for a wait's progress: a Kustomization waiting on a migration keeps its
// status through the pass and the settle window, the migration does not.
func (f *flux) migrations(ctx context.Context) string {
	list := &unstructured.UnstructuredList{}
	list.SetAPIVersion("migration.restow.dev/v1alpha1")
	list.SetKind("StorageMigrationList")
	if err := f.cp.Client.List(ctx, list); err != nil {
		return ""
	}
	out := make([]string, 0, len(list.Items))
	for _, m := range list.Items {
		summary, _, _ := unstructured.NestedString(m.Object, "status", "progressSummary")
		out = append(out, m.GetName()+": "+summary)
	}
	return "; StorageMigrations: " + strings.Join(out, ", ")
}
