//go:build e2e

// Package upgrade runs restow's manager across an upgrade of the control
// plane that moves a built-in resource's storage version. Run with
// `make test-e2e`.
//
// kube-apiserver 1.37 stores MutatingAdmissionPolicies at
// admissionregistration.k8s.io/v1; emulating 1.36 (--emulated-version), as
// the 1.36 release itself does, it stores them at v1beta1 (the storage
// version is the newest one the previous release could read). Restarting
// it without the flag is the upgrade: the objects written before stay at
// v1beta1 in etcd until something rewrites them.
package upgrade

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/e2e/scenario"
	"github.com/restow/restow/internal/testenv"
)

const (
	policies = "mutatingadmissionpolicies"
	group    = "admissionregistration.k8s.io"
	// name is the StorageMigration restow creates for the resource.
	name = policies + "." + group
	// n policies are written before the upgrade.
	n = 200
	// before and after are what etcd holds them at.
	before = group + "/v1beta1"
	after  = group + "/v1"
)

// TestMain gives controller-runtime's clients, which kubectl restow verify
// makes, a logger.
func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	os.Exit(m.Run())
}

// TestUpgradeReStoresABuiltInResource: policies written by a control plane
// that stores them at v1beta1; restow, started then, records v1beta1 as the
// baseline and rewrites nothing; after the upgrade it re-stores every one
// at v1 by itself, read from etcd and shown by kubectl restow verify.
func TestUpgradeReStoresABuiltInResource(t *testing.T) {
	cp := testenv.Start(t, testenv.Options{CRDDirectoryPaths: []string{scenario.CRDDirectory},
		APIServerArgs: map[string]string{"emulated-version": "1.36"}})
	createPolicies(t, cp)
	assertStored(t, cp, map[string]int{before: n})
	startManager(t, cp)
	waitBaseline(t, cp, "v1beta1", stamped)
	verify(t, cp, "v1beta1")
	assertStored(t, cp, map[string]int{before: n})

	upgrade := time.Now()
	if err := cp.RestartAPIServerWithout(t.Context(), "emulated-version"); err != nil {
		t.Fatal(err)
	}
	t.Logf("The API server was upgraded (stopped, restarted, ready) in %s", time.Since(upgrade).Round(100*time.Millisecond))
	waitReStored(t, cp)
	t.Logf("Re-stored %d policies %s after the upgrade began", n, time.Since(upgrade).Round(100*time.Millisecond))
	assertStored(t, cp, map[string]int{after: n})
	verify(t, cp, "v1")
}

// TestRollingUpgradeWaitsForTheLastServer: two API servers on addresses of
// their own, upgraded one after the other. While they disagree restow
// rewrites nothing, and etcd keeps every policy at v1beta1; once the second
// is upgraded it re-stores every one at v1.
func TestRollingUpgradeWaitsForTheLastServer(t *testing.T) {
	cp := testenv.Start(t, testenv.Options{CRDDirectoryPaths: []string{scenario.CRDDirectory}, APIServers: 2, OwnAddresses: true,
		APIServerArgs: map[string]string{"emulated-version": "1.36"}})
	cp.WaitForSignals(t, 2, 2)
	createPolicies(t, cp)
	startManager(t, cp)
	// A first sweep that missed one server stamps nothing, and its baseline
	// is then unproven, or replaced at once by a pass (fail closed).
	sm := waitBaseline(t, cp, "v1beta1", stampedOrUnproven)
	lastPass := sm.Status.LastPass

	if err := cp.RestartOwnAPIServer(t.Context(), 0, "emulated-version"); err != nil {
		t.Fatal(err)
	}
	// While the servers disagree: nothing rewritten, no pass, and the
	// StorageMigration says which server stores at which version.
	old := strings.TrimPrefix(cp.ServerConfig(1).Host, "https://")
	said := map[string]bool{}
	hold := time.Now().Add(20 * time.Second)
	for time.Now().Before(hold) {
		assertStored(t, cp, map[string]int{before: n})
		if err := cp.Client.Get(t.Context(), client.ObjectKey{Name: name}, sm); err != nil {
			t.Fatal(err)
		}
		if !equality.Semantic.DeepEqual(sm.Status.LastPass, lastPass) || sm.Status.Progress != nil {
			t.Fatalf("a pass ran while one API server stored at v1beta1: %+v %+v", sm.Status.LastPass, sm.Status.Progress)
		}
		if c := findCondition(sm, migrationv1alpha1.ReconcilingCondition); c != nil && c.Status == metav1.ConditionTrue && !said[c.Message] {
			said[c.Message] = true
			t.Logf("While one server is upgraded: %s: %s", c.Reason, c.Message)
			if strings.Contains(c.Message, "different versions") && !strings.Contains(c.Message, old+" stores at v1beta1") {
				t.Errorf("the message does not say that %s stores at v1beta1: %s", old, c.Message)
			}
		}
		time.Sleep(time.Second)
	}
	if !slices.ContainsFunc(slices.Collect(maps.Keys(said)), func(m string) bool { return strings.Contains(m, old+" stores at v1beta1") }) {
		t.Errorf("in 20 s of disagreement restow never said that %s stores at v1beta1; it said %q", old, slices.Collect(maps.Keys(said)))
	}

	if err := cp.RestartOwnAPIServer(t.Context(), 1, "emulated-version"); err != nil {
		t.Fatal(err)
	}
	waitReStored(t, cp)
	assertStored(t, cp, map[string]int{after: n})
	verify(t, cp, "v1")
}

