package controllers

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/migrator/quota"
	"github.com/restow/restow/internal/version"
)

// Metrics on the manager's metrics endpoint. The resource label is
// resource.group, as kubectl writes it.
var (
	objectsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "restow_objects_total",
		Help: "Objects handled by migration passes, by outcome: migrated (re-encoded at the target version), already_stored (the rewrite wrote nothing), skipped (changed or deleted by others since listed), failed.",
	}, []string{"resource", "outcome"})
	remainingObjects = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "restow_remaining_objects",
		Help: "The API server's estimate of objects not yet listed by the pass under way (0 when none runs or no estimate is given).",
	}, []string{"resource"})
	passConcurrency = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "restow_pass_concurrency",
		Help: "The pace of the pass under way: how many rewrites it may have in flight now, below --concurrency or spec.concurrency (0 when none runs).",
	}, []string{"resource"})
	passesRunning = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "restow_passes_running",
		Help: "Passes that list and rewrite now, over every resource: at most --max-concurrent-passes; the others wait for one to end.",
	})
	passesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "restow_passes_total",
		Help: "Migration passes that ended, by result: succeeded, stalled, transient (paused, resumes later), restarted (the CRD or spec changed).",
	}, []string{"resource", "result"})
	passDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "restow_pass_duration_seconds",
		Help:    "Wall time of migration passes that succeeded, from start (including resumed parts) to end.",
		Buckets: prometheus.ExponentialBuckets(0.5, 2, 14), // 0.5 s to about 2 h
	}, []string{"resource"})
	storedVersionsPrunes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "restow_storedversions_prunes_total",
		Help: "Times status.storedVersions of a CRD was pruned.",
	}, []string{"resource"})
	migrationStalled = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "restow_migration_stalled",
		Help: "1 while a StorageMigration's Stalled condition is True (a pass that ended Stalled, or a resource found before any pass that cannot be migrated as asked), else 0.",
	}, []string{"storagemigration", "resource"})
	baselineUnprovenGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "restow_baseline_unproven",
		Help: "1 while a StorageMigration's baseline was recorded when restow could not read every API server (status.baseline.unproven): restow does not know that every object is stored at it. A pass replaces it once every API server can be read, or on kubectl restow migrate. No shipped alert fires on it.",
	}, []string{"storagemigration", "resource"})
	etcdBytesAlive = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "restow_etcd_bytes_alive",
		Help: "Bytes restow's rewrites keep alive in etcd until a compaction passes them (the value each replaced), over every pass of this manager.",
	})
	etcdBudgetBytes = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "restow_etcd_budget_bytes",
		Help: "How many bytes restow's rewrites may keep alive at once: --etcd-write-budget, or half of etcd's room under its quota at the last reading (0 before the first).",
	})
	etcdDatabaseBytes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "restow_etcd_database_bytes",
		Help: "etcd's database as restow last read it, by kind: file (the fullest member's file), in_use (the bytes in use in it; the file where restow reads the API server's metrics), quota (the smallest member quota, or --etcd-quota).",
	}, []string{"kind"})
	etcdSpaceWaits = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "restow_etcd_space_waits_total",
		Help: "Times a pass waited for etcd to compact past restow's rewrites before it wrote more: 0 where the byte budget never binds.",
	})
	etcdCompactionsSeen = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "restow_etcd_compactions_seen_total",
		Help: "Compactions restow saw pass its rewrites while it waited for room (each frees the values its rewrites replaced).",
	})
	etcdSpaceReadings = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "restow_etcd_space_readings_total",
		Help: "Reads of etcd's database size (one Status per member and the alarm list with --etcd-endpoints; else one read of the API server's metrics).",
	})
	etcdWritesBlocked = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "restow_etcd_writes_blocked",
		Help: "1 while restow writes nothing for etcd's sake, by reason: EtcdAlarm (a member reports an alarm), EtcdQuota (not one more object fits), EtcdNotCompacting (no compaction passed its rewrites in time), EtcdSpaceUnknown (it may not read etcd's size).",
	}, []string{"reason"})
	buildInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "restow_build_info",
		Help: "Always 1; its labels tell the running manager's version, source revision and Go version.",
	}, []string{"version", "revision", "goversion"})
)

func init() {
	info := version.Get()
	buildInfo.WithLabelValues(info.Version, info.GitCommit, info.GoVersion).Set(1)
	metrics.Registry.MustRegister(objectsTotal, remainingObjects, passConcurrency, passesRunning, passesTotal, passDuration, storedVersionsPrunes, migrationStalled, baselineUnprovenGauge, buildInfo,
		etcdBytesAlive, etcdBudgetBytes, etcdDatabaseBytes, etcdSpaceWaits, etcdCompactionsSeen, etcdSpaceReadings, etcdWritesBlocked)
}

