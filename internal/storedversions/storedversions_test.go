package storedversions_test

import (
	"errors"
	"slices"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/restow/restow/internal/storedversions"
	"github.com/restow/restow/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	testenv.Main(m, testenv.Options{}, &env)
}

func TestNeedsMigration(t *testing.T) {
	crd := func(storage string, stored ...string) *apiextensionsv1.CustomResourceDefinition {
		c := testenv.NewCRD("g.example.com", "K", "ks", apiextensionsv1.ClusterScoped,
			testenv.CRDVersion{Name: "v1beta1", Served: true, Storage: storage == "v1beta1"},
			testenv.CRDVersion{Name: "v1", Served: true, Storage: storage == "v1"})
		c.Status.StoredVersions = stored
		return c
	}
	for _, tt := range []struct {
		crd  *apiextensionsv1.CustomResourceDefinition
		want bool
	}{
		{crd("v1", "v1"), false},
		{crd("v1", "v1beta1", "v1"), true},
		{crd("v1", "v1beta1"), true},
		{crd("v1beta1", "v1beta1"), false},
	} {
		if got := storedversions.NeedsMigration(tt.crd); got != tt.want {
			t.Errorf("NeedsMigration(storage %s, stored %v) = %v, want %v", storedversions.StorageVersion(tt.crd), tt.crd.Status.StoredVersions, got, tt.want)
		}
	}
}

// installSwitched installs a CRD at v1beta1, switches storage to v1 and
// returns it live, with storedVersions [v1beta1 v1].
func installSwitched(t *testing.T, group string) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	crd := testenv.NewCRD(group, "Knob", "knobs", apiextensionsv1.ClusterScoped,
		testenv.CRDVersion{Name: "v1beta1", Served: true, Storage: true},
		testenv.CRDVersion{Name: "v1", Served: true})
	env.InstallCRDForTest(t, crd)
	if err := env.SetStorageVersion(t.Context(), crd.Name, "v1"); err != nil {
		t.Fatal(err)
	}
	live := &apiextensionsv1.CustomResourceDefinition{}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Name: crd.Name}, live); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(live.Status.StoredVersions, []string{"v1beta1", "v1"}) {
		t.Fatalf("storedVersions = %v, want [v1beta1 v1]", live.Status.StoredVersions)
	}
	return live
}

func TestPrune(t *testing.T) {
	ctx := t.Context()
	crd := installSwitched(t, "prune.storedversions.restow.dev")
	disco := discovery.NewDiscoveryClientForConfigOrDie(env.Config)
	if why, err := storedversions.NotServingStorageVersion(disco, crd); why != "" || err != nil {
		t.Fatalf("NotServingStorageVersion = %q, %v after the switch settled", why, err)
	}

	pruned, err := storedversions.Prune(ctx, env.Client, env.Client, storedversions.Expected{Name: crd.Name, UID: crd.UID, StorageVersion: "v1", Generation: crd.Generation})
	if err != nil || !slices.Equal(pruned, []string{"v1beta1"}) {
		t.Fatalf("Prune = %v, %v; want [v1beta1]", pruned, err)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(crd), crd); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(crd.Status.StoredVersions, []string{"v1"}) {
		t.Errorf("storedVersions = %v after pruning, want [v1]", crd.Status.StoredVersions)
	}
	// Pruning again changes nothing.
	if pruned, err := storedversions.Prune(ctx, env.Client, env.Client, storedversions.Expected{Name: crd.Name, UID: crd.UID, StorageVersion: "v1", Generation: crd.Generation}); err != nil || len(pruned) != 0 {
		t.Errorf("second Prune = %v, %v; want nothing pruned", pruned, err)
	}
}

func TestPruneRefusesWhenTheCRDChanged(t *testing.T) {
	ctx := t.Context()
	crd := installSwitched(t, "changed.storedversions.restow.dev")
	tests := []struct {
		name       string
		target     string
		generation int64
		uid        types.UID
	}{
		{"spec changed since the pass began", "v1", crd.Generation - 1, crd.UID},
		{"storage version is not the target", "v1beta1", crd.Generation, crd.UID},
		{"the CRD was deleted and created again", "v1", crd.Generation, "another-uid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pruned, err := storedversions.Prune(ctx, env.Client, env.Client, storedversions.Expected{Name: crd.Name, UID: tt.uid, StorageVersion: tt.target, Generation: tt.generation})
			if !errors.Is(err, storedversions.ErrCRDChanged) || pruned != nil {
				t.Fatalf("Prune = %v, %v; want ErrCRDChanged", pruned, err)
			}
			live := &apiextensionsv1.CustomResourceDefinition{}
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(crd), live); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(live.Status.StoredVersions, []string{"v1beta1", "v1"}) {
				t.Errorf("storedVersions = %v, want them untouched", live.Status.StoredVersions)
			}
		})
	}
}