// TestUpgradeBehindOneAddressWaits: two API servers, of which restow finds
// the address of one only: the other is reached through the balancer
// alone, as several servers behind one address of a managed control plane
// are. After both are upgraded restow rewrites nothing and records no new
// hash: it says it waits for every API server (a reason that is no alert's)
// and names the manual path. kubectl restow migrate then re-stores every
// policy.
func TestUpgradeBehindOneAddressWaits(t *testing.T) {
	cp := testenv.Start(t, testenv.Options{CRDDirectoryPaths: []string{scenario.CRDDirectory}, APIServers: 2, OwnAddresses: true, UnpublishedAPIServer: true,
		APIServerArgs: map[string]string{"emulated-version": "1.36"}})
	cp.WaitForSignals(t, 2, 1)
	createPolicies(t, cp)
	startManager(t, cp)
	waitBaseline(t, cp, "v1beta1", unstamped)

	for i := range 2 {
		if err := cp.RestartOwnAPIServer(t.Context(), i, "emulated-version"); err != nil {
			t.Fatal(err)
		}
	}
	sm := cp.WaitForMigration(t, name, time.Minute, "waiting for every API server", func(sm *migrationv1alpha1.StorageMigration) bool {
		c := findCondition(sm, migrationv1alpha1.ReconcilingCondition)
		return c != nil && c.Reason == migrationv1alpha1.WaitingForAllAPIServersReason
	})
	c := findCondition(sm, migrationv1alpha1.ReconcilingCondition)
	t.Logf("After the upgrade: %s: %s", c.Reason, c.Message)
	if !strings.Contains(c.Message, "run kubectl restow migrate "+name) || !strings.Contains(c.Message, "1 of them at an address") {
		t.Errorf("the waiting message does not name the manual path and why: %s", c.Message)
	}
	// It stays so: no pass, no hash recorded, every policy at v1beta1.
	hold := time.Now().Add(15 * time.Second)
	for time.Now().Before(hold) {
		if err := cp.Client.Get(t.Context(), client.ObjectKey{Name: name}, sm); err != nil {
			t.Fatal(err)
		}
		if sm.Status.LastPass != nil || sm.Status.Progress != nil || sm.Status.Baseline == nil || sm.Status.Baseline.StorageVersion != "v1beta1" {
			t.Fatalf("restow acted while it could not read every server: lastPass %+v, progress %+v, baseline %+v", sm.Status.LastPass, sm.Status.Progress, sm.Status.Baseline)
		}
		assertStored(t, cp, map[string]int{before: n})
		time.Sleep(time.Second)
	}

	// The manual path, once the upgrade is done.
	if _, _, code := scenario.Restow(t, cp, "migrate", name, "--wait", "--timeout", "5m"); code != 0 {
		t.Fatalf("kubectl restow migrate %s --wait exited %d", name, code)
	}
	waitReStored(t, cp)
	assertStored(t, cp, map[string]int{after: n})
	verify(t, cp, "v1")
}

