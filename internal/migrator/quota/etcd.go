package quota

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// Etcd reads every member of an etcd cluster: its Status (file, bytes in
// use, quota) and the cluster's alarms. Its client is raw access to every
// object in the cluster, Secrets included: restow uses it for these reads
// and keys-only reads at a revision, nothing else.
type Etcd struct {
	Client *clientv3.Client
	// Prefix is the API server's --etcd-prefix: compactions are looked for
	// with a keys-only read of one key under it.
	Prefix string
	// QuotaBytes is assumed for a member whose Status reports no quota
	// (etcd before 3.6).
	QuotaBytes int64
}

// Read reads the Status of every member the cluster lists, and the alarms.
// A member it cannot read fails the reading: a check that saw a part is no
// check of the whole.
func (e *Etcd) Read(ctx context.Context) (Reading, error) {
	members, err := e.Client.MemberList(ctx)
	if err != nil {
		return Reading{}, fmt.Errorf("listing etcd's members: %w", err)
	}
	r := Reading{Source: SourceEtcd, QuotaBytes: -1}
	var assumed []string
	for _, m := range members.Members {
		if len(m.ClientURLs) == 0 {
			return Reading{}, fmt.Errorf("etcd member %s has no client URL to read its database size at (a learner not started yet?)", m.Name)
		}
		st, err := e.Client.Status(ctx, m.ClientURLs[0])
		if err != nil {
			return Reading{}, fmt.Errorf("reading the status of etcd member %s at %s: %w", m.Name, m.ClientURLs[0], err)
		}
		quota := st.DbSizeQuota
		if quota <= 0 {
			quota = e.QuotaBytes
			assumed = append(assumed, fmt.Sprintf("member %s's quota %s (it reports none)", m.Name, MiB(quota)))
		}
		r.FileBytes, r.InUseBytes = max(r.FileBytes, st.DbSize), max(r.InUseBytes, st.DbSizeInUse)
		if r.QuotaBytes < 0 || quota < r.QuotaBytes {
			r.QuotaBytes = quota
		}
	}
	if len(members.Members) == 0 {
		return Reading{}, errors.New("etcd lists no members")
	}
	alarms, err := e.Client.AlarmList(ctx)
	if err != nil {
		return Reading{}, fmt.Errorf("listing etcd's alarms: %w", err)
	}
	for _, a := range alarms.Alarms {
		r.Alarms = append(r.Alarms, fmt.Sprintf("%s on member %x", a.Alarm, a.MemberID))
	}
	r.Assumes = strings.Join(assumed, "; ")
	return r, nil
}

// Compacted reads one key under the prefix, keys only, at revision: etcd
// answers that the revision was compacted once a compaction passed it.
func (e *Etcd) Compacted(ctx context.Context, revision int64) (bool, error) {
	prefix := strings.TrimSuffix(e.Prefix, "/") + "/"
	_, err := e.Client.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(revision), clientv3.WithKeysOnly(), clientv3.WithLimit(1))
	switch {
	case errors.Is(err, rpctypes.ErrCompacted):
		return true, nil
	case err != nil:
		return false, err
	}
	return false, nil
}

// Revision is etcd's revision now, from the header of a count of one key's
// range under the prefix.
func (e *Etcd) Revision(ctx context.Context) (int64, error) {
	resp, err := e.Client.Get(ctx, strings.TrimSuffix(e.Prefix, "/")+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}

// Access is how to reach etcd, as etcdctl's flags say it.
type Access struct {
	Endpoints         []string
	CACert, Cert, Key string
	DialTimeout       time.Duration
}

// Dial connects to etcd; the caller closes the client.
func (a Access) Dial(options ...grpc.DialOption) (*clientv3.Client, error) {
	cfg := clientv3.Config{
		Endpoints:   a.Endpoints,
		DialTimeout: a.DialTimeout,
		Logger:      zap.NewNop(),
		DialOptions: options,
	}
	if a.CACert != "" || a.Cert != "" {
		tlsInfo := transport.TLSInfo{CertFile: a.Cert, KeyFile: a.Key, TrustedCAFile: a.CACert}
		tlsConfig, err := tlsInfo.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("etcd client certificates: %w", err)
		}
		cfg.TLS = tlsConfig
	}
	client, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to etcd at %s: %w", strings.Join(a.Endpoints, ","), err)
	}
	return client, nil
}
