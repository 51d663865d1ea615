package preflight

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
)

func TestJudge(t *testing.T) {
	live := &Live{Storage: "v1", StoredVersions: []string{"v1alpha1", "v1"}, Served: []string{"v1alpha1", "v1"}}
	for _, tc := range []struct {
		name     string
		versions []string
		live     *Live
		want     State
		reason   string
	}{
		{"keeps every stored version", []string{"v1alpha1", "v1", "v2"}, live, OK, "keeps every version status.storedVersions lists (v1alpha1, v1)"},
		{"drops a stored version, keeps the storage version", []string{"v1", "v2"}, live, NeedsPrepare, "drops v1alpha1, which status.storedVersions still lists: kubectl restow prepare migrates every object to v1"},
		{"drops the storage version, no common version", []string{"v2"}, live, Blocked, "drops v1, the live storage version, as a skipped release or a downgrade does (status.storedVersions lists v1alpha1, v1), and no version the live CRD serves is in the manifest"},
		{"a downgrade with a common version", []string{"v1alpha1"}, live, NeedsPrepare, "kubectl restow prepare makes v1alpha1 (served by both) the live storage version"},
		{"not in the cluster", []string{"v1"}, nil, New, "the apply creates it"},
		// --keep names versions, not schemas: no bridge, where the release's
		// schema of it might prune what the live one keeps.
		{"--keep: a downgrade", []string{"v1alpha1"}, live, Blocked, "--keep gives the versions the release keeps, not its schemas: restow cannot check that objects carried across at v1alpha1 keep every field"},
		{"--keep: drops a stored version, keeps the storage version", []string{"v1"}, live, NeedsPrepare, "migrates every object to v1"},
	} {
		m := Manifest{Name: "x.example.com", Versions: tc.versions, CRD: &apiextensionsv1.CustomResourceDefinition{}}
		if strings.HasPrefix(tc.name, "--keep") {
			m.CRD, m.Source = nil, "--keep"
		}
		v := Judge(m, tc.live)
		if v.State != tc.want || !strings.Contains(v.Reason, tc.reason) {
			t.Errorf("%s: %s: %q, want %s saying %q", tc.name, v.State, v.Reason, tc.want, tc.reason)
		}
	}
	if Blocked.Weight() <= NeedsPrepare.Weight() || NeedsPrepare.Weight() <= OK.Weight() || New.Weight() != OK.Weight() {
		t.Error("weights out of order")
	}
}

// TestJudgeForesees: an apply that passes, after which status.storedVersions
// still lists a version besides the storage version, is ok with a warning
// that a later release dropping it is refused; prepare --ahead can migrate
// before the apply only where the apply keeps the live storage version.
func TestJudgeForesees(t *testing.T) {
	live := &Live{Storage: "v1", StoredVersions: []string{"v1beta1", "v1"}, Served: []string{"v1beta1", "v1"}}
	for _, tc := range []struct {
		name     string
		m        Manifest
		live     *Live
		ahead    []string
		aheadNow bool
	}{
		{"keeps the storage version", Manifest{Versions: []string{"v1beta1", "v1"}, Storage: "v1"}, live, []string{"v1beta1"}, true},
		{"--keep", Manifest{Versions: []string{"v1beta1", "v1"}}, live, []string{"v1beta1"}, true},
		{"switches the storage version", Manifest{Versions: []string{"v1beta1", "v1", "v2"}, Storage: "v2"}, live, []string{"v1beta1", "v1"}, false},
		{"nothing besides the storage version", Manifest{Versions: []string{"v1"}, Storage: "v1"}, &Live{Storage: "v1", StoredVersions: []string{"v1"}, Served: []string{"v1"}}, nil, false},
	} {
		v := Judge(Manifest{Name: "x.example.com", Versions: tc.m.Versions, Storage: tc.m.Storage}, tc.live)
		if v.State != OK || !slices.Equal(v.Ahead, tc.ahead) || v.AheadNow != tc.aheadNow {
			t.Errorf("%s: %s, ahead %v (now %v), want ok, %v (now %v)", tc.name, v.State, v.Ahead, v.AheadNow, tc.ahead, tc.aheadNow)
		}
		warned := slices.ContainsFunc(v.Warnings, func(w string) bool { return strings.Contains(w, "a later release that drops") })
		if warned != (len(tc.ahead) > 0) || (len(v.Warnings) > 0 && strings.Contains(v.Warnings[0], "--ahead") != tc.aheadNow) {
			t.Errorf("%s: warnings %q", tc.name, v.Warnings)
		}
	}
}

func TestReadAndKeep(t *testing.T) {
	dir := t.TempDir()
	crd := "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: widgets.example.com\nspec:\n  group: example.com\n  versions:\n  - name: v1\n    served: true\n    storage: true\n"
	other := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n"
	if err := os.WriteFile(filepath.Join(dir, "all.yaml"), []byte(other+"---\n"+crd), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("not read"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Read([]string{dir}, false, nil)
	if err != nil || len(got) != 1 || got[0].Name != "widgets.example.com" || got[0].Storage != "v1" || got[0].Source != filepath.Join(dir, "all.yaml")+", document 2" {
		t.Fatalf("Read = %+v, %v", got, err)
	}
	if _, err := Read([]string{"-"}, false, strings.NewReader("kind: [")); err == nil || !strings.Contains(err.Error(), "standard input, document 1") {
		t.Errorf("a document that does not decode: %v", err)
	}
	if m, err := ParseKeep("widgets.example.com=v1,v2"); err != nil || strings.Join(m.Versions, " ") != "v1 v2" {
		t.Errorf("ParseKeep = %+v, %v", m, err)
	}
	for _, bad := range []string{"widgets", "widgets.example.com", "widgets.example.com=", "widgets.example.com=v1,,v2"} {
		if _, err := ParseKeep(bad); err == nil {
			t.Errorf("ParseKeep(%q): no error", bad)
		}
	}
}
