package controllers

import (
	"errors"
	"fmt"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/migrator"
)

// When a StorageMigration needs a pass, and what it records when it needs
// none: the pure judgements startIfNeeded makes of a resolved target
// (a storage version moved from the baseline, stored versions to prune,
// an encryption key rotated, a re-run asked for).

// withEncryptionBaseline adds to out, for a resource restow re-encrypts
// that recorded no encryption state yet and needs no pass, the state the
// API servers report now, as a baseline: nothing is rewritten for it, and
// the next state they all report starts a pass.
func withEncryptionBaseline(out outcome, sm *migrationv1alpha1.StorageMigration, target migrator.Target) outcome {
	if target.Encryption != nil && sm.Status.Encryption == nil {
		out.status.encryption = set(encryptionRecord(*target.Encryption, migrationv1alpha1.EncryptionRecordedByBaseline))
	}
	return out
}

// encryptionRotated says why a resource restow re-encrypts needs a pass:
// every API server reports another encryption state than the one its
// objects were last written under. "" when none is recorded, or it holds.
func encryptionRotated(sm *migrationv1alpha1.StorageMigration, target migrator.Target) string {
	switch {
	case target.Encryption == nil || sm.Status.Encryption == nil:
		return ""
	case sm.Status.Encryption.RecordedBy == migrationv1alpha1.EncryptionRecordedByMoved:
		return fmt.Sprintf("the last pass ended while the API servers' encryption state moved; every API server now encrypts with %s", target.Encryption)
	}
	recorded := engineEncryption(&sm.Status.Encryption.EncryptionState)
	if recorded.Equal(*target.Encryption) {
		return ""
	}
	return fmt.Sprintf("every API server encrypts with %s, and the objects were last written under %s", target.Encryption, recorded)
}

// skipsFirstPass says whether sm takes the objects of target to be stored
// at the storage version it first finds (spec.firstPass: Skip) rather than
// rewrite them before any change: a built-in resource only, which has run
// no pass yet.
func skipsFirstPass(sm *migrationv1alpha1.StorageMigration, target migrator.Target) bool {
	return sm.Spec.FirstPass == migrationv1alpha1.FirstPassSkip && target.CRD == nil &&
		sm.Status.LastPass == nil && sm.Status.Progress == nil
}

// firstSight is the baseline sm's resource had when restow first saw it
// (FirstSeenHashAnnotation), when the API servers store at another version
// now; nil when they store where they did, or nothing was seen. The
// annotation can only ask for more: a hash that is not the one published
// now brings a re-store, never a baseline taken on trust.
func firstSight(sm *migrationv1alpha1.StorageMigration, target migrator.Target) *migrationv1alpha1.StorageBaseline {
	seen := sm.Annotations[migrationv1alpha1.FirstSeenHashAnnotation]
	if seen == "" || target.StorageVersionHash == "" || seen == target.StorageVersionHash {
		return nil
	}
	// Not a hash discovery publishes; still another one (status keeps 64
	// characters at most).
	seen = seen[:min(len(seen), 64)]
	return &migrationv1alpha1.StorageBaseline{StorageVersionHash: seen, RecordedAt: metav1.Now()}
}

