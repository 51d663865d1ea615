package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/migrator/quota"
)

// spaceFlags say how run learns etcd's room (docs/etcd-space.md): the
// API server's metrics and a quota by default, or etcd itself, opt-in.
type spaceFlags struct {
	quota, budget quota.Bytes
	etcd          etcdFlags
}

func (o *spaceFlags) add(flags *pflag.FlagSet) {
	o.quota = quota.DefaultQuotaBytes
	flags.Var(&o.quota, "etcd-quota", "etcd's --quota-backend-bytes, as the pass assumes it where it reads the API server's metrics (or a member reports none): rewrites keep within a share of the room under it.")
	flags.Var(&o.budget, "etcd-write-budget", "How many bytes the pass's rewrites may keep alive in etcd at once, until a compaction passes them; 0 takes half of the room under the quota.")
	flags.StringSliceVar(&o.etcd.endpoints, "etcd-endpoints", nil, "etcd's client URLs, as etcdctl's --endpoints: read every member's database size, quota and alarms there, rather than the API server's metrics. Empty: the API server's metrics.")
	flags.StringVar(&o.etcd.cacert, "etcd-cacert", "", "CA bundle that signed etcd's serving certificate, as etcdctl's --cacert.")
	flags.StringVar(&o.etcd.cert, "etcd-cert", "", "Client certificate for etcd, as etcdctl's --cert.")
	flags.StringVar(&o.etcd.key, "etcd-key", "", "Client certificate's key for etcd, as etcdctl's --key.")
	flags.StringVar(&o.etcd.scan.Prefix, "etcd-prefix", "/registry", "The API server's --etcd-prefix.")
	o.etcd.connectTimeout = 5 * time.Second
}

func (o spaceFlags) validate() error {
	switch {
	case o.quota < 2*quota.MinMargin:
		return fmt.Errorf("--etcd-quota must be at least %s, got %s", quota.MiB(2*quota.MinMargin), o.quota.String())
	case len(o.etcd.endpoints) == 0 && (o.etcd.cacert != "" || o.etcd.cert != "" || o.etcd.key != ""):
		return errors.New("--etcd-cacert, --etcd-cert and --etcd-key go with --etcd-endpoints")
	case (o.etcd.cert == "") != (o.etcd.key == ""):
		return errors.New("--etcd-cert and --etcd-key go together")
	}
	return nil
}

// apply sets m's view of etcd's room; with --etcd-endpoints it connects to
// etcd, and close ends that connection.
func (o spaceFlags) apply(m *migrator.Migrator) (closeEtcd func(), err error) {
	m.Space = migrator.SpaceOptions{QuotaBytes: int64(o.quota), BudgetBytes: int64(o.budget), EtcdPrefix: o.etcd.scan.Prefix}
	if len(o.etcd.endpoints) == 0 {
		return func() {}, nil
	}
	client, err := o.etcd.dialEtcd()
	if err != nil {
		return nil, err
	}
	m.Space.Etcd = client
	return func() { _ = client.Close() }, nil
}

// printSpace says what a pass over n objects of target would keep alive in
// etcd, and how many compactions the budget makes it wait for.
func printSpace(ctx context.Context, w io.Writer, m *migrator.Migrator, target migrator.Target, n int64) {
	est, err := m.EstimateSpace(ctx, target, n)
	if err != nil {
		fmt.Fprintf(w, "etcd's room: cannot tell (%s); a pass reads it before it writes, and writes nothing until it can.\n", migrator.Message(err))
		return
	}
	size := "as large as etcd takes (1.5 MiB each: the API server gives no size estimate)"
	if est.ObjectBytes > 0 {
		size = "about " + quota.MiB(est.ObjectBytes) + " each (the API server's estimate)"
	}
	fmt.Fprintf(w, "etcd: the pass keeps up to %s alive until compactions pass it, objects %s; %s.\n", quota.MiB(est.RewriteBytes), size, est.Describe)
	if est.Compactions == 0 {
		fmt.Fprintln(w, "It fits the budget at once: no wait for a compaction.")
	} else {
		fmt.Fprintf(w, "It waits for at least %d compactions (kube-apiserver compacts every --etcd-compaction-interval, 5m by default: about %s or more).\n",
			est.Compactions, strings.TrimSuffix((time.Duration(est.Compactions)*5*time.Minute).String(), "0s"))
	}
}
