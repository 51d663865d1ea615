package config_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/installer"
	"github.com/restow/restow/internal/operator"
)

// TestInstallManifest renders dist/install.yaml as `make build-installer`
// does, applies the file to the test control plane as `kubectl apply -f`
// would, finds every object it holds accepted and stored, and runs the
// manager the way its Deployment says, as its service account: it takes
// the lease, migrates a CRD (proven from etcd) and reports its build.
func TestInstallManifest(t *testing.T) {
	const image, release = "ghcr.io/restow/restow:v9.8.7", "v9.8.7"
	manifest, err := installer.Render("default", image, release)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "install.yaml")
	if err := os.WriteFile(file, manifest, 0o600); err != nil {
		t.Fatal(err)
	}
	written, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	objs := decodeManifests(t, string(written))
	if want := len(render(t, "default")); len(objs) != want {
		t.Errorf("install.yaml holds %d objects, config/default renders %d", len(objs), want)
	}
	var deploy appsv1.Deployment
	into(t, find(t, objs, "Deployment"), &deploy)
	if got := deploy.Spec.Template.Spec.Containers[0].Image; got != image {
		t.Errorf("the manager's image is %q, want the release's %q", got, image)
	}
	if !strings.Contains(string(manifest), "restow "+release) {
		t.Errorf("install.yaml's header does not name %s", release)
	}

	apply(t, objs)
	for _, o := range objs {
		live := &unstructured.Unstructured{}
		live.SetGroupVersionKind(o.GroupVersionKind())
		if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(o), live); err != nil {
			t.Errorf("%s %s from install.yaml is not on the API server: %v", o.GetKind(), o.GetName(), err)
		}
	}

	manager := assertDeployedManagerMigrates(t, objs, "install.config.restow.dev", "Widget", "widgets")
	if info, err := manager.Metric(t.Context(), "restow_build_info", nil); err != nil || info != 1 {
		t.Errorf("restow_build_info = %v (%v), want 1", info, err)
	}
}

// startDeployedManager runs cmd/manager as the rendered Deployment would run
// it, with its container's arguments, authenticated as its service account
// (the test control plane authorizes with RBAC), and waits until it holds
// the lease. The test control plane runs no pods, so the binary runs here;
// only the listen addresses move to free loopback ports, and the settle
// window is shortened (no write is held on the old storage in these tests).
func startDeployedManager(t *testing.T, objs []*unstructured.Unstructured) *operator.Process {
	t.Helper()
	var deploy appsv1.Deployment
	into(t, find(t, objs, "Deployment"), &deploy)
	var sa corev1.ServiceAccount
	into(t, find(t, objs, "ServiceAccount", deploy.Spec.Template.Spec.ServiceAccountName), &sa)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfigAs(kubeconfig, serviceaccount.MakeUsername(sa.Namespace, sa.Name), serviceaccount.MakeGroupNames(sa.Namespace)...); err != nil {
		t.Fatal(err)
	}
	args := slices.DeleteFunc(slices.Clone(deploy.Spec.Template.Spec.Containers[0].Args), func(arg string) bool {
		return strings.HasPrefix(arg, "--metrics-bind-address") || strings.HasPrefix(arg, "--health-probe-bind-address")
	})
	// In a pod, the Lease's namespace is the pod's.
	args = append(args, "--leader-election-namespace="+deploy.Namespace, "--settle-window=1s")
	manager := operator.StartProcess(t, operator.ProcessOptions{Kubeconfig: kubeconfig, Args: args})
	if err := manager.WaitLeader(t.Context(), time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if strings.Contains(manager.Logs(), "forbidden") {
			t.Errorf("the manager was refused something:\n%s", manager.Logs())
		}
	})
	return manager
}

// assertDeployedManagerMigrates is the proof that an install brings up a
// working operator: the manager, run as the rendered Deployment and its
// service account say, migrates a new CRD of 100 objects in group once its
// storage version switches, proven from etcd and status.storedVersions.
// The manager keeps running until the test ends.
func assertDeployedManagerMigrates(t *testing.T, objs []*unstructured.Unstructured, group, kind, plural string) *operator.Process {
	t.Helper()
	c := installCRD(t, group, kind, plural, 100)
	manager := startDeployedManager(t, objs)
	c.SwitchStorage(t, "v1")
	waitCondition(t, c.crdName, migrationv1alpha1.ReadyCondition, migrationv1alpha1.SucceededReason)
	c.assertAllStoredAt(t, "v1")
	c.assertStoredVersions(t, "v1")
	deleteMigration(t, c.crdName)
	return manager
}
