package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ReRunAnnotation requests a new pass when its value changes, in the manner of
// Flux's reconcile.fluxcd.io/requestedAt. Its value is an opaque token (a
// timestamp is customary); the last token handled is echoed in
// status.lastHandledReRunToken.
const ReRunAnnotation = "migration.restow.dev/requested-at"

// AutomaticLabel marks, when set to "true", a StorageMigration that restow
// created by itself for a CRD whose status.storedVersions listed more than its
// storage version. Such a StorageMigration is named after the CRD and owned
// by it.
const AutomaticLabel = "migration.restow.dev/automatic"

// BuiltInLabel marks, beside AutomaticLabel, a StorageMigration that restow
// created by itself for a built-in resource (served by kube-apiserver
// itself): it is named after the resource, owned by nothing, and skips its
// first pass (spec.firstPass: Skip).
const BuiltInLabel = "migration.restow.dev/built-in"

// FirstSeenHashAnnotation is set by restow on the StorageMigration it
// creates for a built-in resource: the storageVersionHash every API server
// published when restow first saw the resource. The baseline is the
// version of that hash, however late it is recorded: when the API servers
// store at another version by then (an upgrade in between), the objects
// are re-stored rather than taken to be stored at the new one.
const FirstSeenHashAnnotation = "migration.restow.dev/first-seen-storage-version-hash"

// AutoMigrateAnnotation on a CRD, set to "false", opts the CRD out of
// automatic migration: restow creates no StorageMigration for it by itself.
// A StorageMigration made by hand still runs.
const AutoMigrateAnnotation = "migration.restow.dev/auto-migrate"

// StorageMigrationSpec says which resource to keep fully stored at its
// current storage version, and how to rewrite it.
// +kubebuilder:validation:XValidation:rule="self.resource == oldSelf.resource",message="spec.resource is immutable"
type StorageMigrationSpec struct {
	// resource is the group and plural resource name whose objects are rewritten.
	// It is immutable: to migrate another resource, create another StorageMigration.
	// +required
	Resource GroupResource `json:"resource"`

	// pruneStoredVersions, when true, trims the CRD's status.storedVersions to
	// the storage version after a pass that rewrote every object without failure.
	// It has no effect for resources that are not served from a CRD.
	// +kubebuilder:default=true
	// +optional
	PruneStoredVersions *bool `json:"pruneStoredVersions,omitempty"`

	// rewriteViaStatus, when true, rewrites objects through the /status
	// subresource, which steps around admission webhooks and policies that
	// match only the main resource. The resource must have a status subresource.
	// +kubebuilder:default=false
	// +optional
	RewriteViaStatus *bool `json:"rewriteViaStatus,omitempty"`

	// concurrency is the most objects rewritten in parallel: the pass paces
	// itself below it, to what the API server can take. When unset the
	// operator's --concurrency flag applies.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024
	// +optional
	Concurrency *int32 `json:"concurrency,omitempty"`

	// pageSize is the number of objects listed per page. When unset the
	// operator's --page-size flag applies.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +optional
	PageSize *int32 `json:"pageSize,omitempty"`

	// firstPass says what happens before the first pass: Run (the default)
	// rewrites every object at once; Skip, for a resource not served from
	// a CRD, records the storage version the API servers store at now as
	// status.baseline and rewrites nothing until it moves (after a
	// control-plane upgrade); it has no effect for a CRD's resource.
	// restow's automatic migration of built-in resources creates its
	// StorageMigrations with Skip.
	// +kubebuilder:default=Run
	// +optional
	FirstPass FirstPass `json:"firstPass,omitempty"`
}

// GroupResource names a resource by API group and plural resource name.
type GroupResource struct {
	// group is the API group of the resource; empty for the core group.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == '' || !format.dns1123Subdomain().validate(self).hasValue()",message="group must be empty or a DNS subdomain"
	// +optional
	Group string `json:"group"`

	// resource is the plural, lower-case resource name, such as "crontabs".
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="!format.dns1123Label().validate(self).hasValue()",message="resource must be a DNS label: lower-case letters, digits and '-'"
	// +required
	Resource string `json:"resource"`
}

// String returns resource.group, the form kubectl uses.
func (gr GroupResource) String() string {
	if gr.Group == "" {
		return gr.Resource
	}
	return gr.Resource + "." + gr.Group
}

