package migrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	clientv3 "go.etcd.io/etcd/client/v3"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/restow/restow/internal/migrator/quota"
)

// etcd's space, as a pass spends it (package quota): the Migrator's one
// budget for all of its passes, read from etcd where restow has its
// address and from the API server's metrics elsewhere; each write's size,
// and whether a compaction passed a revision, told by the pass.

// SpaceOptions say how a Migrator learns etcd's room.
type SpaceOptions struct {
	// QuotaBytes is etcd's --quota-backend-bytes as restow assumes it where
	// etcd does not report its own; zero means quota.DefaultQuotaBytes.
	QuotaBytes int64
	// BudgetBytes, when positive, is how many bytes restow's rewrites may
	// keep alive until a compaction, within the file check; zero means a
	// share of the room (quota.DefaultShare).
	BudgetBytes int64
	// Etcd, if set, is a client of the cluster's etcd: every member's
	// Status and the alarms are read there. Without it, the API server's
	// apiserver_storage_size_bytes.
	Etcd *clientv3.Client
	// EtcdPrefix is the API server's --etcd-prefix; "" means /registry.
	EtcdPrefix string
	// CompactionBound is how long a pass waits for a compaction past its
	// writes before it stops; zero means quota.DefaultCompactionBound.
	CompactionBound time.Duration
	// Changed, if set, is told the budget's stats when they change.
	Changed func(quota.Stats)
}

// space is the Migrator's budget, made at first use.
func (m *Migrator) space() *quota.Budget {
	m.spaceOnce.Do(func() {
		o := m.Space
		if o.QuotaBytes <= 0 {
			o.QuotaBytes = quota.DefaultQuotaBytes
		}
		var source quota.Source = apiServerSpace{m: m, quotaBytes: o.QuotaBytes}
		if o.Etcd != nil {
			prefix := o.EtcdPrefix
			if prefix == "" {
				prefix = "/registry"
			}
			source = &quota.Etcd{Client: o.Etcd, Prefix: prefix, QuotaBytes: o.QuotaBytes}
		}
		b := quota.New(source)
		b.LimitBytes, b.Changed = o.BudgetBytes, o.Changed
		if o.CompactionBound > 0 {
			b.CompactionBound = o.CompactionBound
		}
		m.budget = b
	})
	return m.budget
}

// SpaceStats is what the Migrator's budget shows now.
func (m *Migrator) SpaceStats() quota.Stats { return m.space().Stats() }

// The API server's metrics restow reads for space.
const (
	storageSizeMetric  = "apiserver_storage_size_bytes"
	sizeEstimateMetric = "apiserver_resource_size_estimate_bytes"
	objectCountMetric  = "apiserver_resource_objects"
)

// metricStaleness is kube-apiserver's default --etcd-db-metric-poll-interval.
const metricStaleness = 30 * time.Second

// apiServerSpace reads etcd's file size as the API server reports it: the
// size of the database file of the member it asked at the time of the
// scrape. It cannot see inside the file, nor the quota, nor alarms.
type apiServerSpace struct {
	m          *Migrator
	quotaBytes int64
}

func (s apiServerSpace) Read(ctx context.Context) (quota.Reading, error) {
	start := time.Now()
	families, err := s.m.readMetrics(ctx, storageSizeMetric)
	if err != nil {
		return quota.Reading{}, err
	}
	f := families[storageSizeMetric]
	if f == nil || len(f.GetMetric()) == 0 {
		return quota.Reading{}, fmt.Errorf("the API server's metrics have no %s (its etcd did not answer a status read)", storageSizeMetric)
	}
	var size float64
	for _, metric := range f.GetMetric() {
		size = max(size, metric.GetGauge().GetValue())
	}
	return quota.Reading{
		// Taken as of a metric poll interval before the scrape: some
		// releases refresh the size every --etcd-db-metric-poll-interval
		// (30 s by default) rather than at the scrape.
		At:        start.Add(-metricStaleness),
		FileBytes: int64(size), InUseBytes: int64(size), QuotaBytes: s.quotaBytes, Source: quota.SourceAPIServer,
		Assumes: fmt.Sprintf("etcd's quota is %s (--etcd-quota); no page inside the file is free; the member the API server asked is the fullest; no alarm is raised (the API server does not show them)", quota.MiB(s.quotaBytes)),
	}, nil
}

// readMetrics reads families of the API server's metrics (through Config's
// host).
func (m *Migrator) readMetrics(ctx context.Context, families ...string) (map[string]*dto.MetricFamily, error) {
	client, err := m.metricsClient("")
	if err != nil {
		return nil, err
	}
	raw, err := client.Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the API server's metrics: %w", err)
	}
	kept, err := keepFamilies(raw, families)
	if err != nil {
		return nil, err
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	parsed, err := parser.TextToMetricFamilies(kept)
	if err != nil {
		return nil, fmt.Errorf("parsing the API server's metrics: %w", err)
	}
	return parsed, nil
}

// objectBytes is the size of a rewrite whose object restow does not hold
// (a merge patch): the largest object the pass listed whole, for a CRD's;
// else the average size of target's objects as stored, from the API
// server's estimate (restow never reads a Secret's value);
// quota.MaxValueBytes, the largest etcd takes, where the API server does
// not say (before 1.34, SizeBasedListCostEstimate off, or a resource newer
// than its --etcd-count-metric-poll-period).
func (mg *migration) objectBytes(ctx context.Context) int64 {
	if largest := mg.largestBody.Load(); largest > 0 {
		// The pass lists whole objects: the largest it saw.
		return largest
	}
	mg.sizeOnce.Do(func() {
		mg.objectSize = quota.MaxValueBytes
		families, err := mg.m.readMetrics(ctx, sizeEstimateMetric, objectCountMetric)
		if err != nil {
			return
		}
		gr := mg.target.Resource.GroupResource()
		total, count := familyValue(families[sizeEstimateMetric], gr.Group, gr.Resource), familyValue(families[objectCountMetric], gr.Group, gr.Resource)
		if total > 0 && count > 0 {
			mg.objectSize = int64(total / count)
		}
	})
	return mg.objectSize
}

