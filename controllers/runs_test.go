package controllers

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/migrator"
)

// A reconcile that comes late, after the manager began to stop, starts no
// pass: nothing may write once the manager is gone.
func TestPassesLaunchNothingOnceStopped(t *testing.T) {
	ps := newRuns(time.Second, time.Minute)
	ctx, cancel := context.WithCancel(t.Context())
	stopped := make(chan error, 1)
	go func() { stopped <- ps.Start(ctx) }()
	sm := &migrationv1alpha1.StorageMigration{ObjectMeta: metav1.ObjectMeta{Name: "late"}}

	ran := make(chan struct{}, 2)
	migrate := func(context.Context, migrator.Observer) (migrator.Result, error) {
		ran <- struct{}{}
		return migrator.Result{}, nil
	}
	if !ps.launch(t.Context(), sm, &run{}, migrate) {
		t.Fatal("running passes refused to launch one")
	}
	<-ran
	cancel()
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if ps.launch(t.Context(), sm, &run{}, migrate) {
		t.Error("stopped passes launched one")
	}
	select {
	case <-ran:
		t.Error("a pass ran after the manager stopped")
	case <-time.After(100 * time.Millisecond):
	}
	if ps.get(sm.Name) != nil {
		t.Error("stopped passes keep one")
	}
}

// Stalled migrations back off, doubling from the base up to the cap, and
// start again from the base once one succeeds.
func TestStalledBackoff(t *testing.T) {
	ps := newRuns(time.Second, 5*time.Second)
	got := make([]time.Duration, 0, 5)
	for range 5 {
		got = append(got, ps.stalled.When("a"))
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("delays %v, want %v", got, want)
		}
	}
	if d := ps.stalled.When("b"); d != time.Second {
		t.Errorf("another migration's first delay = %v, want 1s", d)
	}
	ps.stalled.Forget("a")
	if d := ps.stalled.When("a"); d != time.Second {
		t.Errorf("delay after success = %v, want 1s", d)
	}
}
