package controlplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// APIServerShutdownGrace is how long RestartAPIServer lets kube-apiserver
// shut down gracefully before it kills it, as a kubelet's termination grace
// period would.
const APIServerShutdownGrace = 10 * time.Second

// RestartAPIServer stops kube-apiserver with SIGTERM, as a rolling update of
// the control plane would (SIGKILL after APIServerShutdownGrace), keeps it
// down for down, and starts it again with
// the same flags, certificates and port over the same etcd. It returns once
// the new process answers /readyz, with the time it took to stop and the
// time until it was ready again. Clients keep their configuration: the
// server's certificate and address do not change.
func (e *ControlPlane) RestartAPIServer(ctx context.Context, down time.Duration) (stopped, ready time.Duration, err error) {
	start := time.Now()
	err = e.restartAPIServer(ctx, down, func() { stopped = time.Since(start) }, nil)
	return stopped, time.Since(start), err
}

// RestartAPIServerWithout restarts kube-apiserver as RestartAPIServer does,
// at once, without the flags named (such as "emulated-version": an upgrade
// of the control plane to the binary's own release).
func (e *ControlPlane) RestartAPIServerWithout(ctx context.Context, flags ...string) error {
	return e.restartAPIServer(ctx, 0, func() {}, flags)
}

func (e *ControlPlane) restartAPIServer(ctx context.Context, down time.Duration, onStopped func(), without []string) error {
	if e.ownAddresses {
		return errors.New("RestartAPIServer restarts envtest's API server, which Options.OwnAddresses retires")
	}
	pid, err := e.apiServerPID()
	if err != nil {
		return err
	}
	args, err := e.apiServerArgs()
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(pid)
	if err != nil {
		return err
	}
	if err := syscall.Kill(n, syscall.SIGTERM); err != nil {
		return fmt.Errorf("stopping kube-apiserver: %w", err)
	}
	// Gone once its /proc entry is (envtest, its parent, reaps it), or,
	// for a process this method started, once Wait returns.
	gone := func(context.Context) (bool, error) {
		if e.restarted != nil && e.restarted.Process.Pid == n {
			return e.restartedDone(), nil
		}
		_, err := os.Stat(filepath.Join("/proc", pid))
		return errors.Is(err, os.ErrNotExist), nil
	}
	// As the kubelet does: SIGKILL when the grace period is over.
	// kube-apiserver's graceful shutdown (its shutdown-delay and the
	// draining of long requests) can take longer than that here.
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, APIServerShutdownGrace, true, gone); err != nil {
		_ = syscall.Kill(n, syscall.SIGKILL)
		if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, gone); err != nil {
			return fmt.Errorf("kube-apiserver did not stop: %w", err)
		}
	}
	onStopped()
	select {
	case <-time.After(down):
	case <-ctx.Done():
		return ctx.Err()
	}
	cmd := exec.Command(string(args[0]))
	cmd.Args = append(cmd.Args, withoutFlag(args[1:], without...)...)
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting kube-apiserver again: %w", err)
	}
	e.restarted, e.restartedWait = cmd, make(chan struct{})
	go func(done chan struct{}) {
		_ = cmd.Wait()
		close(done)
	}(e.restartedWait)
	return e.waitAPIServerReady(ctx)
}

func (e *ControlPlane) restartedDone() bool {
	select {
	case <-e.restartedWait:
		return true
	default:
		return false
	}
}

// waitAPIServerReady waits until the restarted kube-apiserver answers /readyz with ok.
func (e *ControlPlane) waitAPIServerReady(ctx context.Context) error {
	return waitReady(ctx, e.environment.Config, e.environment.Config.Host)
}

// stopRestarted stops a kube-apiserver RestartAPIServer started, which
// envtest does not know of.
func (e *ControlPlane) stopRestarted() error {
	if e.restarted == nil || e.restartedDone() {
		return nil
	}
	if Terminate(e.restarted.Process, e.restartedWait, 30*time.Second) {
		return errors.New("kube-apiserver did not stop within 30 s of SIGTERM; killed")
	}
	return nil
}

// Terminate stops a process the way a kubelet does: SIGTERM, then SIGKILL
// once grace is over. exited is closed once the process is gone. It reports
// whether it had to kill.
func Terminate(p *os.Process, exited <-chan struct{}, grace time.Duration) (killed bool) {
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		return false
	case <-time.After(grace):
		_ = p.Kill()
		<-exited
		return true
	}
}
