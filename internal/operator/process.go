package operator

// The operator as a process: cmd/manager built and run against a local
// control plane the way users run it: its own kubeconfig, leader election,
// metrics and probes on loopback ports. The benchmarks and the end-to-end
// suite use it.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/restow/restow/internal/controlplane"
	"github.com/restow/restow/internal/testenv"
)

// Package is the manager's import path, built by Build.
const Package = "github.com/restow/restow/cmd/manager"

var (
	buildOnce sync.Once
	binary    string
	errBuild  error
)

// Build compiles cmd/manager once per test process and returns the binary's
// path. RESTOW_MANAGER_BINARY names a binary built beforehand instead.
func Build(tb testing.TB) string {
	tb.Helper()
	buildOnce.Do(func() {
		if path := os.Getenv("RESTOW_MANAGER_BINARY"); path != "" {
			binary = path
			return
		}
		dir, err := os.MkdirTemp("", "restow-manager-")
		if err != nil {
			errBuild = err
			return
		}
		binary = filepath.Join(dir, "manager")
		out, err := exec.Command("go", "build", "-trimpath", "-o", binary, Package).CombinedOutput()
		if err != nil {
			errBuild = fmt.Errorf("go build %s: %w\n%s", Package, err, out)
		}
	})
	if errBuild != nil {
		tb.Fatal(errBuild)
	}
	return binary
}

// Process is one running manager.
type Process struct {
	// Name tells this manager's log lines from another's.
	Name string
	// MetricsURL and ProbeURL are its plain-HTTP endpoints on loopback.
	MetricsURL, ProbeURL string

	cmd  *exec.Cmd
	logs *testenv.LockedBuffer
	done chan struct{}
	err  error
}

// ProcessOptions configure StartProcess.
type ProcessOptions struct {
	// Name tells this manager's log lines from another's; "manager" if empty.
	Name string
	// Kubeconfig is the file the manager reaches the API server with.
	Kubeconfig string
	// Args are added after the defaults (loopback metrics without TLS and
	// probes on free ports, leader election in the default namespace, no
	// automatic migration of built-in resources) and override them, since
	// the last occurrence of a flag wins.
	Args []string
}

// StartProcess runs the manager until the test ends, waiting until its
// readiness probe answers. If the test fails, the manager's log is printed.
func StartProcess(tb testing.TB, opts ProcessOptions) *Process {
	tb.Helper()
	bin := Build(tb)
	if opts.Name == "" {
		opts.Name = "manager"
	}
	ports, err := freePorts(2)
	if err != nil {
		tb.Fatal(err)
	}
	p := &Process{
		Name:       opts.Name,
		MetricsURL: "http://127.0.0.1:" + ports[0] + "/metrics",
		ProbeURL:   "http://127.0.0.1:" + ports[1],
		logs:       &testenv.LockedBuffer{},
		done:       make(chan struct{}),
	}
	args := append([]string{
		"--kubeconfig=" + opts.Kubeconfig,
		"--metrics-bind-address=127.0.0.1:" + ports[0],
		"--metrics-secure=false",
		"--health-probe-bind-address=127.0.0.1:" + ports[1],
		"--leader-election-namespace=default",
		// A test of built-in resources turns it on: elsewhere it would
		// add a StorageMigration for each to every control plane.
		"--auto-migrate-builtins=false",
	}, opts.Args...)
	p.cmd = exec.Command(bin, args...)
	// Go's default collector target, whatever the tests run with (the
	// Makefile's TEST_GOGC): the manager's memory is measured as users run it.
	p.cmd.Env = append(os.Environ(), "GOTRACEBACK=all", "GOGC=100")
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	tb.Cleanup(func() {
		if tb.Failed() {
			// A test that failed waiting on the manager wants to know where
			// it was: SIGQUIT makes the Go runtime print every goroutine.
			p.Dump()
		}
		if err := p.Stop(); err != nil && !tb.Failed() {
			tb.Errorf("%s: %v", p.Name, err)
		}
		if tb.Failed() {
			tb.Logf("%s's log:\n%s", p.Name, p.Logs())
		}
	})
	if err := p.waitReady(tb.Context(), time.Minute); err != nil {
		tb.Fatalf("%s did not become ready: %v\n%s", p.Name, err, p.Logs())
	}
	return p
}

func (p *Process) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		select {
		case <-p.done:
			return fmt.Errorf("exited: %w", p.err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.ProbeURL+"/readyz", nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
	}
}

