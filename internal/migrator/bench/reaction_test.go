package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/operator"
	"github.com/restow/restow/internal/testenv"
)

// reactionLag is how late the lagging API server of
// BenchmarkReactionBehindLag sees the storage switch: RESTOW_BENCH_LAG, by
// default 90 s.
func reactionLag(b *testing.B) time.Duration {
	lag := 90 * time.Second
	if s := os.Getenv("RESTOW_BENCH_LAG"); s != "" {
		var err error
		if lag, err = time.ParseDuration(s); err != nil || lag <= 0 {
			b.Fatalf("RESTOW_BENCH_LAG: %q is not a positive duration", s)
		}
	}
	return lag
}

// BenchmarkReactionBehindLag measures how soon the manager, with its default
// flags, migrates after a storage switch that one of three API servers sees
// late, when every watch of the manager runs through that server (its
// kubeconfig names it): the CRD's event reaches the manager only after the
// lag, and so would the event of the StorageMigration it creates, were that
// waited for. It reports the seconds from the switch to the
// StorageMigration's creation, to its first rewritten object and to the
// prune; the last API server switches once the lag is over.
func BenchmarkReactionBehindLag(b *testing.B) {
	lag := reactionLag(b)
	ha := testenv.Start(b, testenv.Options{
		CRDDirectoryPaths: []string{"../../../config/crd/bases"},
		APIServers:        3,
		OwnAddresses:      true,
		LaggingAPIServer:  true,
	})
	ctx := b.Context()
	ha.WaitForSignals(b, 3, 3)
	const n = 2000
	f := newCompareFixture(b, ha, "reaction.bench.restow.dev", n)
	kubeconfig := filepath.Join(b.TempDir(), "kubeconfig")
	if err := ha.WriteKubeconfig(kubeconfig); err != nil {
		b.Fatal(err)
	}
	pointAt(b, kubeconfig, ha.ServerConfig(2).Host)
	manager := operator.StartProcess(b, operator.ProcessOptions{
		Kubeconfig: kubeconfig,
		// The manager's own defaults, the trigger of built-ins among them.
		Args: []string{"--auto-migrate-builtins=true", "--auto-migrate-selector=" + benchLabel + "=" + strconv.Itoa(n), "--settle-window=1s"},
	})
	// Leading, its caches synced, before the lag: a lagging server refuses
	// a starting informer's consistent watch for as long as it lags.
	if err := manager.WaitLeader(ctx, time.Minute); err != nil {
		b.Fatal(err)
	}
	if err := manager.WaitWorking(ctx, time.Minute, "automigration", "storagemigration"); err != nil {
		b.Fatal(err)
	}
	ha.SetWatchLag(lag)
	b.Cleanup(func() { ha.SetWatchLag(0) })
	switched := time.Now()
	if err := f.switchStorage(ctx); err != nil {
		b.Fatal(err)
	}
	created, rewriting := watchReaction(b, ha.ServerConfig(0), f.crdName, lag)
	if err := f.waitPruned(ctx); err != nil {
		b.Fatal(err)
	}
	pruned := time.Since(switched)
	if testing.Verbose() {
		// Where the time went, with -v.
		b.Logf("the manager's log:\n%s", manager.Logs())
	}
	f.assertStored(b)
	b.ReportMetric(lag.Seconds(), "lag-s")
	b.ReportMetric(created.Sub(switched).Seconds(), "switch-to-created-s")
	b.ReportMetric(rewriting.Sub(switched).Seconds(), "switch-to-first-rewrite-s")
	b.ReportMetric(pruned.Seconds(), "switch-to-prune-s")
	fmt.Printf("\nBenchmarkReactionBehindLag: lag %s; after the switch the StorageMigration was created at %.1f s, its first object rewritten at %.1f s, storedVersions pruned at %.1f s\n",
		lag, created.Sub(switched).Seconds(), rewriting.Sub(switched).Seconds(), pruned.Seconds())
}

// pointAt makes every cluster of the kubeconfig file at path name server.
func pointAt(b *testing.B, path, server string) {
	b.Helper()
	config, err := clientcmd.LoadFromFile(path)
	if err != nil {
		b.Fatal(err)
	}
	for _, cluster := range config.Clusters {
		cluster.Server = server
	}
	if err := clientcmd.WriteToFile(*config, path); err != nil {
		b.Fatal(err)
	}
}

// watchReaction polls, through the API server of cfg (one that does not
// lag), the StorageMigration named name until it exists and until its pass
// rewrote an object, and returns when each was first seen.
func watchReaction(b *testing.B, cfg *rest.Config, name string, lag time.Duration) (created, rewriting time.Time) {
	b.Helper()
	c, err := client.New(cfg, client.Options{Scheme: env.Client.Scheme()})
	if err != nil {
		b.Fatal(err)
	}
	// Three lags at most: the old behaviour took two.
	err = wait.PollUntilContextTimeout(b.Context(), 100*time.Millisecond, 3*lag+2*time.Minute, true, func(ctx context.Context) (bool, error) {
		sm := &migrationv1alpha1.StorageMigration{}
		if err := c.Get(ctx, client.ObjectKey{Name: name}, sm); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		if created.IsZero() {
			created = time.Now()
		}
		if p := sm.Status.Progress; (p != nil && p.Migrated+p.Skipped > 0) || sm.Status.LastPass != nil {
			rewriting = time.Now()
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		b.Fatalf("StorageMigration %s: %v", name, err)
	}
	return created, rewriting
}