// recordBaseline is the outcome of a StorageMigration that skips its first
// pass while nothing moved: at first sight, the storage version the API
// servers store at now is recorded (firstBaseline), and nothing is
// rewritten; after, the baseline is kept. Without a storageVersionHash
// restow cannot tell when the storage version changes, and says so. A
// baseline not every API server showed says so too, in Ready's reason
// BaselineUnproven: nothing is under way, and it is no failure.
func recordBaseline(sm *migrationv1alpha1.StorageMigration, target migrator.Target) outcome {
	gr := target.Resource.GroupResource()
	var out outcome
	if target.StorageVersionHash == "" {
		out = ready(fmt.Sprintf("Nothing rewritten (spec.firstPass: Skip): discovery publishes no storageVersionHash for %s, so restow cannot tell when its storage version changes; request a pass with the re-run annotation (kubectl restow migrate)", gr))
	} else {
		baseline := sm.Status.Baseline
		if baseline == nil {
			baseline = firstBaseline(sm, target)
		}
		version := baseline.StorageVersion
		if version == "" {
			version = "the version of storageVersionHash " + baseline.StorageVersionHash
		}
		out = ready(fmt.Sprintf("Baseline recorded, nothing rewritten (spec.firstPass: Skip): the API servers store %s at %s; restow takes every object to be stored there, and re-stores them once the storage version changes", gr, version))
		if baseline.Unproven != "" {
			out.reason = migrationv1alpha1.BaselineUnprovenReason
			out.message = fmt.Sprintf("Baseline recorded, nothing rewritten (spec.firstPass: Skip), and not proven: the API servers restow read store %s at %s, but %s, so objects may be stored at another version. A pass re-stores every object once restow reads every API server; where it never can (a managed control plane), run kubectl restow migrate %s once the control plane is upgraded",
				gr, version, baseline.Unproven, gr)
		}
		out.status.baseline = set(baseline)
	}
	out.status.observedGeneration = set(sm.Generation)
	out.status.targetVersion = set(target.TargetVersion())
	return out
}

// firstBaseline is the baseline of sm's resource at first sight: the
// storage version the API servers restow read store at now, unproven
// (baselineUnproven) unless every one of them showed it.
func firstBaseline(sm *migrationv1alpha1.StorageMigration, target migrator.Target) *migrationv1alpha1.StorageBaseline {
	return &migrationv1alpha1.StorageBaseline{
		StorageVersion: target.StorageVersion, StorageVersionHash: target.StorageVersionHash, RecordedAt: metav1.Now(),
		Unproven: baselineUnproven(sm, target),
	}
}

// baselineUnproven says why a first baseline taken now is not one every API
// server showed; "" when it is. The trigger's stamp of its first sight
// (FirstSeenHashAnnotation) is every server's word, so a baseline of that
// hash is proven (one of another hash is no baseline: firstSight). Without
// a stamp, the baseline is restow's own read now, proven only where it
// reads every server; and a StorageMigration the trigger made without a
// stamp was made while it could not: the resource's first sight went
// unproven, and an upgrade may have come between it and this read.
func baselineUnproven(sm *migrationv1alpha1.StorageMigration, target migrator.Target) string {
	switch {
	case sm.Annotations[migrationv1alpha1.FirstSeenHashAnnotation] != "":
		return ""
	case target.ServersUnseen != "":
		// status.baseline.unproven holds 1024 characters.
		return "restow could not read every API server when it recorded it (" + migrator.MessageUpTo(errors.New(target.ServersUnseen), 900) + ")"
	case sm.Labels[migrationv1alpha1.AutomaticLabel] == "true" && sm.Labels[migrationv1alpha1.BuiltInLabel] == "true":
		return "restow could not read every API server when it first saw the resource and made this StorageMigration, and the storage version may have moved since"
	}
	return ""
}

// unprovenBaseline says whether sm rests on a baseline not every API server
// showed: never at rest, and woken by every sweep.
func unprovenBaseline(sm *migrationv1alpha1.StorageMigration) bool {
	return sm.Status.Baseline != nil && sm.Status.Baseline.Unproven != ""
}

// unprovenBaselineReplaced says why a StorageMigration whose baseline is
// unproven runs a pass now: restow reads every API server. The pass
// rewrites every object, whatever version it is stored at, so objects at
// a version restow never saw are re-stored too. "" otherwise.
func unprovenBaselineReplaced(baseline *migrationv1alpha1.StorageBaseline, target migrator.Target) string {
	if baseline == nil || baseline.Unproven == "" || target.ServersUnseen != "" {
		return ""
	}
	from := baseline.StorageVersion
	if from == "" {
		from = "storageVersionHash " + baseline.StorageVersionHash
	}
	return fmt.Sprintf("the baseline (%s) was recorded while restow could not read every API server; it reads every one now, and re-stores every object at %s", from, target.TargetVersion())
}

