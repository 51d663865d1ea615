package controlplane

import (
	"bytes"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of CPU times in /proc/<pid>/stat: 100 on
// every Linux architecture Go supports.
const clockTicks = 100

// APIServerCPU returns the CPU time (user and system, all threads) the
// control plane's kube-apiserver processes, all of them, have used so far,
// read from /proc. Benchmarks subtract two readings to get the API servers'
// cost of a pass.
func (e *ControlPlane) APIServerCPU() (time.Duration, error) {
	pid, err := e.apiServerPID()
	if err != nil {
		return 0, err
	}
	pids := []string{pid}
	for _, s := range e.extra {
		pids = append(pids, strconv.Itoa(s.cmd.Process.Pid))
	}
	var total time.Duration
	for _, pid := range pids {
		cpu, err := processCPU(pid)
		if err != nil {
			return 0, err
		}
		total += cpu
	}
	return total, nil
}

// processCPU reads the CPU time a process has used so far.
func processCPU(pid string) (time.Duration, error) {
	raw, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces: fields start after it.
	fields := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+1:]))
	// utime and stime are the 14th and 15th fields of the line; here, after
	// pid and comm, the 12th and 13th.
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc/%s/stat: too few fields", pid)
	}
	var ticks int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%s/stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// apiServerPID finds the kube-apiserver process envtest started (the first
// of several): the one whose command line has its secure port.
func (e *ControlPlane) apiServerPID() (string, error) {
	u, err := url.Parse(e.environment.Config.Host)
	if err != nil {
		return "", err
	}
	want := []byte("--secure-port=" + u.Port() + "\x00")
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return "", err
	}
	for _, d := range dirs {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte("kube-apiserver")) {
			continue
		}
		if bytes.Contains(append(cmdline, 0), want) {
			return d.Name(), nil
		}
	}
	return "", fmt.Errorf("no kube-apiserver process with --secure-port=%s", u.Port())
}
