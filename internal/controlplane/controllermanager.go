package controlplane

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// ControllerManager is a kube-controller-manager running against a control plane.
type ControllerManager struct {
	cmd    *exec.Cmd
	dir    string
	exited chan struct{}
	err    error
}

// StartControllerManager runs the kube-controller-manager of
// KUBEBUILDER_ASSETS (built from source beside kube-apiserver) against the
// control plane as an administrator, with only the named controllers
// (such as storage-version-migrator-controller, which needs
// garbage-collector-controller), no leader election and no serving port. Its
// log goes to logs. Stop it with Stop.
func (e *ControlPlane) StartControllerManager(controllers []string, logs io.Writer) (*ControllerManager, error) {
	bin := filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kube-controller-manager")
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("kube-controller-manager is not in KUBEBUILDER_ASSETS (make envtest-assets builds it): %w", err)
	}
	dir, err := os.MkdirTemp("", "restow-kcm-")
	if err != nil {
		return nil, err
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := e.WriteKubeconfig(kubeconfig); err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	cm := &ControllerManager{dir: dir, exited: make(chan struct{})}
	cm.cmd = exec.Command(bin,
		"--kubeconfig="+kubeconfig,
		"--controllers="+strings.Join(controllers, ","),
		"--leader-elect=false",
		"--secure-port=0",
		"--authentication-skip-lookup",
		"--v=2",
	)
	cm.cmd.Stdout, cm.cmd.Stderr = logs, logs
	if err := cm.cmd.Start(); err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	go func() {
		cm.err = cm.cmd.Wait()
		close(cm.exited)
	}()
	return cm, nil
}

// Exited reports whether the process has ended, and how.
func (cm *ControllerManager) Exited() (bool, error) {
	select {
	case <-cm.exited:
		return true, cm.err
	default:
		return false, nil
	}
}

// Stop ends the process (SIGTERM, then SIGKILL after 10 s) and removes its files.
func (cm *ControllerManager) Stop() error {
	Terminate(cm.cmd.Process, cm.exited, 10*time.Second)
	return os.RemoveAll(cm.dir)
}
