package config_test

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// TestRestrictedOverlayAsShown holds the restricted profile's overlay in
// docs/install.md to config/testdata/named-groups, the overlay
// TestManagerRBAC runs restow with: the same component and patches, from
// the repository's URLs rather than its directories. The overlay grants the
// group it adds and restow's own; the component alone, restow's own only.
func TestRestrictedOverlayAsShown(t *testing.T) {
	doc, err := os.ReadFile("../docs/install.md")
	if err != nil {
		t.Fatal(err)
	}
	at := strings.Index(string(doc), "### The restricted profile")
	if at < 0 {
		t.Fatal("docs/install.md has no section The restricted profile")
	}
	section := string(doc)[at:]
	block := regexp.MustCompile("(?s)```yaml\n(.*?)\n *```").FindStringSubmatch(section)
	if block == nil {
		t.Fatal("docs/install.md shows no yaml block under The restricted profile")
	}
	var shown, tested map[string]any
	if err := yaml.Unmarshal([]byte(dedent(block[1])), &shown); err != nil {
		t.Fatalf("the restricted profile's overlay in docs/install.md: %v", err)
	}
	raw, err := os.ReadFile("testdata/named-groups/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &tested); err != nil {
		t.Fatal(err)
	}
	remote := regexp.MustCompile(`^https://github\.com/restow/restow/(config/[a-z/-]+)\?ref=v\d+\.\d+\.\d+$`)
	for _, key := range []string{"resources", "components"} {
		listed := shown[key].([]any)
		paths := make([]string, 0, len(listed))
		for _, r := range listed {
			m := remote.FindStringSubmatch(r.(string))
			if m == nil {
				t.Fatalf("docs/install.md's overlay names %q in %s, not a path of this repository at a release", r, key)
			}
			paths = append(paths, "../../"+strings.TrimPrefix(m[1], "config/"))
		}
		if want := anyStrings(tested[key]); !slices.Equal(paths, want) {
			t.Errorf("%s: docs/install.md's overlay has %v, config/testdata/named-groups %v", key, paths, want)
		}
	}
	if !reflect.DeepEqual(shown["patches"], tested["patches"]) {
		t.Errorf("patches: docs/install.md's overlay has\n%v\nconfig/testdata/named-groups has\n%v", shown["patches"], tested["patches"])
	}

	for dir, want := range map[string][]string{
		"testdata/named-groups":   {"stable.example.com", "migration.restow.dev"},
		"testdata/component-only": {"migration.restow.dev"},
	} {
		var role rbacv1.ClusterRole
		into(t, find(t, render(t, dir), "ClusterRole", "restow-manager-role"), &role)
		if got := role.Rules[1].APIGroups; !slices.Equal(got, want) {
			t.Errorf("%s: the manager may list, patch and update in groups %v, want %v", dir, got, want)
		}
		if got := role.Rules[0].NonResourceURLs; !slices.Equal(got, []string{"/metrics"}) {
			t.Errorf("%s: rule 0 is %+v, want get on /metrics kept", dir, role.Rules[0])
		}
	}
}

// dedent removes the indent of a block nested in a Markdown list.
func dedent(block string) string {
	lines := strings.Split(block, "\n")
	indent := len(lines[0]) - len(strings.TrimLeft(lines[0], " "))
	for i, l := range lines {
		if len(l) >= indent {
			lines[i] = l[indent:]
		}
	}
	return strings.Join(lines, "\n")
}

func anyStrings(v any) []string {
	items := v.([]any)
	out := make([]string, 0, len(items))
	for _, s := range items {
		out = append(out, s.(string))
	}
	return out
}