// StorageMigrationStatus is the observed state of a StorageMigration.
type StorageMigrationStatus struct {
	// observedGeneration is the metadata.generation the status was computed for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions are Ready, Reconciling and Stalled, with kstatus semantics.
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// targetVersion is the storage version the current or last pass rewrites to.
	// +kubebuilder:validation:MaxLength=63
	// +optional
	TargetVersion string `json:"targetVersion,omitempty"`

	// progress is the progress of the pass under way, absent when none is.
	// +optional
	Progress *PassProgress `json:"progress,omitempty"`

	// progressSummary is how far the pass under way, or else the last pass,
	// got: objects done of objects to visit, such as "1500/~3000" (the
	// total is the API server's estimate while the list is not over) or
	// "3000/3000". Shown by kubectl get -o wide.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	ProgressSummary string `json:"progressSummary,omitempty"`

	// lastPass summarises the last pass that finished.
	// +optional
	LastPass *PassSummary `json:"lastPass,omitempty"`

	// failedObjects lists up to 10 objects the last pass could not rewrite.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=10
	// +optional
	FailedObjects []FailedObject `json:"failedObjects,omitempty"`

	// storageVersionMigrations lists up to 10 standard StorageVersionMigrations
	// (storagemigration.k8s.io) of the same resource, oldest first: another
	// migrator (the in-tree controller of kube-controller-manager, or restow
	// when it serves them) may be migrating the resource and pruning its
	// CRD's status.storedVersions. Absent when the cluster serves no such API
	// or none targets the resource.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=10
	// +optional
	StorageVersionMigrations []StandardMigration `json:"storageVersionMigrations,omitempty"`

	// baseline is, for a StorageMigration whose spec.firstPass is Skip and
	// that has run no pass yet, the storage version the API servers stored
	// the resource at when restow first saw it: its objects are taken to be
	// stored there, and a pass runs once the storage version moves from it.
	// +optional
	Baseline *StorageBaseline `json:"baseline,omitempty"`

	// encryption is, for a resource the operator re-encrypts after an
	// encryption key rotation (--reencrypt-resources), the encryption state
	// every API server reported when restow last re-encrypted every object
	// (recordedBy: Pass), or when it first saw the resource (recordedBy:
	// Baseline, nothing rewritten). A pass runs once every API server
	// reports another state.
	// +optional
	Encryption *EncryptionRecord `json:"encryption,omitempty"`

	// lastHandledReRunToken is the value of the re-run annotation handled last:
	// it is recorded when a pass starts for it, or when the migration stalls
	// before a pass could start. A client that set the annotation waits for
	// this echo, then for Ready or Stalled. A request made while a pass runs
	// starts another pass once that one ends.
	// +kubebuilder:validation:MaxLength=256
	// +optional
	LastHandledReRunToken string `json:"lastHandledReRunToken,omitempty"`
}

// EncryptionState is what the API servers encrypt a resource's writes with,
// by their own metrics.
type EncryptionState struct {
	// configHash is the hash of the encryption configuration file every API
	// server loaded ("sha256:" and the file's SHA-256 in hex, as
	// apiserver_encryption_config_controller_last_config_info shows it);
	// empty when they run without one.
	// +kubebuilder:validation:MaxLength=80
	// +optional
	ConfigHash string `json:"configHash,omitempty"`

	// kmsKeyIDHashes are, for each KMS v2 provider, "provider=hash" of the
	// key ID its plugin reported last
	// (apiserver_envelope_encryption_key_id_hash_status_last_timestamp_seconds),
	// sorted.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=320
	// +optional
	KMSKeyIDHashes []string `json:"kmsKeyIDHashes,omitempty"`

	// servers are, in a pass's progress, each API server's epoch when the
	// pass began: a re-encryption holds only if every server kept its epoch
	// (no restart, no reload of its encryption configuration, no other KMS
	// v2 key ID reported) to the pass's end, across resumes too.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Servers []EncryptionServerEpoch `json:"servers,omitempty"`
}

