package migrator

import (
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
)

// The public vocabulary of the engine: the options of a migration, its
// checkpoint, the progress it reports and the result it returns.

// Defaults for a migration.
const (
	// DefaultConcurrency is the upper bound of a pass's pace: it finds the
	// pace the API server can take below it (package pace).
	DefaultConcurrency = 256
	DefaultPageSize    = 500
	// DefaultSettleWindow is twice kube-apiserver's default --request-timeout
	// of 60 s: the API server tears a CRD's old storage down at the latest
	// that long after a switch, once requests that began on it have ended.
	DefaultSettleWindow = 2 * time.Minute
	// maxFailedObjects bounds the failures a pass keeps, as the API does.
	maxFailedObjects = 10
	// maxChangedRetries bounds how often one object is re-read and patched
	// again because others keep changing it while its managedFields need
	// re-pointing.
	maxChangedRetries = 5
)

// DefaultRetryBackoff spaces the attempts at one request after transient
// errors: 8 attempts, 250 ms apart at first and doubling, about 32 seconds in
// all (up to 20% more with jitter), before the object counts as failing. No
// cap: wait.Backoff ends the steps early once a delay reaches its cap.
var DefaultRetryBackoff = wait.Backoff{Duration: 250 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 8}

// Counts counts objects by fate.
type Counts struct {
	// Listed objects, in the first pass.
	Listed int64
	// Migrated objects were re-encoded at the target version: the API
	// server accepted the rewrite and stored the object anew.
	Migrated int64
	// AlreadyStored objects were stored at the target version already: the
	// API server accepted the rewrite and wrote nothing (the resourceVersion
	// it answered with is the one listed).
	AlreadyStored int64
	// Skipped objects: deleted, or changed by someone else, since listed.
	Skipped int64
	// Failed objects could not be rewritten.
	Failed int64
	// Rechecked objects were written by someone else within the settle
	// window and rewritten again after it.
	Rechecked int64
}

// Done is how many objects the first pass is done with.
func (c Counts) Done() int64 { return c.Migrated + c.AlreadyStored + c.Skipped + c.Failed }

// Failure is an object the pass could not rewrite.
type Failure struct {
	Namespace, Name string
	// Reason is the API server's CamelCase reason, such as Forbidden.
	Reason  string
	Message string
}

// Phase is where a migration stands.
type Phase string

// The phases of a migration.
const (
	// PhaseRewriting means the first pass lists and rewrites every object.
	PhaseRewriting Phase = "Rewriting"
	// PhaseSettling means every object was rewritten; the migration waits for
	// the settle window to end.
	PhaseSettling Phase = "Settling"
	// PhaseRechecking means the window is over; what others wrote within it is
	// rewritten again.
	PhaseRechecking Phase = "Rechecking"
)

// Options tune a migration.
type Options struct {
	// Concurrency is the most rewrites a pass has in flight at once. The
	// pass paces itself below it, to what the API server can take.
	Concurrency int
	// FixedConcurrency keeps Concurrency rewrites in flight, without
	// pacing: for measurements.
	FixedConcurrency bool
	PageSize         int64
	// ViaStatus rewrites through the /status subresource.
	ViaStatus bool
	// RetryBackoff spaces retries of transient errors; zero means DefaultRetryBackoff.
	RetryBackoff wait.Backoff
	// SettleWindow is how long after every API server switched (StartTime
	// plus the target's LagWait) a write that began on the old storage may
	// still commit: the prune waits for it. Zero means DefaultSettleWindow;
	// see docs/architecture.md.
	SettleWindow time.Duration
	// Prune trims the CRD's status.storedVersions at the end.
	Prune bool
	// Resume continues a migration from the Checkpoint of its last Progress.
	// It is ignored, and the migration starts over, unless it was taken on
	// the same CRD (UID) at the same generation and target version.
	Resume *Checkpoint
	// Continue starts FirstPass after the page that ended with this token.
	Continue string
}

// Checkpoint is what a migration needs to resume: the caller saves it from
// each Progress (the operator in status.progress) and passes it back in
// Options.Resume.
type Checkpoint struct {
	Phase Phase
	// StartTime is when the migration began, just after it saw the API
	// server store at the target version.
	StartTime time.Time
	// LagWait is how long after StartTime the first pass waited for every
	// API server to store at the target version (lag.go); zero with one API
	// server. The settle window counts from StartTime + LagWait.
	LagWait time.Duration
	// AllSwitched says that every API server restow counted showed the
	// target version in its own discovery by StartTime + LagWait
	// (switch.go), so that LagWait may be shorter than the lag bound.
	AllSwitched bool
	// TargetVersion, CRDUID and CRDGeneration bind the checkpoint to the
	// CRD the migration began on.
	TargetVersion string
	CRDUID        types.UID
	CRDGeneration int64
	// StorageVersionHash binds the checkpoint of a resource not served from
	// a CRD to the storageVersionHash it was taken under: two versions of
	// one name (an emulated release and the binary's own) differ by it.
	StorageVersionHash string
	// Encryption is the target's encryption state when the migration
	// began: a pass resumes only for the same one, since the objects done
	// before were written under it.
	Encryption *EncryptionState
	// ListResourceVersion is the resourceVersion of the first pass's list
	// snapshot; objects not written since were rewritten as no-ops.
	ListResourceVersion string
	// WindowEnd is a resourceVersion read after the settle window ended:
	// every write that began on the old storage is at or below it.
	WindowEnd string
	// Continue resumes the first pass after the last page whose every
	// object is done. Counts and Failures match it exactly.
	Continue string
	Counts
	Failures []Failure
}