// familyValue is the value of f's metric for group and resource, or -1.
func familyValue(f *dto.MetricFamily, group, resource string) float64 {
	for _, metric := range f.GetMetric() {
		if label(metric, "group") == group && label(metric, "resource") == resource {
			return metric.GetGauge().GetValue()
		}
	}
	return -1
}

// spaceProbe is what a pass tells its budget through the API server: it
// lists its own resource (in its namespace, for a partial pass), which
// its rights allow.
type spaceProbe struct{ mg *migration }

// Compacted lists one object from a continue token at revision: the API
// server answers 410 Expired once etcd compacted past it.
func (p spaceProbe) Compacted(ctx context.Context, revision int64) (bool, error) {
	_, err := p.mg.client(p.mg.target.Namespace).List(ctx, metav1.ListOptions{Limit: 1, Continue: encodeContinue("\x00", revision)})
	switch {
	case apierrors.IsResourceExpired(err), apierrors.IsGone(err):
		return true, nil
	case err != nil:
		return false, err
	}
	return false, nil
}

// Revision is etcd's revision now: a one-object list's resourceVersion.
func (p spaceProbe) Revision(ctx context.Context) (int64, error) {
	list, err := p.mg.client(p.mg.target.Namespace).List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(list.ResourceVersion, 10, 64)
}

// takeSpace reserves etcd's room for a rewrite of size bytes. A budget
// that cannot make room stops the pass, Stalled; one that cannot read
// etcd's size, or look for a compaction, fails the write as transient
// (never as an answer about the object).
func (mg *migration) takeSpace(ctx context.Context, size int64) (int64, error) {
	cost, err := mg.m.space().Acquire(ctx, size, spaceProbe{mg}, mg.setWaitingForSpace)
	var stalled *quota.ErrStalled
	var unread *quota.ReadError
	switch {
	case err == nil || ctx.Err() != nil:
		return cost, err
	case errors.As(err, &stalled):
		return 0, &StalledError{Reason: stalled.Reason, Message: stalled.Message}
	case errors.As(err, &unread) && apierrors.IsForbidden(unread.Err):
		// Not knowing etcd's room, restow writes nothing.
		return 0, &StalledError{Reason: quota.ReasonUnknown, Message: "restow reads etcd's database size from the API server's metrics before it writes, and may not: grant get on the non-resource URL /metrics, or give etcd's address (--etcd-endpoints); the API server answered 403 Forbidden"}
	}
	return 0, errors.New(Message(err))
}

// spaceSpent ends a rewrite's reservation: spent at the revision the API
// server answered when it wrote anew, returned when it wrote nothing or
// refused the write, spent at an unknown revision when no answer came (it
// may have been stored).
func (mg *migration) spaceSpent(cost int64, read, written string, err error) {
	b := mg.m.space()
	var status apierrors.APIStatus
	switch {
	case err == nil && written != read:
		revision, perr := strconv.ParseInt(written, 10, 64)
		if perr != nil {
			b.SpendUnknown(cost)
			return
		}
		b.Spend(cost, revision)
	case err == nil:
		b.Release(cost)
	case errors.As(err, &status) && status.Status().Code >= 400 && status.Status().Code < 500:
		b.Release(cost)
	default:
		b.SpendUnknown(cost)
	}
}

// spaceState is a migration's view of the budget's sizes.
type spaceState struct {
	sizeOnce   sync.Once
	objectSize int64
	// largestBody is the largest object the pass listed whole.
	largestBody atomic.Int64
}

// noteSizes records the sizes of a page listed whole.
func (mg *migration) noteSizes(bodies []json.RawMessage) {
	for _, body := range bodies {
		if n := int64(len(body)); n > mg.largestBody.Load() {
			mg.largestBody.Store(n)
		}
	}
}

// SpaceEstimate is what a pass over a target would keep alive in etcd, and
// what the budget makes of it.
type SpaceEstimate struct {
	// ObjectBytes is the average object's size as the API server estimates
	// it; 0 where it does not say.
	ObjectBytes int64
	// RewriteBytes is what the pass keeps alive in all: every object's
	// cost (quota.Cost).
	RewriteBytes int64
	// BudgetBytes is what restow's rewrites may keep alive at once now.
	BudgetBytes int64
	// Compactions is how many compactions the pass waits for at least: 0
	// when it fits the budget at once.
	Compactions int64
	// Describe is the budget's own account of the reading.
	Describe string
}

// EstimateSpace reads etcd's room and the API server's size estimate of
// target's objects, and says what a pass over objects of them would spend.
func (m *Migrator) EstimateSpace(ctx context.Context, target Target, objects int64) (SpaceEstimate, error) {
	mg := &migration{m: m, target: target}
	var est SpaceEstimate
	if size := mg.objectBytes(ctx); size != quota.MaxValueBytes {
		est.ObjectBytes = size
	}
	b := m.space()
	if err := b.Read(ctx); err != nil {
		return est, err
	}
	est.RewriteBytes = objects * quota.Cost(mg.objectBytes(ctx))
	est.BudgetBytes = b.Stats().BudgetBytes
	if est.BudgetBytes > 0 && est.RewriteBytes > est.BudgetBytes {
		est.Compactions = (est.RewriteBytes+est.BudgetBytes-1)/est.BudgetBytes - 1
	}
	est.Describe = b.Describe()
	return est, nil
}