// EncryptionServerEpoch is one API server's life as its metrics showed it.
type EncryptionServerEpoch struct {
	// address is the server's own address (host:port); empty for the one
	// API server restow reaches through its client configuration.
	// +kubebuilder:validation:MaxLength=256
	// +optional
	Address string `json:"address,omitempty"`

	// processStartMillis is the server's process_start_time_seconds, in
	// milliseconds.
	// +optional
	ProcessStartMillis int64 `json:"processStartMillis,omitempty"`

	// reloads counts the server's successful automatic reloads of its
	// encryption configuration
	// (apiserver_encryption_config_controller_automatic_reloads_total).
	// +optional
	Reloads int64 `json:"reloads,omitempty"`

	// kmsStampedByMillis is the latest time, by the server's clock, at which
	// it recorded a KMS v2 key ID its plugin reported.
	// +optional
	KMSStampedByMillis int64 `json:"kmsStampedByMillis,omitempty"`
}

// EncryptionRecordSource says how an encryption state was recorded.
// +kubebuilder:validation:Enum=Baseline;Pass;Moved
type EncryptionRecordSource string

const (
	// EncryptionRecordedByBaseline means: recorded at first sight, nothing
	// rewritten.
	EncryptionRecordedByBaseline EncryptionRecordSource = "Baseline"
	// EncryptionRecordedByPass means: a pass rewrote every object while every
	// API server reported this state, from its start to its end.
	EncryptionRecordedByPass EncryptionRecordSource = "Pass"
	// EncryptionRecordedByMoved means: the last pass began under this state, and
	// the API servers reported another, or could not be read, when it
	// ended: its objects are under no one state known, and the next pass
	// runs once every server reports one.
	EncryptionRecordedByMoved EncryptionRecordSource = "Moved"
)

// EncryptionRecord is the encryption state a resource's objects were last
// written under, and how restow knows.
type EncryptionRecord struct {
	EncryptionState `json:",inline"`

	// recordedBy says whether a pass re-encrypted every object under this
	// state (Pass), restow recorded it at first sight (Baseline), or the
	// last pass began under it and ended under another (Moved).
	// +required
	RecordedBy EncryptionRecordSource `json:"recordedBy"`

	// recordedAt is when restow recorded it.
	// +required
	RecordedAt metav1.Time `json:"recordedAt"`
}

// StorageBaseline is the storage version restow found a resource at before
// any pass: see StorageMigrationSpec.FirstPass.
type StorageBaseline struct {
	// storageVersion is the version storageVersionHash names, if restow
	// knows it.
	// +kubebuilder:validation:MaxLength=63
	// +optional
	StorageVersion string `json:"storageVersion,omitempty"`

	// storageVersionHash is the storageVersionHash discovery published.
	// +kubebuilder:validation:MaxLength=64
	// +required
	StorageVersionHash string `json:"storageVersionHash"`

	// recordedAt is when restow recorded it.
	// +required
	RecordedAt metav1.Time `json:"recordedAt"`

	// unproven says why restow does not take every object to be stored at
	// this baseline: it could not read every API server when it first saw
	// the resource, so a server not yet upgraded, and objects it wrote, may
	// store another version. A pass that rewrites every object replaces it
	// once restow reads every API server, or when a re-run is requested
	// (kubectl restow migrate). Empty for a baseline every API server
	// showed.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Unproven string `json:"unproven,omitempty"`
}

// FirstPass says what a new StorageMigration does before it has run a pass.
// +kubebuilder:validation:Enum=Run;Skip
type FirstPass string

const (
	// FirstPassRun rewrites every object at once.
	FirstPassRun FirstPass = "Run"
	// FirstPassSkip records the storage version the API servers store at
	// now as status.baseline, takes every object to be stored at it, and
	// runs a first pass only once the storage version moves from it. It
	// has no effect for a resource served from a CRD, whose
	// status.storedVersions says what is stored.
	FirstPassSkip FirstPass = "Skip"
)

// StandardMigration is a standard StorageVersionMigration of a resource.
type StandardMigration struct {
	// name is the StorageVersionMigration's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Name string `json:"name"`
	// state is Pending (no controller has started it), Running, Succeeded
	// or Failed, from its conditions.
	// +kubebuilder:validation:Enum=Pending;Running;Succeeded;Failed
	// +required
	State string `json:"state"`
}

