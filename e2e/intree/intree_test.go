//go:build e2e

// Package intree runs restow's manager beside kube-controller-manager's own
// StorageVersionMigration controller on one control plane. Run with
// `make test-e2e`.
package intree

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	svmv1 "k8s.io/api/storagemigration/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/controllers"
	"github.com/restow/restow/e2e/scenario"
	"github.com/restow/restow/internal/operator"
	"github.com/restow/restow/internal/svm"
	"github.com/restow/restow/internal/testenv"
)

// TestBesideTheInTreeController runs kube-controller-manager's own
// StorageVersionMigration controller (built from source with kube-apiserver)
// and restow's manager with --serve-storage-version-migrations on one
// control plane, and ships a StorageVersionMigration beside a CRD whose
// storage version switched, as a chart would. The in-tree controller claims
// it within restow's grace, and restow starts while it migrates: restow
// leaves it alone (a ControllerConflict
// event, never a status write) and its automatic trigger holds back, so the
// in-tree controller alone migrates: etcd holds every object at v1 at the end.
func TestBesideTheInTreeController(t *testing.T) {
	cp := testenv.Start(t, testenv.Options{CRDDirectoryPaths: []string{scenario.CRDDirectory}, StorageVersionMigrations: true})
	const n = 3000
	fx := testenv.Fixture{Env: cp, Group: "intree.e2e.restow.dev", Kind: scenario.Kind, Plural: scenario.Plural, Namespaced: true}
	fx.Install(t, "v1beta1", "v1")
	if err := cp.EnsureNamespaces(t.Context(), "intree"); err != nil {
		t.Fatal(err)
	}
	fx.CreateObjects(t, "v1beta1", n, func(int) map[string]any { return map[string]any{"size": int64(1)} }, "intree")
	fx.SwitchStorage(t, "v1")

	// After the CRD exists, so the garbage collector's first discovery,
	// which the in-tree migrator reads objects through, includes it.
	kcmLogs := &testenv.LockedBuffer{}
	kcm, err := cp.StartControllerManager([]string{"garbage-collector-controller", "storage-version-migrator-controller"}, kcmLogs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := kcm.Stop(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("kube-controller-manager's log:\n%s", kcmLogs.String())
		}
	})

	created := time.Now()
	cp.CreateStandardMigration(t, "v1", "widgets-to-v1", schema.GroupResource{Group: fx.Group, Resource: scenario.Plural})
	get := func(ctx context.Context) (*svmv1.StorageVersionMigration, error) {
		return cp.StandardMigration(ctx, "v1", "widgets-to-v1")
	}
	var m *svmv1.StorageVersionMigration
	err = wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		if m, err = get(ctx); err != nil {
			return false, err
		}
		return len(m.Status.Conditions) > 0, nil
	})
	if err != nil {
		t.Fatalf("the in-tree controller wrote no status: %v", err)
	}
	claimedAfter := time.Since(created)
	if s := svm.StateOf(m); s.Final() {
		t.Fatalf("the in-tree controller ended before restow started (%s): the test needs more objects", s)
	}

	// restow starts while the in-tree controller migrates, as it would
	// when a chart ships the StorageVersionMigration beside the CRD.
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	operator.StartProcess(t, operator.ProcessOptions{Kubeconfig: kubeconfig, Args: []string{"--serve-storage-version-migrations"}})
	// The in-tree controller reports no counts: what etcd holds is its
	// progress. It may also sit for a while between steps (its garbage
	// collector rescans every 30 s): two minutes without a change fail.
	testenv.WaitProgress(t, "the in-tree controller to finish the StorageVersionMigration", 2*time.Minute, func(ctx context.Context) (bool, string, error) {
		if m, err = get(ctx); err != nil {
			return false, "", err
		}
		counts, err := fx.StoredCounts(ctx)
		return svm.StateOf(m).Final(), fmt.Sprintf("%s, etcd holds %v", svm.StateOf(m), counts), err
	})
	t.Logf("kube-controller-manager wrote the first status %s after the StorageVersionMigration was created (restow waits %s before it claims one); it ended %s after %s",
		claimedAfter.Round(time.Millisecond), "3s", svm.StateOf(m), time.Since(created).Round(100*time.Millisecond))
	if s := svm.StateOf(m); s != svm.Succeeded {
		t.Fatalf("state %s, want Succeeded; conditions %+v", s, m.Status.Conditions)
	}
	var managers []string
	for _, f := range m.ManagedFields {
		if f.Subresource == "status" {
			managers = append(managers, f.Manager)
		}
	}
	if slices.Contains(managers, controllers.StatusFieldOwner) || !slices.Contains(managers, "kube-controller-manager") {
		t.Errorf("status field managers %v: want kube-controller-manager's and not restow's", managers)
	}
	fx.AssertAllStoredAt(t, "v1", n)

	// restow saw the other controller and said it leaves the object alone.
	cp.WaitEvent(t, svm.Kind, "widgets-to-v1", controllers.ControllerConflictReason)
	// The trigger held back while the in-tree controller ran.
	e := cp.WaitEvent(t, "CustomResourceDefinition", fx.CRDName(), "AutomaticMigrationHeldBack")
	if !strings.Contains(e.Note, "StorageVersionMigration widgets-to-v1") {
		t.Errorf("held-back event says %q, want it to name widgets-to-v1", e.Note)
	}
	// Since 1.36 the in-tree controller prunes status.storedVersions itself.
	err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return slices.Equal(fx.StoredVersions(t), []string{"v1"}), nil
	})
	if err != nil {
		t.Errorf("status.storedVersions %v, want [v1] once the in-tree controller ended", fx.StoredVersions(t))
	}
	var sms migrationv1alpha1.StorageMigrationList
	if err := cp.Client.List(t.Context(), &sms); err != nil {
		t.Fatal(err)
	}
	// Not even between the in-tree controller's Succeeded and its prune,
	// a step later: the trigger waits until Running is false as well.
	for _, sm := range sms.Items {
		if sm.Spec.Resource.Group == fx.Group {
			t.Errorf("restow's trigger created StorageMigration %s beside the in-tree controller", sm.Name)
		}
	}
	if os.Getenv("RESTOW_E2E_KEEP_KCM_LOG") != "" {
		t.Logf("kube-controller-manager's log:\n%s", kcmLogs.String())
	}
}
