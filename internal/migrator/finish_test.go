package migrator

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/endpoints/discovery"
)

// The re-check after the settle window picks exactly the objects whose last
// write may have been on the old storage.
func TestMustRecheck(t *testing.T) {
	mg := &migration{proven: map[string]struct{}{}, recordWrites: true}
	mg.cp.ListResourceVersion = "1000"
	mg.noteOwnWrite("1005") // the pass's own write within the window
	mg.noteOwnWrite("900")  // before the snapshot: nothing to record
	mg.cp.WindowEnd = "2000"
	mg.noteOwnWrite("2500") // after the window: not recorded, not needed
	mg.noteOwnWrite("1500") // within it, answered after its end was read
	tests := []struct {
		rv   string
		want bool
	}{
		{"999", false},  // not written since the snapshot: the pass's no-op proved it
		{"1000", false}, // the snapshot itself
		{"1005", false}, // last written by the pass
		{"1006", true},  // written by someone else within the window
		{"1500", false}, // the pass's own write, answered late
		{"2000", true},  // the window's end is within it
		{"2001", false}, // written after the window, on the new storage
		{"2500", false},
		{"abc", true}, // not comparable: re-check
		{"", true},
	}
	for _, tt := range tests {
		if got := mg.mustRecheck(tt.rv); got != tt.want {
			t.Errorf("mustRecheck(%q) = %v, want %v", tt.rv, got, tt.want)
		}
	}
	if len(mg.proven) != 2 {
		t.Errorf("proven = %v, want only 1005 and 1500", mg.proven)
	}

	// Without the window's end or the snapshot, everything is re-checked.
	for _, mg := range []*migration{
		{proven: map[string]struct{}{}, recordWrites: true, cp: Checkpoint{ListResourceVersion: "1000"}},
		{proven: map[string]struct{}{}, recordWrites: true, cp: Checkpoint{WindowEnd: "2000"}},
	} {
		if !mg.mustRecheck("500") {
			t.Errorf("mustRecheck with snapshot %q and window end %q = false, want true", mg.cp.ListResourceVersion, mg.cp.WindowEnd)
		}
	}
}

// A checkpoint resumes only the pass it was taken on.
func TestCheckpointResumes(t *testing.T) {
	target := Target{CRD: &CRDState{UID: "uid-1", Generation: 3, StorageVersion: "v1"}, LagWait: 30 * time.Second}
	base := Checkpoint{StartTime: time.Now(), TargetVersion: "v1", CRDUID: "uid-1", CRDGeneration: 3, LagWait: 30 * time.Second}
	tests := []struct {
		name   string
		mutate func(*Checkpoint)
		want   bool
	}{
		{"same CRD, generation and target", func(*Checkpoint) {}, true},
		{"CRD changed since (storage switched away and back)", func(cp *Checkpoint) { cp.CRDGeneration = 2 }, false},
		{"CRD deleted and created again", func(cp *Checkpoint) { cp.CRDUID = "uid-0" }, false},
		{"another target version", func(cp *Checkpoint) { cp.TargetVersion = "v2" }, false},
		{"saved before checkpoints named their CRD", func(cp *Checkpoint) { cp.CRDUID, cp.CRDGeneration = "", 0 }, false},
		{"no start time", func(cp *Checkpoint) { cp.StartTime = time.Time{} }, false},
		// Its pages may have been proven by an API server that had not switched.
		{"waited less for the API servers than the target asks", func(cp *Checkpoint) { cp.LagWait = time.Second }, false},
		{"saved before checkpoints said how long they waited", func(cp *Checkpoint) { cp.LagWait = 0 }, false},
		{"waited longer for the API servers", func(cp *Checkpoint) { cp.LagWait = time.Minute }, true},
	}
	for _, tt := range tests {
		cp := base
		tt.mutate(&cp)
		if got := cp.Resumes(target); got != tt.want {
			t.Errorf("%s: Resumes = %v, want %v", tt.name, got, tt.want)
		}
	}
	if (*Checkpoint)(nil).Resumes(target) {
		t.Error("a nil checkpoint resumes")
	}
	oneNamespace := Target{Namespaced: true, Namespace: "team-a", CRD: target.CRD}
	if (&base).Resumes(oneNamespace) {
		t.Error("a migration limited to one namespace resumes")
	}
	builtIn := Target{Resource: schema.GroupVersionResource{Version: "v1", Resource: "secrets"}}
	if !(&Checkpoint{StartTime: time.Now(), TargetVersion: "v1"}).Resumes(builtIn) {
		t.Error("a built-in resource's checkpoint does not resume")
	}
}