// ObjectCounts counts the objects of one pass by outcome.
type ObjectCounts struct {
	// listed is the number of objects listed so far.
	// +optional
	Listed int64 `json:"listed"`
	// migrated is the number of objects re-encoded at the target version:
	// the API server stored them anew.
	// +optional
	Migrated int64 `json:"migrated"`
	// alreadyStored is the number of objects that were stored at the target
	// version already: the API server accepted their rewrite and wrote
	// nothing (their resourceVersion did not change).
	// +optional
	AlreadyStored int64 `json:"alreadyStored,omitempty"`
	// skipped is the number of objects changed or deleted by someone else after
	// they were listed; any such write already stored them at the new version.
	// +optional
	Skipped int64 `json:"skipped"`
	// failed is the number of objects that could not be rewritten.
	// +optional
	Failed int64 `json:"failed"`
	// rechecked is the number of objects written by someone else between the
	// storage switch and the end of the settle window, which the pass
	// rewrote again after the window before pruning.
	// +optional
	Rechecked int64 `json:"rechecked,omitempty"`
}

// PassPhase is where a pass stands.
// +kubebuilder:validation:Enum=Rewriting;Settling;Rechecking
type PassPhase string

const (
	// PassRewriting means the pass lists and rewrites every object.
	PassRewriting PassPhase = "Rewriting"
	// PassSettling means every object was rewritten; the pass waits for the settle
	// window, so that no write that began on the old storage can still commit.
	PassSettling PassPhase = "Settling"
	// PassRechecking means the settle window is over; the pass rewrites again the
	// objects others wrote within it.
	PassRechecking PassPhase = "Rechecking"
)

// PassProgress is the progress of a pass under way.
type PassProgress struct {
	ObjectCounts `json:",inline"`

	// startTime is when the pass started.
	// +required
	StartTime metav1.Time `json:"startTime"`

	// remainingEstimate is the API server's estimate of the objects not yet
	// listed (the list's remainingItemCount), absent when it gave none.
	// +optional
	RemainingEstimate *int64 `json:"remainingEstimate,omitempty"`

	// continueToken resumes the list after the last page fully rewritten, so a
	// restarted operator continues the pass instead of starting over.
	// +kubebuilder:validation:MaxLength=4096
	// +optional
	ContinueToken string `json:"continueToken,omitempty"`

	// phase is where the pass stands: Rewriting, Settling or Rechecking.
	// +optional
	Phase PassPhase `json:"phase,omitempty"`

	// lagWait is how long after startTime the pass waited before its first
	// page, so that every API server stores at the target version. With
	// several API servers (or an unknown number): until each showed the
	// target in its own discovery, plus a second (allAPIServersSwitched is
	// then true), or else the operator's --apiserver-lag-bound; absent with
	// one (its first page comes a second after the switch). The settle
	// window counts from startTime plus lagWait. A pass resumes only from
	// progress that waited at least as long as it would, or saw every API
	// server switch.
	// +optional
	LagWait *metav1.Duration `json:"lagWait,omitempty"`

	// allAPIServersSwitched is true once every API server counted showed
	// the target version in its own discovery (its storageVersionHash),
	// read at its own address, before the first page.
	// +optional
	AllAPIServersSwitched bool `json:"allAPIServersSwitched,omitempty"`

	// switchedBy is startTime plus lagWait: when every API server stores at
	// the target version, as each server's discovery showed or by the lag
	// bound. The first page is listed then (a second after startTime at the
	// earliest).
	// +optional
	SwitchedBy *metav1.Time `json:"switchedBy,omitempty"`

	// settleUntil is when the settle window of the pass ends: writes that
	// began on the old storage before the switch may commit until then.
	// +optional
	SettleUntil *metav1.Time `json:"settleUntil,omitempty"`

	// crdUID and crdGeneration identify the CRD the pass started on. A pass
	// resumes only on the same CRD at the same generation; otherwise it
	// starts over from the first page.
	// +kubebuilder:validation:MaxLength=128
	// +optional
	CRDUID string `json:"crdUID,omitempty"`
	// crdGeneration is the CRD's metadata.generation when the pass started
	// (see crdUID).
	// +optional
	CRDGeneration int64 `json:"crdGeneration,omitempty"`

	// storageVersionHash is, for a resource not served from a CRD, the
	// storageVersionHash the pass started under: it resumes only under the
	// same one, since the objects done before were written at it.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	StorageVersionHash string `json:"storageVersionHash,omitempty"`

	// encryption is, for a resource re-encrypted after a key rotation, the
	// encryption state every API server reported when the pass began: an
	// interrupted pass resumes only under the same one.
	// +optional
	Encryption *EncryptionState `json:"encryption,omitempty"`

	// listResourceVersion is the resourceVersion of the pass's list snapshot:
	// an object not written since was rewritten by the pass itself.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	ListResourceVersion string `json:"listResourceVersion,omitempty"`

	// windowEndResourceVersion is a resourceVersion read once the settle
	// window was over: every write that began on the old storage is at or
	// below it, and a write above it was made on the new storage.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	WindowEndResourceVersion string `json:"windowEndResourceVersion,omitempty"`
}

