package controllers

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/migrator"
)

// The engine's words and the API's: counts, failures, progress, checkpoints
// and the summary of a run. Every translation between internal/migrator and
// api/v1alpha1 is here; status* functions go from the engine to the API,
// engine* functions and checkpoint the other way.

func statusCounts(c migrator.Counts) migrationv1alpha1.ObjectCounts {
	return migrationv1alpha1.ObjectCounts{Listed: c.Listed, Migrated: c.Migrated, AlreadyStored: c.AlreadyStored, Skipped: c.Skipped, Failed: c.Failed, Rechecked: c.Rechecked}
}

func engineCounts(c migrationv1alpha1.ObjectCounts) migrator.Counts {
	return migrator.Counts{Listed: c.Listed, Migrated: c.Migrated, AlreadyStored: c.AlreadyStored, Skipped: c.Skipped, Failed: c.Failed, Rechecked: c.Rechecked}
}

func statusFailures(failures []migrator.Failure) []migrationv1alpha1.FailedObject {
	if len(failures) == 0 {
		return nil
	}
	out := make([]migrationv1alpha1.FailedObject, 0, len(failures))
	for _, f := range failures {
		out = append(out, migrationv1alpha1.FailedObject{Namespace: f.Namespace, Name: f.Name, Reason: f.Reason, Message: f.Message})
	}
	return out
}

func engineFailures(failures []migrationv1alpha1.FailedObject) []migrator.Failure {
	out := make([]migrator.Failure, 0, len(failures))
	for _, f := range failures {
		out = append(out, migrator.Failure{Namespace: f.Namespace, Name: f.Name, Reason: f.Reason, Message: f.Message})
	}
	return out
}

// statusProgress is status.progress for a run's progress.
func statusProgress(p migrator.Progress) *migrationv1alpha1.PassProgress {
	progress := &migrationv1alpha1.PassProgress{
		ObjectCounts:             statusCounts(p.Counts),
		StartTime:                metav1.NewTime(p.StartTime),
		RemainingEstimate:        p.RemainingEstimate,
		ContinueToken:            p.Continue,
		Phase:                    migrationv1alpha1.PassPhase(p.Phase),
		CRDUID:                   string(p.CRDUID),
		CRDGeneration:            p.CRDGeneration,
		StorageVersionHash:       p.StorageVersionHash,
		ListResourceVersion:      p.ListResourceVersion,
		WindowEndResourceVersion: p.WindowEnd,
		AllAPIServersSwitched:    p.AllSwitched,
	}
	if p.Encryption != nil {
		progress.Encryption = statusEncryption(*p.Encryption)
	}
	if p.Phase != migrator.PhaseRewriting && !p.SettleUntil.IsZero() {
		progress.SettleUntil = &metav1.Time{Time: p.SettleUntil}
	}
	if p.LagWait > 0 {
		progress.LagWait = &metav1.Duration{Duration: p.LagWait}
	}
	if !p.SwitchedBy.IsZero() {
		progress.SwitchedBy = &metav1.Time{Time: p.SwitchedBy}
	}
	return progress
}

// statusSummary is status.lastPass for a run of target that reached its end
// at completion.
func statusSummary(target migrator.Target, result migrator.Result, completion time.Time) *migrationv1alpha1.PassSummary {
	summary := &migrationv1alpha1.PassSummary{
		ObjectCounts: statusCounts(result.Counts), StartTime: metav1.NewTime(result.StartTime), CompletionTime: metav1.NewTime(completion),
		TargetVersion: target.TargetVersion(), PrunedVersions: result.Pruned, Settled: result.Settled,
	}
	if target.CRD != nil {
		summary.ServedVersions = target.CRD.ServedVersions
	} else {
		summary.StorageVersionHash = target.StorageVersionHash
	}
	return summary
}

// checkpoint is the checkpoint of an interrupted run saved in status, or nil.
func checkpoint(status *migrationv1alpha1.StorageMigrationStatus) *migrator.Checkpoint {
	p := status.Progress
	if p == nil {
		return nil
	}
	phase := migrator.Phase(p.Phase)
	if phase == "" {
		phase = migrator.PhaseRewriting
	}
	var lagWait time.Duration
	if p.LagWait != nil {
		lagWait = p.LagWait.Duration
	}
	return &migrator.Checkpoint{
		Phase:               phase,
		StartTime:           p.StartTime.Time,
		LagWait:             lagWait,
		AllSwitched:         p.AllAPIServersSwitched,
		TargetVersion:       status.TargetVersion,
		CRDUID:              types.UID(p.CRDUID),
		CRDGeneration:       p.CRDGeneration,
		StorageVersionHash:  p.StorageVersionHash,
		ListResourceVersion: p.ListResourceVersion,
		WindowEnd:           p.WindowEndResourceVersion,
		Continue:            p.ContinueToken,
		Counts:              engineCounts(p.ObjectCounts),
		Failures:            engineFailures(status.FailedObjects),
		Encryption:          engineEncryption(p.Encryption),
	}
}

func statusEncryption(s migrator.EncryptionState) *migrationv1alpha1.EncryptionState {
	out := &migrationv1alpha1.EncryptionState{ConfigHash: s.ConfigHash, KMSKeyIDHashes: s.KMSKeyIDHashes}
	for _, e := range s.Servers {
		out.Servers = append(out.Servers, migrationv1alpha1.EncryptionServerEpoch{
			Address: e.Address, ProcessStartMillis: e.ProcessStart, Reloads: e.Reloads, KMSStampedByMillis: e.KMSStampedBy,
		})
	}
	return out
}

func engineEncryption(s *migrationv1alpha1.EncryptionState) *migrator.EncryptionState {
	if s == nil {
		return nil
	}
	out := &migrator.EncryptionState{ConfigHash: s.ConfigHash, KMSKeyIDHashes: s.KMSKeyIDHashes}
	for _, e := range s.Servers {
		out.Servers = append(out.Servers, migrator.ServerEpoch{
			Address: e.Address, ProcessStart: e.ProcessStartMillis, Reloads: e.Reloads, KMSStampedBy: e.KMSStampedByMillis,
		})
	}
	return out
}

// encryptionRecord records state, by a pass or at first sight.
func encryptionRecord(state migrator.EncryptionState, by migrationv1alpha1.EncryptionRecordSource) *migrationv1alpha1.EncryptionRecord {
	// What the objects are under; the servers' epochs belong to a pass.
	state.Servers = nil
	return &migrationv1alpha1.EncryptionRecord{EncryptionState: *statusEncryption(state), RecordedBy: by, RecordedAt: metav1.Now()}
}
