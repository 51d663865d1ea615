package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	svmv1 "k8s.io/api/storagemigration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
)

// anotherMigrator is the start of the note that a StorageVersionMigration
// which has not ended hands the resource to another migrator.
const anotherMigrator = "another migrator (the in-tree controller of kube-controller-manager"

// failStandardMigration writes a Failed condition into the status of a
// StorageVersionMigration, as the in-tree controller ends one.
func failStandardMigration(t *testing.T, version, name, message string) {
	t.Helper()
	env.WriteStandardStatus(t, version, name, "", func(m *svmv1.StorageVersionMigration) {
		m.Status.Conditions = append(m.Status.Conditions, metav1.Condition{
			Type: string(svmv1.MigrationFailed), Status: metav1.ConditionTrue, Reason: "StorageVersionMigrationFailed", Message: message, LastTransitionTime: metav1.Now(),
		})
	})
}

type standardEntry struct {
	Name  string `json:"name"`
	State string `json:"state"`
}

// standardOf is the storageVersionMigrations of the plan entry of crdName in
// plan's JSON or YAML (decoded alike), and the entry's blockedBy; present
// says whether the field is there at all.
func standardOf(t *testing.T, format, out, crdName string) (ms []standardEntry, blockedBy []string, present bool) {
	t.Helper()
	var plan struct {
		Pending []map[string]json.RawMessage `json:"pending"`
	}
	if err := yaml.Unmarshal([]byte(out), &plan); err != nil {
		t.Fatalf("plan -o %s: %v", format, err)
	}
	for _, e := range plan.Pending {
		var crd string
		if err := json.Unmarshal(e["crd"], &crd); err != nil || crd != crdName {
			continue
		}
		if err := json.Unmarshal(e["blockedBy"], &blockedBy); err != nil {
			t.Fatal(err)
		}
		raw, present := e["storageVersionMigrations"]
		if present {
			if err := json.Unmarshal(raw, &ms); err != nil {
				t.Fatal(err)
			}
		}
		return ms, blockedBy, present
	}
	t.Fatalf("plan -o %s has no entry for %s", format, crdName)
	return nil, nil, false
}

// assertPlanShowsStandard checks plan's JSON, YAML and table for the
// StorageVersionMigrations of w, and for the note that another migrator
// prunes, which names active when set.
func assertPlanShowsStandard(t *testing.T, w widgets, want []standardEntry, active string) {
	t.Helper()
	note := ""
	if active != "" {
		note = "StorageVersionMigration " + active + ": " + anotherMigrator
	}
	for _, format := range []string{"json", "yaml"} {
		out, _, code := restow(t, "plan", "-o", format)
		ms, blockedBy, _ := standardOf(t, format, out, w.crdName())
		noted := slices.ContainsFunc(blockedBy, func(b string) bool { return strings.Contains(b, anotherMigrator) })
		exact := note != "" && slices.ContainsFunc(blockedBy, func(b string) bool { return strings.HasPrefix(b, note) })
		if code != 0 || !slices.Equal(ms, want) || noted != (note != "") || (note != "" && !exact) {
			t.Errorf("plan -o %s: exit %d, storageVersionMigrations %v, blockedBy %q; want %v and the note %q", format, code, ms, blockedBy, want, note)
		}
	}
	out, _, code := restow(t, "plan")
	cells := make([]string, 0, len(want))
	for _, m := range want {
		cells = append(cells, fmt.Sprintf("%s (%s)", m.Name, m.State))
	}
	row := lineOf(out, w.crdName())
	if code != 0 || !strings.Contains(out, "STORAGEVERSIONMIGRATIONS") || !strings.Contains(row, strings.Join(cells, ", ")) ||
		strings.Contains(row, anotherMigrator) != (note != "") {
		t.Errorf("plan: exit %d, row %q; want a STORAGEVERSIONMIGRATIONS column of %q, and the note only while one has not ended (%q)", code, row, cells, note)
	}
}

// lineOf is the line of out that holds s.
func lineOf(out, s string) string {
	for line := range strings.Lines(out) {
		if strings.Contains(line, s) {
			return line
		}
	}
	return ""
}

