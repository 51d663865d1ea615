package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Condition types, with kstatus semantics so that Flux, Argo CD and kstatus
// read a StorageMigration without custom code.
const (
	// ReadyCondition is True (normal polarity) when every object of the
	// resource is stored at the target version and, for a CRD with pruning on,
	// status.storedVersions lists only that version.
	ReadyCondition = "Ready"

	// ReconcilingCondition is True (abnormal polarity: present only while
	// work is under way) while a pass runs or waits for the API server.
	ReconcilingCondition = "Reconciling"

	// StalledCondition is True (abnormal polarity) when progress needs user
	// action: objects that cannot be rewritten, or an unsupported resource.
	StalledCondition = "Stalled"
)

// Condition reasons. Each is CamelCase, as the API conventions ask.
const (
	// SucceededReason (Ready=True): the last pass rewrote every object.
	SucceededReason = "Succeeded"

	// ProgressingReason (Reconciling=True, Ready=False): a pass is rewriting objects.
	ProgressingReason = "Progressing"

	// WaitingForStorageVersionReason (Reconciling=True, Ready=False): the API
	// server does not serve the new storage version yet.
	WaitingForStorageVersionReason = "WaitingForStorageVersion"

	// WaitingForEncryptionConfigReason (Reconciling=True, Ready=False): for
	// a resource re-encrypted after key rotations, restow does not know
	// which encryption configuration every API server loaded (they
	// disagree, or some cannot be read), and nothing else needs a pass.
	WaitingForEncryptionConfigReason = "WaitingForEncryptionConfig"

	// BaselineUnprovenReason (Ready=True): a built-in resource's baseline
	// was recorded while restow could not read every API server
	// (status.baseline.unproven), so it does not know that every object is
	// stored at it. Nothing is under way and nothing failed: kstatus reads
	// it as Current, and no shipped alert fires for it (the
	// restow_baseline_unproven metric shows it). A pass replaces it once
	// restow reads every API server; on a managed control plane, where it
	// never does, kubectl restow migrate runs that pass.
	BaselineUnprovenReason = "BaselineUnproven"

	// WaitingForAllAPIServersReason (Reconciling=True, Ready=False): the
	// storage version of a built-in resource moved, and restow cannot read
	// every API server's own discovery (several behind one address, as on a
	// managed control plane), so it does not re-store by itself: nothing
	// would show that every server stores at the new version. It is
	// expected there, not a failure; kubectl restow migrate re-stores by
	// hand once the upgrade is done on every server.
	WaitingForAllAPIServersReason = "WaitingForAllAPIServers"

	// SettlingReason (Reconciling=True, Ready=False): every object was
	// rewritten; the pass waits for the settle window to end, then rewrites
	// again what others wrote within it, before it prunes.
	SettlingReason = "Settling"

	// TransientErrorReason (Reconciling=True, Ready=False): the API server or a
	// conversion webhook is failing transiently; the pass retries with backoff.
	TransientErrorReason = "TransientError"

	// ObjectsFailedReason (Stalled=True, Ready=False): some objects could not
	// be rewritten (admission denial, invalid object); see status.failedObjects.
	ObjectsFailedReason = "ObjectsFailed"

	// UnsupportedReason (Stalled=True, Ready=False): the resource cannot be
	// listed or patched, or does not exist.
	UnsupportedReason = "Unsupported"

	// APIServerLaggingReason (Stalled=True, Ready=False): an API server that
	// restow reaches still stored at the old version --apiserver-lag-limit
	// after the switch; nothing was rewritten or pruned, and the migration
	// is retried with backoff.
	APIServerLaggingReason = "APIServerLagging"

	// WaitingForEtcdSpaceReason (Reconciling=True, Ready=False): the pass's
	// rewrites keep as many bytes alive in etcd as its budget allows until
	// a compaction; it waits for one before it writes more.
	WaitingForEtcdSpaceReason = "WaitingForEtcdSpace"

	// EtcdAlarmReason (Stalled=True, Ready=False): an etcd member reports
	// an alarm (NOSPACE: etcd refuses every write); restow writes nothing
	// until it is disarmed, and tries again at --stalled-retry-base.
	EtcdAlarmReason = "EtcdAlarm"

	// EtcdQuotaReason (Stalled=True, Ready=False): not one more object fits
	// under etcd's quota with restow's margin; restow stopped before etcd
	// would raise its NOSPACE alarm, and tries again at
	// --stalled-retry-base.
	EtcdQuotaReason = "EtcdQuota"

	// EtcdNotCompactingReason (Stalled=True, Ready=False): restow's rewrites
	// spent its budget and no compaction passed them within the bound; it
	// tries again at --stalled-retry-base.
	EtcdNotCompactingReason = "EtcdNotCompacting"

	// EtcdSpaceUnknownReason (Stalled=True, Ready=False): restow may not
	// read etcd's database size where it looks (the API server's /metrics),
	// so it writes nothing; it tries again at --stalled-retry-base.
	EtcdSpaceUnknownReason = "EtcdSpaceUnknown"

	// StatusRefusedReason (Stalled=True, Ready=False): the API server refused
	// to store the status a pass wrote (an admission policy or webhook on
	// StorageMigrations, a status that does not validate); the pass cannot
	// record its progress, so it is retried with backoff.
	StatusRefusedReason = "StatusRefused"
)

// ReadyAt reports whether sm is Ready for its current spec (observed at its
// generation) and its last pass brought every object to version: what
// kubectl restow, make demo and the tests wait for.
func (sm *StorageMigration) ReadyAt(version string) bool {
	ready := meta.FindStatusCondition(sm.Status.Conditions, ReadyCondition)
	return ready != nil && ready.Status == metav1.ConditionTrue &&
		sm.Status.ObservedGeneration == sm.Generation &&
		sm.Status.LastPass != nil && sm.Status.LastPass.TargetVersion == version
}

// Done is how many objects the pass is done with, whatever the outcome.
func (c ObjectCounts) Done() int64 {
	return c.Migrated + c.AlreadyStored + c.Skipped + c.Failed
}
