package main

import (
	"flag"
	"strings"
	"time"

	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/migrator/quota"
)

// The manager's view of etcd's room (docs/etcd-space.md): the quota it
// assumes and its budget, and, opt-in, etcd's own address and client
// certificates.
type etcdOptions struct {
	quota, budget   quota.Bytes
	endpoints       string
	cacert          string
	cert, key       string
	prefix          string
	compactionBound time.Duration
}

func (o *etcdOptions) bindFlags(fs *flag.FlagSet) {
	o.quota = quota.DefaultQuotaBytes
	fs.Var(&o.quota, "etcd-quota", "etcd's --quota-backend-bytes, as restow assumes it where it reads the API server's metrics (or a member reports none): rewrites keep within a share of the room under it.")
	fs.Var(&o.budget, "etcd-write-budget", "How many bytes restow's rewrites may keep alive in etcd at once, until a compaction passes them; 0 takes half of the room under the quota, read again as it goes.")
	fs.StringVar(&o.endpoints, "etcd-endpoints", "", "Comma-separated etcd client URLs: read every member's database size, quota and alarms there, rather than the API server's metrics. The client certificate (--etcd-cert) is raw access to every object in the cluster; restow reads only sizes, alarms and keys at a revision. Empty: the API server's metrics.")
	fs.StringVar(&o.cacert, "etcd-cacert", "", "CA bundle that signed etcd's serving certificate, with --etcd-endpoints.")
	fs.StringVar(&o.cert, "etcd-cert", "", "Client certificate for etcd, with --etcd-endpoints.")
	fs.StringVar(&o.key, "etcd-key", "", "Client certificate's key for etcd, with --etcd-endpoints.")
	fs.StringVar(&o.prefix, "etcd-prefix", "/registry", "The API server's --etcd-prefix, with --etcd-endpoints.")
	fs.DurationVar(&o.compactionBound, "etcd-compaction-bound", quota.DefaultCompactionBound, "How long a pass that spent its budget waits for a compaction past its rewrites; then it stops, Stalled (EtcdNotCompacting).")
}

func (o *etcdOptions) checks() []func() error {
	return []func() error{
		func() error {
			if o.quota < quota.MinMargin*2 {
				return usagef("--etcd-quota must be at least %s, got %s", quota.MiB(quota.MinMargin*2), o.quota.String())
			}
			return nil
		},
		func() error {
			if o.endpoints == "" && (o.cacert != "" || o.cert != "" || o.key != "") {
				return usagef("--etcd-cacert, --etcd-cert and --etcd-key go with --etcd-endpoints")
			}
			if (o.cert == "") != (o.key == "") {
				return usagef("--etcd-cert and --etcd-key go together")
			}
			return nil
		},
		func() error { return positive("etcd-compaction-bound", o.compactionBound, "") },
	}
}

// space is the controllers' view of etcd's room; with --etcd-endpoints it
// connects to etcd (the connection lives as long as the manager).
func (o *etcdOptions) space() (migrator.SpaceOptions, error) {
	space := migrator.SpaceOptions{QuotaBytes: int64(o.quota), BudgetBytes: int64(o.budget), EtcdPrefix: o.prefix, CompactionBound: o.compactionBound}
	if o.endpoints == "" {
		return space, nil
	}
	client, err := quota.Access{Endpoints: splitList(o.endpoints), CACert: o.cacert, Cert: o.cert, Key: o.key, DialTimeout: 5 * time.Second}.Dial()
	if err != nil {
		return space, err
	}
	space.Etcd = client
	return space, nil
}

// etcdSource says where the manager reads etcd's room, for its start line.
func (o *etcdOptions) etcdSource() string {
	if o.endpoints == "" {
		return "the API server's metrics, quota " + o.quota.String()
	}
	return "etcd at " + strings.ReplaceAll(o.endpoints, ",", ", ")
}