// runEnd is the end of a run, as the metrics count it.
type runEnd struct {
	resource string
	// result labels restow_passes_total: succeeded, stalled, transient, restarted.
	result string
	// succeeded says the run reached its end without failures: its
	// duration is observed, and its prune counted.
	succeeded bool
	duration  time.Duration
	pruned    bool
}

// countRunEnd counts the end of a run of a StorageMigration; nil counts nothing.
func countRunEnd(e *runEnd) {
	if e == nil {
		return
	}
	passesTotal.WithLabelValues(e.resource, e.result).Inc()
	if !e.succeeded {
		return
	}
	if e.pruned {
		storedVersionsPrunes.WithLabelValues(e.resource).Inc()
	}
	passDuration.WithLabelValues(e.resource).Observe(e.duration.Seconds())
}

// countObjects adds what a run did since the counts last reported.
func countObjects(resource string, last, now migrator.Counts) {
	objectsTotal.WithLabelValues(resource, "migrated").Add(float64(max(now.Migrated-last.Migrated, 0)))
	objectsTotal.WithLabelValues(resource, "already_stored").Add(float64(max(now.AlreadyStored-last.AlreadyStored, 0)))
	objectsTotal.WithLabelValues(resource, "skipped").Add(float64(max(now.Skipped-last.Skipped, 0)))
	objectsTotal.WithLabelValues(resource, "failed").Add(float64(max(now.Failed-last.Failed, 0)))
}

// setRunning sets the gauges of the run under way; progress nil means none runs.
func setRunning(resource string, progress *migrator.Progress) {
	remaining, pace := 0.0, 0.0
	if progress != nil {
		if progress.RemainingEstimate != nil {
			remaining = float64(*progress.RemainingEstimate)
		}
		pace = float64(progress.Concurrency)
	}
	remainingObjects.WithLabelValues(resource).Set(remaining)
	passConcurrency.WithLabelValues(resource).Set(pace)
}

// recordGauges sets restow_migration_stalled of sm from the condition out
// writes, and restow_baseline_unproven from its status.
func recordGauges(sm *migrationv1alpha1.StorageMigration, out outcome) {
	stalled, unproven := 0.0, 0.0
	if out.condition == conditionStalled {
		stalled = 1
	}
	if sm.Status.Baseline != nil && sm.Status.Baseline.Unproven != "" {
		unproven = 1
	}
	resource := schema.GroupResource{Group: sm.Spec.Resource.Group, Resource: sm.Spec.Resource.Resource}.String()
	migrationStalled.WithLabelValues(sm.Name, resource).Set(stalled)
	baselineUnprovenGauge.WithLabelValues(sm.Name, resource).Set(unproven)
}

// forgetGauges drops the gauges of a StorageMigration that is gone, so that
// no alert fires for it.
func forgetGauges(name string) {
	migrationStalled.DeletePartialMatch(prometheus.Labels{"storagemigration": name})
	baselineUnprovenGauge.DeletePartialMatch(prometheus.Labels{"storagemigration": name})
}

// spaceRecorder sets the etcd space metrics from the Migrator's budget
// (package quota), whenever its stats change.
func spaceRecorder() func(quota.Stats) {
	// The budget delivers its stats in order, one at a time.
	var last quota.Stats
	return func(s quota.Stats) {
		etcdBytesAlive.Set(float64(s.AliveBytes))
		etcdBudgetBytes.Set(float64(s.BudgetBytes))
		etcdDatabaseBytes.WithLabelValues("file").Set(float64(s.Last.FileBytes))
		etcdDatabaseBytes.WithLabelValues("in_use").Set(float64(s.Last.InUseBytes))
		etcdDatabaseBytes.WithLabelValues("quota").Set(float64(s.Last.QuotaBytes))
		etcdSpaceWaits.Add(float64(max(s.Waits-last.Waits, 0)))
		etcdSpaceReadings.Add(float64(max(s.Readings-last.Readings, 0)))
		etcdCompactionsSeen.Add(float64(max(s.Compactions-last.Compactions, 0)))
		for _, reason := range []string{quota.ReasonAlarm, quota.ReasonQuota, quota.ReasonNotCompacting, quota.ReasonUnknown} {
			blocked := 0.0
			if s.Blocked == reason {
				blocked = 1
			}
			etcdWritesBlocked.WithLabelValues(reason).Set(blocked)
		}
		last = s
	}
}
