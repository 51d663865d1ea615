//go:build e2e && long

// Package releases upgrades real projects' CRDs across their own
// releases, as their users do: Flux's source-controller, whose CRDs
// (conversion None) moved their storage version to v1 and then dropped
// v1beta1 and v1beta2, and Kubernetes' Gateway API, whose CRDs moved from
// v1alpha2 to v1beta1 and then dropped v1alpha2 (testdata/, taken from the
// projects' repositories at each release tag, with the projects' own
// example objects; testdata/README.md says where from). Run with `make
// test-e2e`.
package releases

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/restow/restow/e2e/scenario"
	"github.com/restow/restow/internal/cli"
	"github.com/restow/restow/internal/operator"
	"github.com/restow/restow/internal/testenv"
)

// hookArgs are the prepare hook's settings as shipped
// (config/samples/crd-author/job-prepare.yaml).
var hookArgs = []string{"--settle-window=2m", "--timeout=4m"}

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	os.Exit(m.Run())
}

// TestFluxSourceControllerReleases upgrades Flux's source-controller from
// v1.3.0 to v1.6.0 to v1.9.1 (see upgrades). A rollback from v1.6.0 to
// v1.3.0 drops v1, the live storage version: its bridge, v1beta2, is
// judged against v1.3.0's own schema of it, which lacks fields the live
// schemas allow, and prepare blocks it.
func TestFluxSourceControllerReleases(t *testing.T) {
	t.Parallel()
	c := scenario.FluxSourceController
	upgrades(t, c)
	t.Run("a rollback from v1.6.0 to v1.3.0", func(t *testing.T) {
		t.Parallel()
		cp := testenv.Start(t, testenv.Options{})
		objects := c.Installed(t, cp)
		c.Upgrade(t, cp, false)
		if out, code, _ := restow(t, cp, append([]string{"prepare", "-f", c.CRDDir(c.Third)}, hookArgs...)...); code != 0 {
			t.Fatalf("prepare for %s exited %d:\n%s", c.Third, code, out)
		}
		err := c.ApplyRelease(t, cp, c.First, true)
		if err == nil || !strings.Contains(err.Error(), "missing from spec.versions") {
			t.Fatalf("the rollback to %s applied: %v, want the API server's refusal", c.First, err)
		}
		t.Logf("the rollback without restow: %v", err)
		rollback(t, cp, c, objects)
	})
}

// TestGatewayAPIReleases upgrades Kubernetes' Gateway API (standard
// channel) from v0.5.1 to v0.6.2 to v1.0.0 (see upgrades): v1.0.0 no
// longer serves v1alpha2, at which v0.5.1 stored every GatewayClass,
// Gateway and HTTPRoute.
func TestGatewayAPIReleases(t *testing.T) {
	t.Parallel()
	upgrades(t, scenario.GatewayAPI)
}