// PassSummary summarises a finished pass.
type PassSummary struct {
	ObjectCounts `json:",inline"`

	// startTime is when the pass started.
	// +required
	StartTime metav1.Time `json:"startTime"`

	// completionTime is when the pass ended.
	// +required
	CompletionTime metav1.Time `json:"completionTime"`

	// settled is true when the pass waited out the settle window and
	// rewrote again what others wrote within it: only then is every object
	// known to be stored at targetVersion, rather than rewritten to it.
	// +optional
	Settled bool `json:"settled,omitempty"`

	// targetVersion is the storage version the pass rewrote to.
	// +kubebuilder:validation:MaxLength=63
	// +optional
	TargetVersion string `json:"targetVersion,omitempty"`

	// storageVersionHash is, for a resource not served from a CRD, the
	// storageVersionHash the API servers' discovery published for it when
	// the pass began: the version its objects are stored at since. A pass
	// runs again when discovery publishes another.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	StorageVersionHash string `json:"storageVersionHash,omitempty"`

	// servedVersions are the versions the CRD served when the pass began.
	// When one of them stops being served, a new pass re-points managedFields
	// entries that name it, so that server-side apply keeps working once the
	// version is removed from the CRD.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=63
	// +optional
	ServedVersions []string `json:"servedVersions,omitempty"`

	// prunedVersions are the versions removed from the CRD's
	// status.storedVersions after the pass.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=63
	// +optional
	PrunedVersions []string `json:"prunedVersions,omitempty"`
}

// FailedObject names an object a pass could not rewrite, and why.
type FailedObject struct {
	// namespace of the object; empty for cluster-scoped resources.
	// +kubebuilder:validation:MaxLength=63
	// +optional
	Namespace string `json:"namespace,omitempty"`
	// name of the object.
	// +kubebuilder:validation:MaxLength=253
	// +required
	Name string `json:"name"`
	// reason is a short, CamelCase reason, such as Forbidden or Invalid: the
	// API server's, or, when a webhook answered a longer text, the one of
	// the answer's HTTP code.
	// +kubebuilder:validation:MaxLength=64
	// +required
	Reason string `json:"reason"`
	// message is the API server's answer, cut to 300 bytes. The values
	// that field errors quote ("Invalid value: ...") are withheld, so it
	// holds no object contents of the API server's making; an admission
	// webhook's or policy's own words are kept as they are.
	// +kubebuilder:validation:MaxLength=512
	// +optional
	Message string `json:"message,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=smig,categories=restow
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].message`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Resource",type=string,JSONPath=`.spec.resource.resource`,priority=1
// +kubebuilder:printcolumn:name="Group",type=string,JSONPath=`.spec.resource.group`,priority=1
// +kubebuilder:printcolumn:name="Target",type=string,JSONPath=`.status.targetVersion`,priority=1
// +kubebuilder:printcolumn:name="Progress",type=string,JSONPath=`.status.progressSummary`,priority=1
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1

// StorageMigration keeps one resource fully stored at its current storage
// version: it rewrites every object of the resource and, for a CRD, prunes
// status.storedVersions to the storage version. It is level-based: it runs
// again whenever that stops holding.
type StorageMigration struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec says which resource to migrate and how.
	// +required
	Spec StorageMigrationSpec `json:"spec"`

	// status is the observed state of the migration.
	// +optional
	Status StorageMigrationStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// StorageMigrationList is a list of StorageMigrations.
type StorageMigrationList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []StorageMigration `json:"items"`
}