// TestUnprovenBaselineReplaced: two API servers, both upgraded before
// restow starts, of which restow finds the address of one only (the other
// is reached through the balancer alone). Every policy is still stored at
// v1beta1 while every server restow reads stores at v1: the baseline it
// records is v1, unproven (Ready, BaselineUnproven), and nothing is
// rewritten. Once the second server's address is published, restow reads
// every server, and a pass replaces the baseline: every policy at v1 in
// etcd. Taken as proven, the v1 baseline would leave them at v1beta1.
func TestUnprovenBaselineReplaced(t *testing.T) {
	cp := testenv.Start(t, testenv.Options{CRDDirectoryPaths: []string{scenario.CRDDirectory}, APIServers: 2, OwnAddresses: true, UnpublishedAPIServer: true,
		APIServerArgs: map[string]string{"emulated-version": "1.36"}})
	cp.WaitForSignals(t, 2, 1)
	createPolicies(t, cp)
	for i := range 2 {
		if err := cp.RestartOwnAPIServer(t.Context(), i, "emulated-version"); err != nil {
			t.Fatal(err)
		}
	}
	// The trigger's default period (10 minutes): what wakes restow is the
	// second server's address coming to the kubernetes Service.
	startManager(t, cp, "--builtin-discovery-interval=10m")
	waitBaseline(t, cp, "v1", unstamped)
	assertStored(t, cp, map[string]int{before: n})

	// The second server's address in the kubernetes Service, as when a
	// person names every server or the provider publishes them.
	if err := cp.RestartOwnAPIServer(t.Context(), 1, "endpoint-reconciler-type"); err != nil {
		t.Fatal(err)
	}
	published := time.Now()
	cp.WaitForSignals(t, 2, 2)
	waitReStored(t, cp)
	t.Logf("Re-stored %d policies %s after the second server was published", n, time.Since(published).Round(100*time.Millisecond))
	assertStored(t, cp, map[string]int{after: n})
	verify(t, cp, "v1")
}

// createPolicies writes n MutatingAdmissionPolicies that mutate nothing
// anyone creates.
func createPolicies(t *testing.T, cp *testenv.Env) {
	t.Helper()
	err := cp.CreateObjects(t.Context(), n, func(i int) client.Object {
		return &admissionregistrationv1.MutatingAdmissionPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("policy-%04d", i)},
			Spec: admissionregistrationv1.MutatingAdmissionPolicySpec{
				MatchConstraints: &admissionregistrationv1.MatchResources{
					ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
						Rule:       admissionregistrationv1.Rule{APIGroups: []string{"upgrade.e2e.restow.dev"}, APIVersions: []string{"v1"}, Resources: []string{"nothings"}},
					}}},
				},
				Mutations: []admissionregistrationv1.Mutation{{
					PatchType:          admissionregistrationv1.PatchTypeApplyConfiguration,
					ApplyConfiguration: &admissionregistrationv1.ApplyConfiguration{Expression: `Object{metadata: Object.metadata{labels: {"policy": "` + fmt.Sprint(i) + `"}}}`},
				}},
				ReinvocationPolicy: admissionregistrationv1.NeverReinvocationPolicy,
			},
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

// startManager runs the manager binary with automatic migration of
// built-in resources, leaving every other built-in resource but the
// policies alone: the test watches one StorageMigration, not fifty.
func startManager(t *testing.T, cp *testenv.Env, args ...string) {
	t.Helper()
	scenario.StartBuiltInManager(t, cp, append([]string{"--auto-migrate-builtins=true",
		"--auto-migrate-builtins-exclude=" + strings.Join(cp.BuiltInsExcept(t, name), ",")}, args...)...)
}

// firstSight is what the trigger stamps on the StorageMigration it
// creates: the hash it first saw when it read every API server, nothing
// when it could not.
type firstSight int

const (
	stamped firstSight = iota
	unstamped
	stampedOrUnproven
)

func (f firstSight) String() string {
	return [...]string{"the baseline's hash stamped, proven", "no stamp, the baseline unproven", "the baseline's hash stamped and proven, or no stamp and the baseline unproven or replaced by a pass"}[f]
}

