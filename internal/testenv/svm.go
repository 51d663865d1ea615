package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	svmv1 "k8s.io/api/storagemigration/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/restow/restow/internal/controlplane"
	"github.com/restow/restow/internal/svm"
)

// StandardVersion returns the version of storagemigration.k8s.io the
// control plane serves (started with StorageVersionMigrations). Before
// 1.35 the API server has only the alpha, which restow does not speak: the
// test is skipped there (make test-compat's 1.34 run); from 1.35 on, a
// control plane that serves none fails the test.
func (e *Env) StandardVersion(t testing.TB) string {
	t.Helper()
	disco, err := discovery.NewDiscoveryClientForConfig(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	version, err := svm.ServedVersion(disco)
	if err != nil {
		t.Fatal(err)
	}
	if version == "" {
		minor, err := controlplane.APIServerMinor()
		if err != nil {
			t.Fatal(err)
		}
		if minor >= 35 {
			t.Fatalf("kube-apiserver 1.%d serves no beta or GA storagemigration.k8s.io: the control plane's flags are missing", minor)
		}
		t.Skipf("kube-apiserver 1.%d serves storagemigration.k8s.io as alpha only", minor)
	}
	t.Logf("The control plane serves storagemigration.k8s.io/%s", version)
	return version
}

// CreateStandardMigration creates a StorageVersionMigration of gr, named
// name, at version, from YAML as a CRD author's manifest ships it, and
// deletes it when the test ends.
func (e *Env) CreateStandardMigration(t testing.TB, version, name string, gr schema.GroupResource) {
	t.Helper()
	manifest := fmt.Sprintf(`apiVersion: storagemigration.k8s.io/%s
kind: StorageVersionMigration
metadata:
  name: %s
spec:
  resource:
    group: %s
    resource: %s
`, version, name, gr.Group, gr.Resource)
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(manifest), &u.Object); err != nil {
		t.Fatal(err)
	}
	if err := e.Client.Create(t.Context(), u); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Client.Delete(context.Background(), u); client.IgnoreNotFound(err) != nil {
			t.Error(err)
		}
	})
}

// StandardMigration reads a StorageVersionMigration live, in the v1 types.
func (e *Env) StandardMigration(ctx context.Context, version, name string) (*svmv1.StorageVersionMigration, error) {
	u := svm.New(version)
	if err := e.Client.Get(ctx, client.ObjectKey{Name: name}, u); err != nil {
		return nil, err
	}
	return svm.FromUnstructured(u)
}

// WriteStandardStatus writes the status of a StorageVersionMigration as
// another controller would (an update of the status subresource, with
// userAgent when set; kube-controller-manager's marks the in-tree
// controller): mutate changes the object as read. 1.35 refuses any status
// without a well-formed status.resourceVersion (1.36 accepts none), so a
// writer there sets one first, as the in-tree resource-version controller
// does: an empty one gets the object's own.
func (e *Env) WriteStandardStatus(t testing.TB, version, name, userAgent string, mutate func(*svmv1.StorageVersionMigration)) {
	t.Helper()
	cfg := rest.CopyConfig(e.Config)
	if userAgent != "" {
		cfg.UserAgent = userAgent
	}
	c, err := client.New(cfg, client.Options{Scheme: e.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	m, err := e.StandardMigration(t.Context(), version, name)
	if err != nil {
		t.Fatal(err)
	}
	mutate(m)
	if m.Status.ResourceVersion == "" {
		m.Status.ResourceVersion = m.ResourceVersion
	}
	u, err := svm.ToUnstructured(m, version)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Status().Update(t.Context(), u); err != nil {
		t.Fatal(err)
	}
}

// WaitEvent waits up to a minute for an event about the object of kind and
// name with reason, and returns it.
func (e *Env) WaitEvent(t testing.TB, kind, name, reason string) eventsv1.Event {
	t.Helper()
	var found *eventsv1.Event
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var list eventsv1.EventList
		if err := e.Client.List(ctx, &list); err != nil {
			return false, err
		}
		for _, ev := range list.Items {
			if ev.Regarding.Kind == kind && ev.Regarding.Name == name && ev.Reason == reason {
				found = &ev
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no %s event for %s %s: %v", reason, kind, name, err)
	}
	return *found
}
