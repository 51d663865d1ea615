//go:build e2e && gitops

// Package gitops runs a real GitOps controller beside restow: Flux's
// kustomize-controller, built from its Go module by make test-gitops (its
// build takes minutes, so the suite is a target of its own, not part of
// make test), against the test control plane, reading a GitRepository
// whose artifacts the test serves on a loopback address in the place of
// source-controller. Run with `make test-gitops`.
package gitops

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/restow/restow/e2e/scenario"
	"github.com/restow/restow/internal/operator"
	"github.com/restow/restow/internal/testenv"
)

// settleWindow is restow's default settle window, which the operator at
// its defaults and prepare wait out after a storage switch; the waits
// below allow it and a minute more without a change of status.
const settleWindow = 2 * time.Minute

// retryInterval is the Kustomizations' spec.retryInterval: how soon Flux
// applies a release again after the API server refused it.
const retryInterval = "30s"

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	os.Exit(m.Run())
}

// start runs a control plane with restow's CRDs (when restow is
// installed), source-controller's and kustomize-controller's, and
// kustomize-controller; with restow, the operator at its defaults too.
func start(t *testing.T, restow bool) (*testenv.Env, *flux) {
	t.Helper()
	dirs := []string{sourceCRDs, kustomizeCRDs(t)}
	if restow {
		dirs = append(dirs, scenario.CRDDirectory)
	}
	cp := testenv.Start(t, testenv.Options{CRDDirectoryPaths: dirs})
	if restow {
		kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
		if err := cp.WriteKubeconfig(kubeconfig); err != nil {
			t.Fatal(err)
		}
		operator.StartProcess(t, operator.ProcessOptions{Kubeconfig: kubeconfig})
	}
	return cp, startFlux(t, cp)
}

// releaseFiles are release tag's CRDs of chain c, as a repository holds
// them under dir.
func releaseFiles(t *testing.T, c scenario.ReleaseChain, tag, dir string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	entries, err := os.ReadDir(c.CRDDir(tag))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join(c.CRDDir(tag), e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		files[dir+"/"+e.Name()] = raw
	}
	return files
}

// TestFluxAppliesARelease: a Kustomization applies Gateway API's
// releases from git one after another, as a cluster that keeps Gateway
// API's CRDs in git does. v1.0.0, which drops v1alpha2, is refused by the
// API server where restow is not installed, and the Kustomization stays
// failed with the API server's words; where restow's operator runs with
// its defaults, it migrates after v0.6.2 by itself, and the Kustomization
// is Ready at v1.0.0 once the migration is done.
func TestFluxAppliesARelease(t *testing.T) {
	c := scenario.GatewayAPI
	c.Copies = 10
	for _, restow := range []bool{false, true} {
		t.Run(fmt.Sprintf("restow installed: %t", restow), func(t *testing.T) {
			t.Parallel()
			cp, f := start(t, restow)
			rev := f.publish(t, c.First, releaseFiles(t, c, c.First, "gateway-api"))
			f.kustomization(t, "gateway-api", map[string]any{
				"interval": "10m", "retryInterval": retryInterval, "path": "./gateway-api", "prune": true,
			})
			f.awaitReady(t, "gateway-api", rev, time.Minute)
			objects := c.WriteSamples(t, cp)
			rev = f.publish(t, c.Second, releaseFiles(t, c, c.Second, "gateway-api"))
			f.awaitReady(t, "gateway-api", rev, time.Minute)
			third := f.publish(t, c.Third, releaseFiles(t, c, c.Third, "gateway-api"))
			if !restow {
				f.awaitFailed(t, "gateway-api", third, "missing from spec.versions", time.Minute)
				s, err := f.read(t.Context(), "gateway-api")
				if err != nil || s.lastApplied != rev {
					t.Errorf("the Kustomization's last applied revision is %q (%v), want %s", s.lastApplied, err, rev)
				}
				return
			}
			// Flux applies the release at once: refused while the operator's
			// migration is under way, then applied by a retry once it is done.
			f.awaitFailed(t, "gateway-api", third, "missing from spec.versions", time.Minute)
			f.awaitReady(t, "gateway-api", third, settleWindow+time.Minute)
			c.AssertStored(t, cp, objects)
		})
	}
}
