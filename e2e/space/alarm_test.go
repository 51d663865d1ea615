//go:build e2e && long

package space

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/e2e/scenario"
	"github.com/restow/restow/internal/cli"
	"github.com/restow/restow/internal/operator"
	"github.com/restow/restow/internal/testenv"
)

// TestNoWriteUnderAlarm: a CRD switched its storage version, then etcd's
// NOSPACE alarm is raised before any pass. kubectl restow run with etcd's
// address, and then the manager with it, send no write (the API server
// counts none for the resource): run exits 2 naming the alarm, the manager
// shows it in restow_etcd_writes_blocked. Once the alarm is disarmed, the
// manager's pass goes on by itself and every object is stored at v1.
func TestNoWriteUnderAlarm(t *testing.T) {
	cp := smallEtcd(t, nil)
	etcd := etcdClient(t, cp)
	fx := testenv.Fixture{Env: cp, Group: "alarm.e2e.restow.dev", Kind: "Gadget", Plural: "gadgets", Namespaced: true}
	fx.Install(t, "v1beta1", "v1")
	fx.CreateObjects(t, "v1beta1", 50, func(i int) map[string]any { return map[string]any{"n": int64(i)} }, namespace)
	fx.SwitchStorage(t, "v1")
	// The StorageMigration is made before the alarm: under it, no one can
	// create one.
	sm := &migrationv1alpha1.StorageMigration{ObjectMeta: metav1.ObjectMeta{Name: fx.CRDName()}, Spec: migrationv1alpha1.StorageMigrationSpec{
		Resource: migrationv1alpha1.GroupResource{Group: fx.Group, Resource: fx.Plural}}}
	if err := cp.Client.Create(t.Context(), sm); err != nil {
		t.Fatal(err)
	}
	member := raiseAlarm(t, etcd, cp.EtcdURL())
	writes := func() float64 {
		counts := scenario.APIRequests(t, cp, fx.Group, fx.Plural)
		return counts["PATCH"] + counts["UPDATE"]
	}
	before := writes()

	_, errOut, code := scenario.Restow(t, cp, "run", fx.CRDName(), "--etcd-endpoints", cp.EtcdURL())
	if code != cli.ExitPending || !strings.Contains(errOut, "EtcdAlarm") || !strings.Contains(errOut, "NOSPACE") {
		t.Errorf("kubectl restow run under the alarm exited %d, want %d with EtcdAlarm and NOSPACE named", code, cli.ExitPending)
	}

	// Under a NOSPACE alarm no controller in the cluster renews its
	// leader election Lease: the manager runs without one here.
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	manager := operator.StartProcess(t, operator.ProcessOptions{Kubeconfig: kubeconfig, Args: []string{"--leader-elect=false", "--etcd-endpoints=" + cp.EtcdURL()}})
	testenv.WaitProgress(t, "the manager to say etcd's alarm blocks its writes", time.Minute, func(ctx context.Context) (bool, string, error) {
		v, err := manager.Metric(ctx, "restow_etcd_writes_blocked", map[string]string{"reason": "EtcdAlarm"})
		return err == nil && v == 1, "restow_etcd_writes_blocked{reason=EtcdAlarm} is not 1 yet", nil
	})
	if after := writes(); after != before {
		t.Errorf("the API server counts %.0f writes of %s under the alarm, want none", after-before, fx.Plural)
	}
	fx.AssertStored(t, map[string]int{"v1beta1": 50})

	if _, err := etcd.AlarmDisarm(t.Context(), &clientv3.AlarmMember{MemberID: member, Alarm: pb.AlarmType_NOSPACE}); err != nil {
		t.Fatal(err)
	}
	disarmed := time.Now()
	cp.WaitForMigration(t, fx.CRDName(), 3*time.Minute, "migrated to v1 after the alarm", func(sm *migrationv1alpha1.StorageMigration) bool { return sm.ReadyAt("v1") })
	t.Logf("Migrated %s after the alarm was disarmed", time.Since(disarmed).Round(time.Second))
	fx.AssertAllStoredAt(t, "v1", 50)
}

// raiseAlarm raises NOSPACE on the member at endpoint, as etcd does when a
// write would pass its quota, and returns the member's ID.
func raiseAlarm(t *testing.T, etcd *clientv3.Client, endpoint string) uint64 {
	t.Helper()
	st, err := etcd.Status(t.Context(), endpoint)
	if err != nil {
		t.Fatal(err)
	}
	member := st.Header.MemberId
	if _, err := pb.NewMaintenanceClient(etcd.ActiveConnection()).Alarm(t.Context(), &pb.AlarmRequest{Action: pb.AlarmRequest_ACTIVATE, MemberID: member, Alarm: pb.AlarmType_NOSPACE}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = etcd.AlarmDisarm(context.Background(), &clientv3.AlarmMember{MemberID: member, Alarm: pb.AlarmType_NOSPACE})
	})
	return member
}