// WaitLeader waits until this manager holds the leader election lease, by
// its leader_election_master_status metric.
func (p *Process) WaitLeader(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		leader, err := p.Metric(ctx, "leader_election_master_status", nil)
		if err == nil && leader == 1 {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited: %w", p.Name, p.err)
		case <-ctx.Done():
			return fmt.Errorf("%s is not the leader: %w (last error: %w)", p.Name, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// WaitWorking waits until each named controller has started its workers,
// which controller-runtime does only once every informer the controller
// watches through has synced (its "Starting workers" log line). Leading is
// not enough for a test that then slows the API servers: a lagging server
// answers a starting informer's consistent watch with "too large resource
// version" for as long as it lags, and client-go retries that forever.
func (p *Process) WaitWorking(ctx context.Context, timeout time.Duration, controllers ...string) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		missing := p.idleControllers(controllers)
		if len(missing) == 0 {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited: %w", p.Name, p.err)
		case <-ctx.Done():
			return fmt.Errorf("%s: controllers %v have not started their workers (their caches have not synced): %w", p.Name, missing, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// idleControllers are those of controllers that have not logged "Starting
// workers" yet.
func (p *Process) idleControllers(controllers []string) []string {
	working := map[string]bool{}
	for line := range strings.Lines(p.Logs()) {
		var entry struct{ Msg, Controller string }
		if json.Unmarshal([]byte(line), &entry) == nil && entry.Msg == "Starting workers" {
			working[entry.Controller] = true
		}
	}
	return slices.DeleteFunc(slices.Clone(controllers), func(c string) bool { return working[c] })
}

// PID is the manager's process ID.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop sends SIGTERM and waits up to 30 s for the manager to shut down, then
// kills it. A clean exit, or one already seen, returns nil.
func (p *Process) Stop() error {
	if p.Exited() {
		return nil
	}
	if controlplane.Terminate(p.cmd.Process, p.done, 30*time.Second) {
		return errors.New("did not stop within 30 s of SIGTERM; killed")
	}
	return p.err
}

// Dump makes a running manager print its goroutines to its log and exit
// (SIGQUIT), and waits up to 10 s for it to be gone.
func (p *Process) Dump() {
	if p.Exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
}

// Kill sends SIGKILL, as a node failure or the OOM killer would, and waits
// for the process to be gone.
func (p *Process) Kill() {
	if p.Exited() {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Logs is everything the manager wrote so far.
func (p *Process) Logs() string { return p.logs.String() }

// PeakRSS is the largest resident set the process has had (VmHWM in
// /proc/<pid>/status), in bytes. Read it before stopping the process.
func (p *Process) PeakRSS() (uint64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.PID()))
	if err != nil {
		return 0, err
	}
	scanner := bufio.NewScanner(bytes.NewReader(raw))
	for scanner.Scan() {
		field, value, ok := strings.Cut(scanner.Text(), ":")
		if !ok || field != "VmHWM" {
			continue
		}
		kib, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("VmHWM %q: %w", value, err)
		}
		return kib << 10, nil
	}
	return 0, errors.New("no VmHWM in /proc/<pid>/status")
}

// Metric sums every sample of the named counter or gauge on the manager's
// metrics endpoint whose labels include match.
func (p *Process) Metric(ctx context.Context, name string, match map[string]string) (float64, error) {
	text, err := p.MetricsText(ctx)
	if err != nil {
		return 0, err
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		return 0, err
	}
	return SumSamples(families[name], match), nil
}

// MetricsText is the manager's whole metrics endpoint, as scraped.
func (p *Process) MetricsText(ctx context.Context) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.MetricsURL, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", p.MetricsURL, resp.Status)
	}
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}

// freePorts finds n distinct free TCP ports on loopback.
func freePorts(n int) ([]string, error) {
	var ports []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer func() { _ = l.Close() }()
		ports = append(ports, strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
	}
	return ports, nil
}

// SumSamples sums the samples of a metric family whose labels include match:
// counters and gauges by value, histograms by their sample count. A nil
// family sums to 0. The in-process tests read the manager's registry with it,
// the process tests its metrics endpoint.
func SumSamples(family *dto.MetricFamily, match map[string]string) float64 {
	var sum float64
samples:
	for _, m := range family.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for k, v := range match {
			if labels[k] != v {
				continue samples
			}
		}
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		}
	}
	return sum
}