// upgrades applies c's releases one after another, as the project's users
// do. The third is refused while status.storedVersions lists a version it
// drops; kubectl restow prepare, with the hook's settings, prepares it,
// and every Object reads as before. With restow's operator at its defaults
// from the first release on, the third needs no preparing. Each case has a
// control plane of its own and mostly waits out a settle window: they run
// side by side.
func upgrades(t *testing.T, c scenario.ReleaseChain) {
	t.Run(fmt.Sprintf("%s to %s to %s without restow", c.First, c.Second, c.Third), func(t *testing.T) {
		t.Parallel()
		cp := testenv.Start(t, testenv.Options{})
		c.Installed(t, cp)
		c.Upgrade(t, cp, true)
		err := c.ApplyRelease(t, cp, c.Third, true)
		if err == nil || !strings.Contains(err.Error(), "missing from spec.versions") {
			t.Fatalf("%s applied: %v, want the API server's refusal", c.Third, err)
		}
		t.Logf("%s without restow: %v", c.Third, err)
	})
	t.Run(fmt.Sprintf("%s to %s to %s with prepare", c.First, c.Second, c.Third), func(t *testing.T) {
		t.Parallel()
		cp := testenv.Start(t, testenv.Options{})
		objects := c.Installed(t, cp)
		c.Upgrade(t, cp, false)
		before := c.ReadAll(t, cp, objects)
		out, code, took := restow(t, cp, append([]string{"prepare", "-f", c.CRDDir(c.Third)}, hookArgs...)...)
		if code != 0 || took >= 4*time.Minute {
			t.Fatalf("prepare exited %d after %s, want 0 within the hook's --timeout", code, took)
		}
		for _, name := range c.Prepared {
			if want := name + ": prepared"; !strings.Contains(out, want) {
				t.Errorf("prepare's output lacks %q", want)
			}
		}
		if err := c.ApplyRelease(t, cp, c.Third, true); err != nil {
			t.Fatalf("%s after prepare, server-side: %v", c.Third, err)
		}
		if err := c.ApplyRelease(t, cp, c.Third, false); err != nil {
			t.Fatalf("%s after prepare, client-side: %v", c.Third, err)
		}
		c.AssertStored(t, cp, objects)
		c.AssertReadsAsBefore(t, cp, objects, before)
	})
	t.Run(fmt.Sprintf("restow's operator at its defaults from %s on", c.First), func(t *testing.T) {
		t.Parallel()
		cp := testenv.Start(t, testenv.Options{CRDDirectoryPaths: []string{scenario.CRDDirectory}})
		kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
		if err := cp.WriteKubeconfig(kubeconfig); err != nil {
			t.Fatal(err)
		}
		operator.StartProcess(t, operator.ProcessOptions{Kubeconfig: kubeconfig})
		objects := c.Installed(t, cp)
		c.Upgrade(t, cp, true)
		c.AwaitMigrated(t, cp)
		out, code, _ := restow(t, cp, "preflight", "-f", c.CRDDir(c.Third))
		if code != 0 || strings.Contains(out, "needs prepare") {
			t.Errorf("preflight of %s exited %d, want 0: the operator migrated every CRD by itself\n%s", c.Third, code, out)
		}
		if err := c.ApplyRelease(t, cp, c.Third, true); err != nil {
			t.Fatalf("%s with the operator: %v", c.Third, err)
		}
		c.AssertStored(t, cp, objects)
	})
}

// rollback prepares the rollback to v1.3.0. Its bridge for Buckets and
// OCIRepositories would be v1beta2, and v1.3.0's own schema of v1beta2
// lacks fields that v1.6.0's schemas allow (spec.proxySecretRef among
// them): no sample sets one, so only the comparison of the schemas sees
// that an Object written with one would lose it. prepare blocks both,
// naming the field, and changes nothing; the rollback stays refused.
func rollback(t *testing.T, cp *testenv.Env, c scenario.ReleaseChain, objects []scenario.Object) {
	revisions := c.CRDRevisions(t, cp)
	out, code, took := restow(t, cp, append([]string{"prepare", "-f", c.CRDDir(c.First)}, hookArgs...)...)
	t.Logf("prepare for the rollback: exit %d after %s", code, took.Round(time.Millisecond))
	if code != cli.ExitBlocked {
		t.Fatalf("prepare for the rollback exited %d, want %d", code, cli.ExitBlocked)
	}
	for _, want := range []string{
		"ocirepositories.source.toolkit.fluxcd.io: blocked, left as it is",
		"buckets.source.toolkit.fluxcd.io: blocked, left as it is",
		"spec.proxySecretRef",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("prepare's output lacks %q", want)
		}
	}
	for name, rv := range c.CRDRevisions(t, cp) {
		if rv != revisions[name] {
			t.Errorf("prepare wrote %s: resourceVersion %s, then %s", name, revisions[name], rv)
		}
	}
	if err := c.ApplyRelease(t, cp, c.First, true); err == nil {
		t.Errorf("the rollback applied though prepare blocked it")
	}
	c.AssertStored(t, cp, objects)
}

// restow runs kubectl-restow with args against cp.
func restow(t *testing.T, cp *testenv.Env, args ...string) (string, int, time.Duration) {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	args = append(args, "--kubeconfig="+kubeconfig, "--cache-dir="+filepath.Join(t.TempDir(), "cache"))
	var out bytes.Buffer
	began := time.Now()
	code := cli.Execute(t.Context(), args, genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &out})
	took := time.Since(began)
	t.Logf("kubectl restow %s: exit %d after %s\n%s", strings.Join(args, " "), code, took.Round(time.Millisecond), out.String())
	return out.String(), code, took
}