// warnings are the lines of stderr that start with "Warning:".
func warnings(stderr string) []string {
	var out []string
	for line := range strings.Lines(stderr) {
		if strings.HasPrefix(line, "Warning:") {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return out
}

// TestStorageVersionMigrations: a standard StorageVersionMigration shipped
// for a switched CRD shows in plan (JSON, YAML, table) as Pending, with a
// note that another migrator prunes; in status NAME; and as one warning
// line before migrate and run. Once Failed, it shows as Failed and the note
// and warnings are gone. A run beside a newer one that has not ended warns
// and goes on to migrate and prune.
func TestStorageVersionMigrations(t *testing.T) {
	version := env.StandardVersion(t)
	w := installSwitched(t, "svm.cli.restow.dev", 20)
	w.deleteMigrationsAtEnd(t)
	env.CreateStandardMigration(t, version, "widgets-to-v1", schema.GroupResource{Group: w.group, Resource: "widgets"})

	assertPlanShowsStandard(t, w, []standardEntry{{"widgets-to-v1", "Pending"}}, "widgets-to-v1 is Pending")

	_, errOut, code := restow(t, "migrate", w.crdName())
	if want := "Warning: StorageVersionMigration widgets-to-v1 is Pending: " + anotherMigrator; code != 0 ||
		len(warnings(errOut)) != 1 || !strings.HasPrefix(warnings(errOut)[0], want) || !strings.HasSuffix(warnings(errOut)[0], "Going on: rewrites are idempotent.") {
		t.Errorf("migrate: exit %d, warnings %q; want 0 and one warning starting %q", code, warnings(errOut), want)
	}
	out, errOut, code := restow(t, "status", w.crdName())
	for _, want := range []string{"StorageVersionMigrations:", "NAME", "widgets-to-v1", "Pending", "StorageVersionMigration widgets-to-v1 is Pending: " + anotherMigrator} {
		if code != 0 || !strings.Contains(out, want) || errOut != "" {
			t.Errorf("status %s: exit %d, stderr %q, output lacks %q", w.crdName(), code, errOut, want)
		}
	}
	_, errOut, code = restow(t, "run", w.crdName(), "--dry-run")
	if code != 0 || len(warnings(errOut)) != 1 || !strings.Contains(errOut, "StorageVersionMigration widgets-to-v1 is Pending") {
		t.Errorf("run --dry-run: exit %d, warnings %q; want one naming widgets-to-v1 and Pending", code, warnings(errOut))
	}

	failStandardMigration(t, version, "widgets-to-v1", "the in-tree controller gave up")
	assertPlanShowsStandard(t, w, []standardEntry{{"widgets-to-v1", "Failed"}}, "")
	out, _, code = restow(t, "status", w.crdName())
	if row := lineOf(out, "widgets-to-v1"); code != 0 || !strings.Contains(row, "Failed") || !strings.Contains(row, "the in-tree controller gave up") || strings.Contains(out, anotherMigrator) {
		t.Errorf("status %s: exit %d, row %q; want widgets-to-v1 Failed with its message, and no note", w.crdName(), code, row)
	}
	if _, errOut, code = restow(t, "run", w.crdName(), "--dry-run"); code != 0 || errOut != "" {
		t.Errorf("run --dry-run beside a Failed StorageVersionMigration: exit %d, stderr %q; want 0 and no warning", code, errOut)
	}

	// A newer one has not ended: it is the one named, and the run goes on.
	time.Sleep(time.Second) // creation times have a resolution of a second
	env.CreateStandardMigration(t, version, "widgets-again", schema.GroupResource{Group: w.group, Resource: "widgets"})
	assertPlanShowsStandard(t, w, []standardEntry{{"widgets-to-v1", "Failed"}, {"widgets-again", "Pending"}}, "widgets-again is Pending")
	_, errOut, code = restow(t, "run", w.crdName(), "--settle-window", "1s")
	if code != 0 || len(warnings(errOut)) != 1 || !strings.Contains(errOut, "Warning: StorageVersionMigration widgets-again is Pending") {
		t.Errorf("run: exit %d, warnings %q; want 0 and one warning naming widgets-again", code, warnings(errOut))
	}
	w.assertStored(t, map[string]int{"v1": 20})
	w.assertStoredVersions(t, "v1")
}

// TestStorageVersionMigrationsUnreadable: a user who may not list
// StorageVersionMigrations still gets plan and status, without them: no
// field, no column, no section, and one warning line on stderr.
func TestStorageVersionMigrationsUnreadable(t *testing.T) {
	version := env.StandardVersion(t)
	w := installSwitched(t, "unreadable.svm.cli.restow.dev", 5)
	w.deleteMigrationsAtEnd(t)
	env.CreateStandardMigration(t, version, "widgets-to-v1", schema.GroupResource{Group: w.group, Resource: "widgets"})
	sm := &migrationv1alpha1.StorageMigration{
		ObjectMeta: metav1.ObjectMeta{Name: w.crdName()},
		Spec:       migrationv1alpha1.StorageMigrationSpec{Resource: migrationv1alpha1.GroupResource{Group: w.group, Resource: "widgets"}},
	}
	if err := env.Client.Create(t.Context(), sm); err != nil {
		t.Fatal(err)
	}

	const user = "restow-test-no-svm"
	grant(t, user, []rbacv1.PolicyRule{
		{APIGroups: []string{"apiextensions.k8s.io"}, Resources: []string{"customresourcedefinitions"}, Verbs: []string{"get", "list"}},
		{APIGroups: []string{migrationv1alpha1.GroupVersion.Group}, Resources: []string{"storagemigrations"}, Verbs: []string{"get", "list"}},
		{APIGroups: []string{w.group}, Resources: []string{"widgets"}, Verbs: []string{"list"}},
	})
	as := restowAs(t, user)
	// The authorizer sees the binding within moments.
	for range 50 {
		if _, _, code := as("plan", "-o", "json"); code == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}

	const warning = "Warning: StorageVersionMigrations (storagemigration.k8s.io) are left out: "
	assertOneWarning := func(args []string, errOut string) {
		t.Helper()
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		if len(lines) != 1 || !strings.HasPrefix(lines[0], warning) || !strings.Contains(lines[0], `cannot list resource "storageversionmigrations"`) {
			t.Errorf("%v: stderr %q, want one line: %s...cannot list resource \"storageversionmigrations\"", args, errOut, warning)
		}
	}
	for _, format := range []string{"json", "yaml"} {
		args := []string{"plan", "-o", format}
		out, errOut, code := as(args...)
		ms, blockedBy, present := standardOf(t, format, out, w.crdName())
		if code != 0 || present || slices.ContainsFunc(blockedBy, func(b string) bool { return strings.Contains(b, anotherMigrator) }) {
			t.Errorf("%v: exit %d, storageVersionMigrations %v (present: %v), blockedBy %q; want 0, no field and no note", args, code, ms, present, blockedBy)
		}
		assertOneWarning(args, errOut)
	}
	out, errOut, code := as("plan")
	if code != 0 || !strings.Contains(out, w.crdName()) || strings.Contains(out, "STORAGEVERSIONMIGRATIONS") {
		t.Errorf("plan: exit %d; want 0, a row for %s and no STORAGEVERSIONMIGRATIONS column", code, w.crdName())
	}
	assertOneWarning([]string{"plan"}, errOut)
	out, errOut, code = as("status", w.crdName())
	if code != 0 || !strings.Contains(out, "Name:") || strings.Contains(out, "StorageVersionMigration") {
		t.Errorf("status %s: exit %d; want 0, the description and no StorageVersionMigrations", w.crdName(), code)
	}
	assertOneWarning([]string{"status", w.crdName()}, errOut)
}

// grant binds a ClusterRole of rules to user until the test ends.
func grant(t *testing.T, user string, rules []rbacv1.PolicyRule) {
	t.Helper()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user}, Rules: rules}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	for _, obj := range []client.Object{role, binding} {
		if err := env.Client.Create(t.Context(), obj); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
	}
}

// restowAs returns a function that runs kubectl restow as user (a client
// certificate of its own; RBAC decides), with a cache of its own each time.
func restowAs(t *testing.T, user string) func(args ...string) (string, string, int) {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfigAs(kubeconfig, user); err != nil {
		t.Fatal(err)
	}
	return func(args ...string) (string, string, int) {
		t.Helper()
		return execute(t, append([]string{"--kubeconfig", kubeconfig, "--cache-dir", filepath.Join(t.TempDir(), "cache")}, args...)...)
	}
}