// waitBaseline waits until the StorageMigration restow made for the
// policies records version as its baseline, with nothing rewritten, and
// holds its stamp of the first sight, and the baseline's proof, to want:
// a stamp is every API server's word, so a baseline without one is
// unproven, or (stampedOrUnproven, where restow reads every server) already
// replaced by a pass at version.
func waitBaseline(t *testing.T, cp *testenv.Env, version string, want firstSight) *migrationv1alpha1.StorageMigration {
	t.Helper()
	replaced := func(sm *migrationv1alpha1.StorageMigration) bool {
		return want == stampedOrUnproven && sm.Status.Baseline == nil && sm.Status.LastPass != nil && sm.Status.LastPass.TargetVersion == version
	}
	sm := cp.WaitForMigration(t, name, time.Minute, "at its baseline "+version, func(sm *migrationv1alpha1.StorageMigration) bool {
		return isReady(sm) && ((sm.Status.Baseline != nil && sm.Status.Baseline.StorageVersion == version) || replaced(sm))
	})
	if sm.Spec.FirstPass != migrationv1alpha1.FirstPassSkip || sm.Labels[migrationv1alpha1.BuiltInLabel] != "true" || (sm.Status.LastPass != nil && !replaced(sm)) {
		t.Fatalf("StorageMigration %s: firstPass %q, labels %v, lastPass %+v; want Skip, built-in, no pass", name, sm.Spec.FirstPass, sm.Labels, sm.Status.LastPass)
	}
	ready := findCondition(sm, migrationv1alpha1.ReadyCondition)
	seen := sm.Annotations[migrationv1alpha1.FirstSeenHashAnnotation]
	if replaced(sm) {
		if seen != "" {
			t.Fatalf("StorageMigration %s: first sight stamped %q, yet its baseline was replaced by a pass %+v; want a proven baseline", name, seen, sm.Status.LastPass)
		}
		t.Logf("No stamp; the unproven baseline was replaced by a pass: %s", ready.Message)
		return sm
	}
	recorded, unproven := sm.Status.Baseline.StorageVersionHash, sm.Status.Baseline.Unproven
	stampOK := seen == recorded && unproven == "" && ready.Reason == migrationv1alpha1.SucceededReason
	noStampOK := seen == "" && unproven != "" && ready.Reason == migrationv1alpha1.BaselineUnprovenReason
	if (want == stamped && !stampOK) || (want == unstamped && !noStampOK) || (want == stampedOrUnproven && !stampOK && !noStampOK) {
		t.Fatalf("StorageMigration %s: first sight stamped %q, baseline hash %q, unproven %q, Ready %s; want %v", name, seen, recorded, unproven, ready.Reason, want)
	}
	t.Logf("Baseline: %s: %s", ready.Reason, ready.Message)
	return sm
}

// waitReStored waits, for as long as the StorageMigration keeps moving,
// until its last pass re-stored every policy at v1.
func waitReStored(t *testing.T, cp *testenv.Env) {
	t.Helper()
	sm := cp.WaitForMigration(t, name, time.Minute, "re-stored at v1", func(sm *migrationv1alpha1.StorageMigration) bool {
		return sm.Status.LastPass != nil && sm.Status.LastPass.TargetVersion == "v1" && isReady(sm)
	})
	p := sm.Status.LastPass
	t.Logf("Last pass: %d listed, %d migrated, %d failed in %s; %s", p.Listed, p.Migrated, p.Failed,
		p.CompletionTime.Sub(p.StartTime.Time).Round(100*time.Millisecond), findCondition(sm, migrationv1alpha1.ReadyCondition).Message)
	if p.Failed > 0 || sm.Status.Baseline != nil {
		t.Fatalf("last pass %+v, baseline %+v: want no failure and the baseline gone", p, sm.Status.Baseline)
	}
}

// assertStored reads every policy's key in etcd and counts them by the
// version they are encoded at.
func assertStored(t *testing.T, cp *testenv.Env, want map[string]int) {
	t.Helper()
	got, err := cp.BuiltInStoredVersions(t.Context(), policies)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got, want) {
		t.Fatalf("etcd holds the policies at %v, want %v", got, want)
	}
}

// verify runs kubectl restow verify on the policies, straight from etcd,
// logs what it printed, and fails unless it found them all stored at the
// version the API server stores at.
func verify(t *testing.T, cp *testenv.Env, version string) {
	t.Helper()
	out, _, code := scenario.Restow(t, cp, "verify", name, "--etcd-endpoints", cp.EtcdURL())
	if want := fmt.Sprintf("ok: %d objects stored at %s/%s", n, group, version); code != 0 || !strings.Contains(out, want) {
		t.Errorf("kubectl restow verify exited %d and did not say %q", code, want)
	}
}

func findCondition(sm *migrationv1alpha1.StorageMigration, condition string) *metav1.Condition {
	return apimeta.FindStatusCondition(sm.Status.Conditions, condition)
}

func isReady(sm *migrationv1alpha1.StorageMigration) bool {
	return apimeta.IsStatusConditionTrue(sm.Status.Conditions, migrationv1alpha1.ReadyCondition) &&
		sm.Status.ObservedGeneration == sm.Generation
}
