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
func TestRunnerStartsNothingOnceStopped(t *testing.T) {
	r := newRunner()
	ctx, cancel := context.WithCancel(t.Context())
	stopped := make(chan error, 1)
	go func() { stopped <- r.Start(ctx) }()
	sm := &migrationv1alpha1.StorageMigration{ObjectMeta: metav1.ObjectMeta{Name: "late"}}

	ran := make(chan struct{}, 2)
	pass := func(context.Context, migrator.Observer) (migrator.Result, error) {
		ran <- struct{}{}
		return migrator.Result{}, nil
	}
	if !r.start(t.Context(), sm, &run{}, pass) {
		t.Fatal("a running runner refused to start a pass")
	}
	<-ran
	cancel()
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if r.start(t.Context(), sm, &run{}, pass) {
		t.Error("a stopped runner started a pass")
	}
	select {
	case <-ran:
		t.Error("the pass ran after the runner stopped")
	case <-time.After(100 * time.Millisecond):
	}
	if r.get(sm.Name) != nil {
		t.Error("the stopped runner keeps a pass")
	}
}
