package testenv

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
)

// BuiltInsExcept returns, for --auto-migrate-builtins-exclude, the
// resource.group of every resource discovery lists but those in keep
// (resource.group, "configmaps" for the core group's): a test of the
// automatic migration of built-in resources then watches the
// StorageMigrations it cares about, not fifty.
func (e *Env) BuiltInsExcept(tb testing.TB, keep ...string) []string {
	tb.Helper()
	disco, err := discovery.NewDiscoveryClientForConfig(e.Config)
	if err != nil {
		tb.Fatal(err)
	}
	lists, err := disco.ServerPreferredResources()
	if err != nil {
		tb.Fatal(err)
	}
	others := map[string]bool{}
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			tb.Fatal(err)
		}
		for _, r := range l.APIResources {
			name := schema.GroupResource{Group: gv.Group, Resource: r.Name}.String()
			if !strings.Contains(r.Name, "/") && !slices.Contains(keep, name) {
				others[name] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(others))
}
