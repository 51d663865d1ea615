//go:build e2e && long

package space

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/operator"
	"github.com/restow/restow/internal/testenv"
)

const (
	// widgets custom resources of about widgetBytes each: 100 MB, with
	// etcd's own pages 55% of the quota.
	widgets     = 500
	widgetBytes = 200_000
)

// TestCustomResourcesWithinQuota: custom resources of about 200 KB fill 55%
// of etcd's quota; their CRD switches its storage version, and the manager,
// with its default flags and the quota it cannot read from the API server
// (--etcd-quota), rewrites every one of them: every object stored at v1 in
// etcd, status.storedVersions pruned, no alarm at any time, another
// client's writes accepted throughout.
func TestCustomResourcesWithinQuota(t *testing.T) {
	cp := smallEtcd(t, nil)
	etcd := etcdClient(t, cp)
	fx := testenv.Fixture{Env: cp, Group: "space.e2e.restow.dev", Kind: "Blob", Plural: "blobs", Namespaced: true}
	fx.Install(t, "v1beta1", "v1")
	start := time.Now()
	fx.CreateObjects(t, "v1beta1", widgets, func(int) map[string]any {
		data := make([]byte, widgetBytes*3/4)
		_, _ = rand.Read(data)
		return map[string]any{"data": base64.StdEncoding.EncodeToString(data)}
	}, namespace)
	t.Logf("Created %d objects of about %d bytes in %s", widgets, widgetBytes, time.Since(start).Round(100*time.Millisecond))
	fresh(t, cp, etcd)

	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	manager := operator.StartProcess(t, operator.ProcessOptions{Kubeconfig: kubeconfig, Args: []string{"--etcd-quota=192Mi"}})
	w := watchEtcd(t, cp, etcd)
	start = time.Now()
	fx.SwitchStorage(t, "v1")
	crd := &apiextensionsv1.CustomResourceDefinition{}
	cp.WaitForMigration(t, fx.CRDName(), 5*time.Minute, "migrated to v1", func(sm *migrationv1alpha1.StorageMigration) bool {
		if err := cp.Client.Get(t.Context(), client.ObjectKey{Name: fx.CRDName()}, crd); err != nil {
			return false
		}
		return slices.Equal(crd.Status.StoredVersions, []string{"v1"}) && sm.ReadyAt("v1")
	}, func() string { return fmt.Sprintf("storedVersions %v", crd.Status.StoredVersions) })
	t.Logf("The manager migrated %d objects of %d bytes in %s (the default settle window of 2 minutes included): %s",
		widgets, widgetBytes, time.Since(start).Round(time.Second), spaceMetrics(t, manager))
	w.end(t)
	fx.AssertAllStoredAt(t, "v1", widgets)
}