// migrationNeeded says why the resource needs a migration, or returns "".
func migrationNeeded(sm *migrationv1alpha1.StorageMigration, target migrator.Target) string {
	last := sm.Status.LastPass
	switch {
	case sm.Status.Progress != nil:
		return "resuming an interrupted pass"
	case last == nil && !skipsFirstPass(sm, target):
		return "first pass"
	case sm.Generation != sm.Status.ObservedGeneration:
		return "the spec changed"
	case reRunRequested(sm):
		return "a re-run was requested"
	case encryptionRotated(sm, target) != "":
		return encryptionRotated(sm, target)
	case last == nil && unprovenBaselineReplaced(sm.Status.Baseline, target) != "":
		return unprovenBaselineReplaced(sm.Status.Baseline, target)
	case last == nil:
		return storageMoved(sm.Status.Baseline, target)
	case last.TargetVersion != target.TargetVersion():
		return "the storage version changed"
	case target.CRD == nil && last.StorageVersionHash != "" && target.StorageVersionHash != "" && last.StorageVersionHash != target.StorageVersionHash:
		return "the storage version changed"
	case last.Failed > 0:
		return "retrying objects that failed"
	case target.CRD != nil && pruneEnabled(sm) && !slices.Equal(target.CRD.StoredVersions, []string{target.CRD.StorageVersion}):
		return "status.storedVersions lists other versions"
	case target.CRD != nil && slices.ContainsFunc(last.ServedVersions, func(v string) bool { return !slices.Contains(target.CRD.ServedVersions, v) }):
		return "a version stopped being served: re-pointing managedFields that name it"
	}
	return ""
}

// restingMessage is Ready's message while no pass is needed: what the last
// pass proved ("stored at" only if it settled), or, with none on record,
// what the API says.
func restingMessage(sm *migrationv1alpha1.StorageMigration, target migrator.Target) string {
	if p := sm.Status.LastPass; p != nil && p.TargetVersion == target.TargetVersion() {
		return readyMessage(target, migrator.Result{Settled: p.Settled}, p.Listed)
	}
	if target.CRD != nil {
		return fmt.Sprintf("No pass needed: status.storedVersions lists %s alone", target.TargetVersion())
	}
	return fmt.Sprintf("No pass needed: the API servers store at %s", target.TargetVersion())
}

// reStoreUnseen says whether a pass of a built-in resource would start only
// because its storage version moved from the one recorded, while restow
// cannot read every API server (Target.ServersUnseen). A pass someone asks
// for (a re-run, a new spec, a first pass of one they made), or one that
// resumes under the hash it began at, goes on: they vouch that the upgrade
// is done. One interrupted under another hash would start over at the new
// one: it waits too.
func reStoreUnseen(sm *migrationv1alpha1.StorageMigration, target migrator.Target) bool {
	resumes := sm.Status.Progress != nil && sm.Status.Progress.StorageVersionHash == target.StorageVersionHash
	if target.CRD != nil || target.ServersUnseen == "" || resumes || reRunRequested(sm) ||
		sm.Generation != sm.Status.ObservedGeneration {
		return false
	}
	recorded := recordedHash(sm)
	return recorded != "" && target.StorageVersionHash != "" && recorded != target.StorageVersionHash
}

// storageMoved says why a StorageMigration that skipped its first pass runs
// one now: the storage version moved from its baseline. "" while it has
// not, or when no baseline could be recorded.
func storageMoved(baseline *migrationv1alpha1.StorageBaseline, target migrator.Target) string {
	if baseline == nil || target.StorageVersionHash == "" || baseline.StorageVersionHash == target.StorageVersionHash {
		return ""
	}
	from := baseline.StorageVersion
	if from == "" {
		from = "storageVersionHash " + baseline.StorageVersionHash
	}
	return fmt.Sprintf("the storage version moved from %s, the baseline, to %s", from, target.TargetVersion())
}
