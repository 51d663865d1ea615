//go:build long

package cli_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/restow/restow/internal/cli"
	"github.com/restow/restow/internal/testenv"
)

// TestPrepareReleases holds preflight and prepare (in this process, as
// where no restow operator runs) to the cases of a CRD upgrade, each CRD
// with 2,000 objects and etcd read before and after:
//
//	(a) a release that drops a stored version and keeps the live storage
//	    version: the apply is refused, preflight says needs prepare (exit 2),
//	    prepare migrates and prunes, the apply is accepted, and every object
//	    reads with every field;
//	(b) a release that changes nothing stored: ok, exit 0, and nothing sent
//	    but reads and dry runs, by preflight and prepare alike;
//	(c) a skipped release, which drops the live storage version: blocked
//	    (exit 8), and prepare changes nothing, CRD and etcd as before;
//	(d) a conversion webhook that refuses one object during prepare:
//	    nothing pruned, the object named, the apply still refused;
//	(f) a release that keeps a version status.storedVersions lists besides
//	    the storage version: ok, with a warning that a later release
//	    dropping it is refused; prepare --ahead migrates and prunes;
//	(g) two CRDs whose windows outlast --timeout: exit 3 naming both
//	    unfinished, nothing pruned; run again, both prepared, their windows
//	    side by side.
func TestPrepareReleases(t *testing.T) {
	dir := t.TempDir()

	t.Run("a: drops a stored version, keeps the live storage version", func(t *testing.T) {
		fx := testenv.Fixture{Env: env, Group: "a.releases.restow.dev", Kind: "Widget", Plural: "widgets", Namespaced: true}
		fx.Install(t, "v1alpha1", "v1")
		keys := fx.CreateObjects(t, "v1alpha1", releaseObjects, rich, "releases-a", "releases-a2")
		fx.SwitchStorage(t, "v1")
		release := filepath.Join(dir, "a.yaml")
		writeRelease(t, release, fx.CRDName(), "v1")

		applyRelease(t, fx.CRDName(), "v1", "status.storedVersions[0]: Invalid value: \"v1alpha1\": missing from spec.versions")
		// With etcd's flags, preflight says what etcd holds.
		out, _, code := restow(t, "preflight", "-f", release, "--etcd-endpoints", env.EtcdURL())
		if code != cli.ExitPending || !strings.Contains(out, fx.CRDName()+": needs prepare: the manifest drops v1alpha1") {
			t.Fatalf("preflight exited %d, want %d and needs prepare", code, cli.ExitPending)
		}
		if want := fmt.Sprintf("  etcd holds %d objects at v1alpha1 (etcd revision ", releaseObjects); !strings.Contains(out, want) {
			t.Errorf("preflight with --etcd-endpoints does not say %q", want)
		}
		// A read of etcd that proves nothing is no answer: exit 7.
		if _, stderr, code := restow(t, "preflight", "-f", release, "--etcd-endpoints", env.EtcdURL(), "--etcd-prefix", "/kubernetes.io"); code != cli.ExitUnaccounted || !strings.Contains(stderr, "holds no key under /kubernetes.io/") {
			t.Errorf("preflight with a prefix that holds nothing exited %d, want %d", code, cli.ExitUnaccounted)
		}
		out, _, code = restow(t, "prepare", "-f", release, "--in-process", "--settle-window", "2s")
		if code != 0 || !strings.Contains(out, fx.CRDName()+": prepared: status.storedVersions lists v1 alone; the apply passes (server-side dry run: accepted)") {
			t.Fatalf("prepare exited %d, want 0 and prepared", code)
		}
		fx.AssertAllStoredAt(t, "v1", releaseObjects)
		fx.AssertStoredVersions(t, "v1")
		applyAccepted(t, fx.CRDName(), "v1")
		assertReadsAt(t, fx, keys, rich, "v1")
	})

	t.Run("b: changes nothing stored", func(t *testing.T) {
		fx := testenv.Fixture{Env: env, Group: "b.releases.restow.dev", Kind: "Widget", Plural: "widgets", Namespaced: true}
		fx.Install(t, "v1beta1")
		fx.CreateObjects(t, "v1beta1", releaseObjects, rich, "releases-b")
		release := filepath.Join(dir, "b.yaml")
		// The next release adds v1 and keeps storing at v1beta1.
		writeRelease(t, release, fx.CRDName(), "v1", "v1beta1")
		before := crdVersion(t, fx.CRDName())

		writes := recordWrites(t)
		out, _, code := restow(t, "preflight", "-f", release)
		if code != 0 || !strings.Contains(out, fx.CRDName()+": ok: the manifest keeps every version status.storedVersions lists (v1beta1)") || !strings.Contains(out, "server-side dry run: accepted") {
			t.Errorf("preflight exited %d, want 0, ok and an accepted dry run", code)
		}
		out, _, code = restow(t, "prepare", "-f", release, "--in-process")
		if code != 0 || !strings.Contains(out, fx.CRDName()+": ok, nothing to prepare") {
			t.Errorf("prepare exited %d, want 0 and nothing to prepare", code)
		}
		if w := writes(); len(w) > 0 {
			t.Errorf("preflight and prepare sent %v: want reads and dry runs only", w)
		}
		if after := crdVersion(t, fx.CRDName()); after != before {
			t.Errorf("the CRD's resourceVersion moved from %s to %s", before, after)
		}
		fx.AssertAllStoredAt(t, "v1beta1", releaseObjects)
	})

	t.Run("f: ahead of a later release", func(t *testing.T) {
		// The release keeps v1beta1 and v1, so its apply passes; but the
		// objects were never migrated after the storage switch, so the
		// release that drops v1beta1 would be refused.
		const objects = 20
		fx := testenv.Fixture{Env: env, Group: "f.releases.restow.dev", Kind: "Widget", Plural: "widgets", Namespaced: true}
		fx.Install(t, "v1beta1", "v1")
		fx.CreateObjects(t, "v1beta1", objects, rich, "releases-f")
		fx.SwitchStorage(t, "v1")
		release := filepath.Join(dir, "f.yaml")
		writeRelease(t, release, fx.CRDName(), "v1beta1", "v1")
		foresight := "after the apply status.storedVersions still lists v1beta1 besides the storage version v1: a later release that drops v1beta1 is refused"
		out, _, code := restow(t, "preflight", "-f", release)
		if code != 0 || !strings.Contains(out, fx.CRDName()+": ok") || !strings.Contains(out, "warning: "+foresight) {
			t.Errorf("preflight exited %d, want 0, ok and the warning:\n%s", code, out)
		}
		_, errOut, code := restow(t, "prepare", "-f", release, "--in-process")
		if code != 0 || !strings.Contains(errOut, "Warning: "+fx.CRDName()+": "+foresight) {
			t.Errorf("prepare exited %d, want 0 and the warning:\n%s", code, errOut)
		}
		fx.AssertAllStoredAt(t, "v1beta1", objects)
		out, _, code = restow(t, "prepare", "-f", release, "--in-process", "--ahead", "--settle-window", "2s")
		if code != 0 || !strings.Contains(out, fx.CRDName()+": prepared: status.storedVersions lists v1 alone") {
			t.Errorf("prepare --ahead exited %d, want 0 and prepared:\n%s", code, out)
		}
		fx.AssertAllStoredAt(t, "v1", objects)
		fx.AssertStoredVersions(t, "v1")
	})

	t.Run("g: two CRDs side by side, cut short by --timeout, then run again", func(t *testing.T) {
		const objects = 20
		releases := filepath.Join(dir, "g")
		if err := os.Mkdir(releases, 0o755); err != nil {
			t.Fatal(err)
		}
		fxs := make([]testenv.Fixture, 0, 2)
		for _, name := range []string{"g1", "g2"} {
			fx := testenv.Fixture{Env: env, Group: name + ".releases.restow.dev", Kind: "Widget", Plural: "widgets", Namespaced: true}
			fx.Install(t, "v1beta1", "v1")
			fx.CreateObjects(t, "v1beta1", objects, rich, "releases-"+name)
			fx.SwitchStorage(t, "v1")
			writeRelease(t, filepath.Join(releases, name+".yaml"), fx.CRDName(), "v1")
			fxs = append(fxs, fx)
		}
		// Each settle window outlasts the timeout: neither CRD can finish.
		out, _, code := restow(t, "prepare", "-f", releases, "--in-process", "--settle-window", "1m", "--timeout", "10s")
		if code != cli.ExitTimeout || !strings.Contains(out, "prepared, or nothing to do: none; blocked, left as they are: none; not finished: "+fxs[0].CRDName()+", "+fxs[1].CRDName()) {
			t.Errorf("prepare exited %d, want %d naming both CRDs not finished:\n%s", code, cli.ExitTimeout, out)
		}
		for _, fx := range fxs {
			fx.AssertStoredVersions(t, "v1beta1", "v1")
		}
		// Run again: both finish. Their windows run side by side, so both
		// start migrating before either is prepared.
		out, _, code = restow(t, "prepare", "-f", releases, "--in-process", "--settle-window", "5s")
		if code != 0 {
			t.Fatalf("prepare run again exited %d, want 0:\n%s", code, out)
		}
		firstPrepared := len(out)
		for _, fx := range fxs {
			started, prepared := strings.Index(out, fx.CRDName()+": migrating in this process"), strings.Index(out, fx.CRDName()+": prepared")
			if started < 0 || prepared < 0 {
				t.Fatalf("%s not migrated and prepared:\n%s", fx.CRDName(), out)
			}
			firstPrepared = min(firstPrepared, prepared)
		}
		for _, fx := range fxs {
			if started := strings.Index(out, fx.CRDName()+": migrating in this process"); started > firstPrepared {
				t.Errorf("%s started migrating after another CRD was prepared: the windows ran one after another:\n%s", fx.CRDName(), out)
			}
			fx.AssertAllStoredAt(t, "v1", objects)
			fx.AssertStoredVersions(t, "v1")
		}
	})

	t.Run("c: a skipped release", func(t *testing.T) {
		fx := testenv.Fixture{Env: env, Group: "c.releases.restow.dev", Kind: "Widget", Plural: "widgets", Namespaced: true}
		fx.Install(t, "v1alpha1", "v1beta1")
		fx.CreateObjects(t, "v1alpha1", releaseObjects, rich, "releases-c")
		release := filepath.Join(dir, "c.yaml")
		// Release N+2 keeps v1 alone; N (storage v1beta1) was never applied.
		writeRelease(t, release, fx.CRDName(), "v1")
		before := crdVersion(t, fx.CRDName())

		out, _, code := restow(t, "preflight", "-f", release)
		if code != cli.ExitBlocked || !strings.Contains(out, fx.CRDName()+": blocked: the manifest drops v1alpha1, the live storage version") {
			t.Errorf("preflight exited %d, want %d and blocked", code, cli.ExitBlocked)
		}
		assertLeftAsItIs(t, fx, release, before, "v1alpha1")
	})

	t.Run("d: a conversion webhook refuses one object during prepare", func(t *testing.T) {
		hook := testenv.StartConversionWebhook(t, func(*unstructured.Unstructured, string) error { return nil })
		fx := testenv.Fixture{Env: env, Group: "d.releases.restow.dev", Kind: "Widget", Plural: "widgets", Namespaced: true, Conversion: hook.Conversion()}
		fx.Install(t, "v1alpha1", "v1")
		fx.CreateObjects(t, "v1alpha1", releaseObjects, rich, "releases-d")
		fx.SwitchStorage(t, "v1")
		const refused = "obj-01234"
		hook.Refuse(true, refused)
		release := filepath.Join(dir, "d.yaml")
		writeRelease(t, release, fx.CRDName(), "v1")

		out, _, code := restow(t, "prepare", "-f", release, "--in-process", "--settle-window", "2s")
		if code != cli.ExitPending || !strings.Contains(out, fx.CRDName()+": not prepared") || !strings.Contains(out, refused) {
			t.Errorf("prepare exited %d, want %d, not prepared, and %s named", code, cli.ExitPending, refused)
		}
		fx.AssertStored(t, map[string]int{"v1": releaseObjects - 1, "v1alpha1": 1})
		fx.AssertStoredVersions(t, "v1alpha1", "v1")
		out, _, _ = restow(t, "preflight", "-f", release, "--etcd-endpoints", env.EtcdURL())
		if want := fmt.Sprintf("  etcd holds %d objects at v1, 1 at v1alpha1 (etcd revision ", releaseObjects-1); !strings.Contains(out, want) {
			t.Errorf("preflight after the failed prepare does not say %q", want)
		}
		applyRelease(t, fx.CRDName(), "v1", "status.storedVersions[0]: Invalid value: \"v1alpha1\": missing from spec.versions")
	})
}
