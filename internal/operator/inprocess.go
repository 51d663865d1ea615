// Package operator runs restow's operator for the demo, the tests and the
// benchmarks, two ways: in-process (Run, Start), wired by controllers.Setup
// exactly as cmd/manager wires them, and as the manager binary in a process
// of its own (StartProcess), the way users run it.
package operator

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/restow/restow/controllers"
)

// Start runs the controllers with opts in a manager of their own until the
// test ends or stop is called. Intervals opts leaves unset are short. It
// returns once the manager has started its controllers.
func Start(t testing.TB, cfg *rest.Config, scheme *runtime.Scheme, opts controllers.Options) (stop func()) {
	t.Helper()
	if opts.StatusInterval == 0 {
		opts.StatusInterval = 200 * time.Millisecond
	}
	if opts.StalledRetryBase == 0 {
		opts.StalledRetryBase, opts.StalledRetryMax = 500*time.Millisecond, 2*time.Second
	}
	if opts.SettleWindow == 0 {
		// The tests' writes end long before this; tests of the window set their own.
		opts.SettleWindow = 300 * time.Millisecond
	}
	if opts.RetryBackoff.Steps == 0 {
		opts.RetryBackoff = wait.Backoff{Duration: 50 * time.Millisecond, Factor: 2, Steps: 5, Cap: time.Second}
	}
	stopManager, err := Run(context.Background(), cfg, scheme, opts)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			if err := stopManager(); err != nil {
				t.Errorf("manager: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// Run runs the controllers with opts in a manager of their own, without
// metrics or probes, until ctx ends or stop is called; stop waits for the
// manager and returns its error. Run returns once the manager has started
// its controllers.
func Run(ctx context.Context, cfg *rest.Config, scheme *runtime.Scheme, opts controllers.Options) (stop func() error, err error) {
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// Tests start a manager of their own each, with the same controller names.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	if err := controllers.Setup(ctx, mgr, opts); err != nil {
		cancel()
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	select {
	case <-mgr.Elected():
	case err := <-done:
		cancel()
		return nil, fmt.Errorf("manager: %w", err)
	}
	return func() error {
		cancel()
		return <-done
	}, nil
}