// Resumes reports whether cp was taken on the CRD and version of target, at
// the same generation, and waited for every API server to switch as target
// asks (at least its LagWait, or until each server showed the switch):
// only then may a migration go on from it. Otherwise pages it passed may
// hold objects written at another version since, or proven by an API
// server that had not switched.
func (cp *Checkpoint) Resumes(target Target) bool {
	// A migration limited to one namespace never resumes: its token would
	// skip the namespaces before it in a migration of the whole resource.
	if cp == nil || target.Partial() || cp.StartTime.IsZero() || cp.TargetVersion != target.TargetVersion() || !cp.waitedFor(target) {
		return false
	}
	if (cp.Encryption == nil) != (target.Encryption == nil) || cp.Encryption != nil && !cp.Encryption.Equal(*target.Encryption) {
		return false
	}
	if target.CRD == nil {
		return cp.CRDUID == "" && cp.StorageVersionHash == target.StorageVersionHash
	}
	return cp.CRDUID == target.CRD.UID && cp.CRDGeneration == target.CRD.Generation
}

// ResumeFrom is the one place that decides where a migration of target
// starts: from saved, the checkpoint of an interrupted one, when it Resumes
// on target, else from a new checkpoint. startOver, when saved is set but
// does not resume, says why. The reconcilers call it before they launch a
// migration (the StorageMigration one says in status, events and logs
// whether it resumed, and why not), and
// Migrate and FirstPass call it on Options.Resume as they begin, so a
// checkpoint that does not resume is never gone on from, whoever passed it.
func ResumeFrom(saved *Checkpoint, target Target) (cp *Checkpoint, resumed bool, startOver string) {
	if saved.Resumes(target) {
		return saved, true, ""
	}
	switch {
	case saved != nil && saved.StartTime.IsZero():
		// Never begun (a pass stopped before its first page, as for
		// etcd's space): nothing to resume, nothing to say.
	case saved != nil && !saved.waitedFor(target):
		startOver = "starting over: the interrupted pass waited less for every API server to switch than this control plane needs"
	case saved != nil && target.CRD == nil && saved.StorageVersionHash != target.StorageVersionHash:
		startOver = "starting over: the storageVersionHash changed since the interrupted pass"
	case saved != nil && target.Encryption != nil:
		startOver = "starting over: the target version or the API servers' encryption state changed since the interrupted pass"
	case saved != nil:
		startOver = "starting over: the CRD or the target version changed since the interrupted pass"
	}
	return NewCheckpoint(target), false, startOver
}

// waitedFor reports whether cp's first pass waited for every API server
// that target counts: as long as target's LagWait, or until each showed
// the switch in its own discovery (a server that joins later reads the CRD
// as it is, so it has switched from its start).
func (cp *Checkpoint) waitedFor(target Target) bool {
	return cp.LagWait >= target.LagWait || cp.AllSwitched
}

// NewCheckpoint is the checkpoint of a migration of target that begins now,
// just after Resolve saw the API server store at the target version.
func NewCheckpoint(target Target) *Checkpoint {
	cp := &Checkpoint{Phase: PhaseRewriting, StartTime: time.Now(), LagWait: target.LagWait, TargetVersion: target.TargetVersion()}
	if target.CRD != nil {
		cp.CRDUID, cp.CRDGeneration = target.CRD.UID, target.CRD.Generation
	} else {
		cp.StorageVersionHash = target.StorageVersionHash
	}
	cp.Encryption = target.Encryption
	return cp
}

// Progress is a snapshot of a migration under way.
type Progress struct {
	Checkpoint
	// RemainingEstimate is the list's remainingItemCount after the last page, if given.
	RemainingEstimate *int64
	// Retrying describes the transient error being retried, or is "".
	Retrying string
	// SwitchedBy is when every API server stores at the target version, by
	// the lag bound (lag.go), or by what each server showed once all did
	// (switch.go): the first pass starts then.
	SwitchedBy time.Time
	// Switching, while the first pass waits for API servers to switch,
	// says what each one shows (switch.go); "" otherwise.
	Switching string
	// SettleUntil is when the settle window ends.
	SettleUntil time.Time
	// Concurrency is the pace: how many rewrites the pass has in flight
	// at most now.
	Concurrency int
	// WaitingForSlot is set while the pass waits for one of the passes
	// that run at once to end (Migrator.MaxPasses).
	WaitingForSlot bool
	// WaitingForSpace, while the pass waits for etcd to compact past its
	// rewrites before it writes more (package quota), says the sizes; ""
	// otherwise.
	WaitingForSpace string
}

// Result is what a migration that reached its end returns.
type Result struct {
	Counts
	// Failures holds the first few objects that could not be rewritten.
	Failures []Failure
	// Pruned are the versions removed from status.storedVersions.
	Pruned []string
	// Settled says the settle window passed and what others wrote within
	// it was rewritten again: only then is every object known to be stored
	// at the target, rather than rewritten to it. A CRD's migration settles
	// whenever status.storedVersions lists another version, with or
	// without pruning, since a user (or a StorageVersionMigration's
	// reader) may prune it on the word.
	Settled bool
	// StartTime is when the migration began (for a resumed one, the first start).
	StartTime time.Time
	// EncryptionMoved, for a target with an Encryption state, says how the
	// API servers' encryption state differed from it when the pass ended,
	// or that it could not be read: the pass may have written some objects
	// under another key, so it re-encrypted for no one state. "" when
	// every server still reported the state the pass began with.
	EncryptionMoved string
}

// Observer receives progress. It may be called from several goroutines and
// must be cheap: it runs after every page and on every transient error.
type Observer func(Progress)
