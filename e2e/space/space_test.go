//go:build e2e && long

// Package space runs restow against etcd with a small quota: Secrets of
// about 500 KB re-encrypted after a key rotation (kubectl restow run and
// the manager, each with and without etcd's address), custom resources of
// about 200 KB after a storage switch, and an alarm raised before a pass.
// etcd's alarms are polled throughout, and another client writes beside
// restow: no alarm may ever be raised, and no write of another client
// refused.
package space

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/restow/restow/e2e/scenario"
	"github.com/restow/restow/internal/testenv"
)

const (
	// quotaBytes is etcd's --quota-backend-bytes in every test here.
	quotaBytes = 192 << 20
	// compactionInterval is kube-apiserver's --etcd-compaction-interval:
	// shorter than its default 5 minutes, so a test sees several cycles in
	// a minute or two.
	compactionInterval = 10 * time.Second
	namespace          = "space"
)

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	os.Exit(m.Run())
}

// smallEtcd starts a control plane whose etcd has a quota of quotaBytes
// and whose API server compacts every compactionInterval, with more API
// server flags in args.
func smallEtcd(t *testing.T, args map[string]string) *testenv.Env {
	t.Helper()
	// The API server refreshes its estimate of each resource's object size
	// (apiserver_resource_size_estimate_bytes, what restow charges a merge
	// patch) every --etcd-count-metric-poll-period, a minute by default; the
	// tests rotate keys seconds after they create their objects, where a
	// cluster's have been there for long.
	apiArgs := map[string]string{"etcd-compaction-interval": compactionInterval.String(), "etcd-count-metric-poll-period": "5s"}
	for k, v := range args {
		apiArgs[k] = v
	}
	cp := testenv.Start(t, testenv.Options{
		CRDDirectoryPaths: []string{scenario.CRDDirectory},
		EtcdArgs:          map[string]string{"quota-backend-bytes": strconv.Itoa(quotaBytes)},
		APIServerArgs:     apiArgs,
	})
	if err := cp.EnsureNamespaces(t.Context(), namespace); err != nil {
		t.Fatal(err)
	}
	return cp
}

// etcdClient is a client of cp's etcd, closed when the test ends.
func etcdClient(t *testing.T, cp *testenv.Env) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{cp.EtcdURL()}, DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// fresh compacts etcd and defragments it, so that every case starts from
// a database file that holds only what is alive.
func fresh(t *testing.T, cp *testenv.Env, etcd *clientv3.Client) {
	t.Helper()
	// The API server's own compaction may pass the revision first.
	if err := cp.CompactEtcd(t.Context()); err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatal(err)
	}
	if _, err := etcd.Defragment(t.Context(), cp.EtcdURL()); err != nil {
		t.Fatal(err)
	}
	st, err := etcd.Status(t.Context(), cp.EtcdURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("etcd after compaction and defragmentation: file %s, %s in use: %.0f%% of the quota of %s",
		mib(st.DbSize), mib(st.DbSizeInUse), 100*float64(st.DbSize)/quotaBytes, mib(quotaBytes))
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// createBlobs creates n objects of about size random bytes each through
// object, which makes the i-th with its data.
func createBlobs(t *testing.T, cp *testenv.Env, n, size int, object func(i int, data []byte) client.Object) {
	t.Helper()
	start := time.Now()
	err := cp.CreateObjects(t.Context(), n, func(i int) client.Object {
		data := make([]byte, size)
		_, _ = rand.Read(data)
		return object(i, data)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Created %d objects of %d bytes in %s", n, size, time.Since(start).Round(100*time.Millisecond))
}

// watch is etcd and the cluster as seen beside a case: etcd's status and
// alarms every quarter second, and another client's write every second.
type watch struct {
	stop    func()
	done    chan struct{}
	mu      sync.Mutex
	start   time.Time
	maxFile int64
	maxUse  int64
	alarms  []string
	refused []string
	writes  int
	samples int
	marks   []string
}

// watchEtcd starts watching; end stops it and fails the test on any alarm
// or refused write.
func watchEtcd(t *testing.T, cp *testenv.Env, etcd *clientv3.Client) *watch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watch{stop: cancel, done: make(chan struct{}), start: time.Now()}
	heartbeat := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "other-client", Namespace: namespace}}
	if err := cp.Client.Create(t.Context(), heartbeat); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			w.sample(ctx, cp, etcd, heartbeat, i%4 == 0)
		}
	}()
	return w
}

func (w *watch) sample(ctx context.Context, cp *testenv.Env, etcd *clientv3.Client, heartbeat *corev1.ConfigMap, write bool) {
	st, err := etcd.Status(ctx, cp.EtcdURL())
	alarms, aerr := etcd.AlarmList(ctx)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err == nil {
		w.samples++
		w.maxFile, w.maxUse = max(w.maxFile, st.DbSize), max(w.maxUse, st.DbSizeInUse)
		if len(w.marks) == 0 || w.samples%40 == 0 {
			w.marks = append(w.marks, fmt.Sprintf("%s: file %s, in use %s", time.Since(w.start).Round(time.Second), mib(st.DbSize), mib(st.DbSizeInUse)))
		}
	}
	if aerr == nil && len(alarms.Alarms) > 0 {
		w.alarms = append(w.alarms, fmt.Sprintf("%s after %s", alarms.Alarms[0].Alarm, time.Since(w.start).Round(time.Second)))
	}
	if !write {
		return
	}
	w.mu.Unlock()
	patch := fmt.Appendf(nil, `{"data":{"at":%q}}`, time.Now().Format(time.RFC3339Nano))
	werr := cp.Client.Patch(ctx, heartbeat.DeepCopy(), client.RawPatch(types.MergePatchType, patch))
	w.mu.Lock()
	w.writes++
	if werr != nil && ctx.Err() == nil {
		w.refused = append(w.refused, werr.Error())
	}
}

// end stops the watch, logs the timeline and fails on an alarm or a refused write.
func (w *watch) end(t *testing.T) {
	t.Helper()
	w.stop()
	<-w.done
	t.Logf("Beside the case (%s): etcd's file at most %s (%.0f%% of the quota), in use at most %s; %d status samples; timeline: %s",
		time.Since(w.start).Round(time.Second), mib(w.maxFile), 100*float64(w.maxFile)/quotaBytes, mib(w.maxUse), w.samples, strings.Join(w.marks, "; "))
	if len(w.alarms) > 0 {
		t.Errorf("etcd raised an alarm: %s", strings.Join(w.alarms[:min(3, len(w.alarms))], ", "))
	}
	if len(w.refused) > 0 {
		t.Errorf("%d of another client's %d writes were refused, the first: %s", len(w.refused), w.writes, w.refused[0])
	} else {
		t.Logf("Another client's %d writes were all accepted", w.writes)
	}
}

// storedUnder counts the values under prefix in etcd whose bytes start
// with each of the given value prefixes, reading a few values at a time.
func storedUnder(t *testing.T, etcd *clientv3.Client, prefix string, starts ...string) map[string]int {
	t.Helper()
	counts := map[string]int{}
	from, end := prefix, clientv3.GetPrefixRangeEnd(prefix)
	for {
		resp, err := etcd.Get(t.Context(), from, clientv3.WithRange(end), clientv3.WithLimit(10))
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			counts["all"]++
			for _, s := range starts {
				if strings.HasPrefix(string(kv.Value), s) {
					counts[s]++
				}
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return counts
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}