// The default backoff makes the attempts the docs promise: 8, about 32 s
// apart in all. (With a Cap, wait.Backoff stops early once it reaches it.)
func TestDefaultRetryBackoff(t *testing.T) {
	// The loop of wait.ExponentialBackoffWithContext, without its sleeps.
	b := DefaultRetryBackoff
	b.Jitter = 0
	attempts, total := 1, time.Duration(0)
	for b.Steps > 1 {
		total += b.Step()
		attempts++
	}
	if attempts != 8 {
		t.Errorf("attempts = %d, want 8", attempts)
	}
	if total != 31750*time.Millisecond {
		t.Errorf("total delay = %s, want 31.75s", total)
	}
}

// Retries follow the context: a cancelled pass does not sleep out its backoff.
func TestRetryTransientFollowsTheContext(t *testing.T) {
	mg := &migration{opts: Options{RetryBackoff: wait.Backoff{Duration: time.Minute, Factor: 2, Steps: 5}}, observe: func(Progress) {}}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := mg.retryTransient(ctx, func() error { return apierrors.NewServiceUnavailable("restarting") })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("retryTransient = %v, want the context's error", err)
	}
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Errorf("retryTransient returned after %s, want soon after the context ended", elapsed)
	}
	if mg.retrying.Load() != 0 {
		t.Errorf("retrying = %d after the retries ended, want 0", mg.retrying.Load())
	}
}

// The storage version of a built-in resource is the version whose hash
// discovery publishes, which need not be the preferred one.
func TestVersionWithHash(t *testing.T) {
	hash := discovery.StorageVersionHash("flowcontrol.apiserver.k8s.io", "v1beta3", "FlowSchema")
	if got := versionWithHash("flowcontrol.apiserver.k8s.io", "FlowSchema", []string{"v1", "v1beta3"}, hash); got != "v1beta3" {
		t.Errorf("versionWithHash = %q, want v1beta3", got)
	}
	if got := versionWithHash("flowcontrol.apiserver.k8s.io", "FlowSchema", []string{"v1"}, hash); got != "" {
		t.Errorf("versionWithHash without the stored version = %q, want \"\"", got)
	}
	if got := versionWithHash("", "Secret", []string{"v1"}, ""); got != "" {
		t.Errorf("versionWithHash without a hash = %q, want \"\"", got)
	}
}

// TestOwnWritesRecordIsBounded: the record of the pass's own writes within
// the settle window stops growing at maxProven, whether or not the end of
// the window could be read; an object whose write was not recorded is
// re-checked, never taken as proven.
func TestOwnWritesRecordIsBounded(t *testing.T) {
	mg := &migration{proven: map[string]struct{}{}, recordWrites: true, cp: Checkpoint{ListResourceVersion: "100"}}
	for rv := 101; rv <= 101+maxProven+1000; rv++ {
		mg.noteOwnWrite(strconv.Itoa(rv))
	}
	if len(mg.proven) != maxProven {
		t.Fatalf("the record holds %d writes, want at most %d", len(mg.proven), maxProven)
	}
	mg.cp.WindowEnd = strconv.Itoa(200 + maxProven + 1000)
	if !mg.mustRecheck(strconv.Itoa(101 + maxProven + 500)) {
		t.Error("an object whose write was not recorded is not re-checked")
	}
	if mg.mustRecheck("101") {
		t.Error("an object whose write was recorded is re-checked")
	}
}

// TestBuiltInCheckpointBoundToItsHash: a built-in resource's checkpoint
// resumes only under the storageVersionHash it was taken under; one taken
// under another (an upgrade between the interruption and the resume), or
// under none (taken before checkpoints carried it), starts over.
func TestBuiltInCheckpointBoundToItsHash(t *testing.T) {
	target := Target{Resource: schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "mutatingadmissionpolicies"},
		StorageVersion: "v1", StorageVersionHash: "new="}
	cp := NewCheckpoint(target)
	if cp.StorageVersionHash != "new=" || !cp.Resumes(target) {
		t.Fatalf("a checkpoint of the same hash: %+v does not resume", cp)
	}
	for _, hash := range []string{"old=", ""} {
		saved := *cp
		saved.StorageVersionHash = hash
		if _, resumed, why := ResumeFrom(&saved, target); resumed || why != "starting over: the storageVersionHash changed since the interrupted pass" {
			t.Errorf("a checkpoint taken under %q resumed %v (%q)", hash, resumed, why)
		}
	}
}
