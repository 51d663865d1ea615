package controlplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netns"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// A control plane of several API servers (Options.APIServers) runs them all
// on its one etcd, as a production control plane does, behind a round-robin
// TCP balancer (balancer.go). Each extra server is a copy of the first, the
// one envtest started, on a port of its own and with a host name of its own:
// kube-apiserver names its identity Lease in kube-system after a hash of its
// host name, so servers that shared one would share one Lease, and a client
// counting Leases would see one server.

// hostnameEnv, when set in this process's environment, makes it take that
// host name and become the program in its arguments (see init); netnsEnv
// makes it join that network namespace first (netns.go).
const (
	hostnameEnv = "RESTOW_CONTROLPLANE_HOSTNAME"
	netnsEnv    = "RESTOW_CONTROLPLANE_NETNS"
)

// init runs an extra API server: startExtraAPIServer starts this same
// binary (a test, the demo) in a UTS namespace of its own with hostnameEnv
// set, and here, before anything else runs, the copy sets its host name and
// executes kube-apiserver in its place. Go cannot set a child's host name
// between fork and exec, and this needs no tool outside the binary.
func init() {
	name := os.Getenv(hostnameEnv)
	if name == "" {
		return
	}
	_ = os.Unsetenv(hostnameEnv)
	if err := syscall.Sethostname([]byte(name)); err != nil {
		fmt.Fprintf(os.Stderr, "controlplane: setting the host name %q of an extra API server: %v\n", name, err)
		os.Exit(1)
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "controlplane: no program to run after setting the host name")
		os.Exit(1)
	}
	if name := os.Getenv(netnsEnv); name != "" {
		_ = os.Unsetenv(netnsEnv)
		// A namespace is a thread's: this one joins it and executes the
		// program, which keeps it.
		runtime.LockOSThread()
		ns, err := netns.GetFromName(name)
		if err == nil {
			err = netns.Set(ns)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "controlplane: joining network namespace %q: %v\n", name, err)
			os.Exit(1)
		}
	}
	err := syscall.Exec(os.Args[1], os.Args[1:], os.Environ())
	fmt.Fprintf(os.Stderr, "controlplane: executing %s: %v\n", os.Args[1], err)
	os.Exit(1)
}

// extraAPIServer is an API server the control plane started beside envtest's.
type extraAPIServer struct {
	cmd    *exec.Cmd
	exited chan struct{}
	url    string
	// binary, args, name and network start it again (RestartOwnAPIServer).
	binary, name, network string
	args                  []string
}

// startHA starts the API servers beyond the first and the balancer in front
// of all of them, and points Config at the balancer.
func (e *ControlPlane) startHA(ctx context.Context, opts Options) error {
	first, err := e.apiServerArgs()
	if err != nil {
		return err
	}
	backends := []string{hostPort(e.environment.Config.Host)}
	for i := 1; i < opts.APIServers; i++ {
		args := withoutFlag(first[1:], "secure-port", "etcd-servers")
		port, err := freePort()
		if err != nil {
			return err
		}
		args = append(args,
			"--secure-port="+strconv.Itoa(port),
			// The first server keeps default/kubernetes's endpoints: servers
			// on one address but several ports would rewrite them in turn.
			"--endpoint-reconciler-type=none",
		)
		etcd := e.EtcdURL()
		if opts.LaggingAPIServer && i == opts.APIServers-1 {
			if e.lag, err = newLagProxy(hostPort(etcd)); err != nil {
				return err
			}
			etcd = "http://" + e.lag.addr()
		}
		args = append(args, "--etcd-servers="+etcd)
		server, err := startExtraAPIServer(string(first[0]), args, fmt.Sprintf("restow-apiserver-%d", i), "")
		if err != nil {
			return err
		}
		server.url = "https://127.0.0.1:" + strconv.Itoa(port)
		e.extra = append(e.extra, server)
		if err := waitReady(ctx, e.environment.Config, server.url); err != nil {
			return fmt.Errorf("API server %d on %s: %w", i+1, server.url, err)
		}
		backends = append(backends, hostPort(server.url))
	}
	if e.balancer, err = newBalancer(backends); err != nil {
		return err
	}
	e.Config = rest.CopyConfig(e.environment.Config)
	e.Config.Host = "https://" + e.balancer.addr()
	return nil
}

// APIServers is how many kube-apiservers serve the control plane.
func (e *ControlPlane) APIServers() int {
	if e.ownAddresses {
		return len(e.extra)
	}
	return 1 + len(e.extra)
}

// SetWatchLag makes the lagging API server (Options.LaggingAPIServer) receive
// etcd's watch events d late from now on: until d after a CRD update it
// still serves and stores that CRD's objects as before. Zero ends the lag;
// what is already held arrives on time.
func (e *ControlPlane) SetWatchLag(d time.Duration) {
	if e.lag == nil {
		panic("controlplane: SetWatchLag without Options.LaggingAPIServer")
	}
	e.lag.setDelay(d)
}

// startExtraAPIServer starts kube-apiserver with args under host name name
// and, if network is set, in that network namespace (see init).
func startExtraAPIServer(binary string, args []string, name, network string) (*extraAPIServer, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, append([]string{binary}, args...)...)
	cmd.Env = append(os.Environ(), hostnameEnv+"="+name)
	if network != "" {
		cmd.Env = append(cmd.Env, netnsEnv+"="+network)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUTS, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting API server %s (it needs a UTS namespace of its own, so root or CAP_SYS_ADMIN): %w", name, err)
	}
	server := &extraAPIServer{cmd: cmd, exited: make(chan struct{}), binary: binary, args: args, name: name, network: network}
	go func() {
		_ = cmd.Wait()
		close(server.exited)
	}()
	return server, nil
}

// stopHA stops the balancer, the extra API servers and the lag proxy.
func (e *ControlPlane) stopHA() error {
	var errs []error
	if e.balancer != nil {
		errs = append(errs, e.balancer.close())
	}
	for _, s := range e.extra {
		Terminate(s.cmd.Process, s.exited, APIServerShutdownGrace)
	}
	if e.lag != nil {
		errs = append(errs, e.lag.close())
	}
	errs = append(errs, e.stopOwnAddresses())
	return errors.Join(errs...)
}

// apiServerArgs is the command line of the first API server, the one envtest
// started.
func (e *ControlPlane) apiServerArgs() ([][]byte, error) {
	pid, err := e.apiServerPID()
	if err != nil {
		return nil, err
	}
	raw, err := os.ReadFile(filepath.Join("/proc", pid, "cmdline"))
	if err != nil {
		return nil, err
	}
	return bytes.Split(bytes.TrimRight(raw, "\x00"), []byte{0}), nil
}

// withoutFlag returns args as strings, less --name=value for each name.
func withoutFlag(args [][]byte, names ...string) []string {
	out := make([]string, 0, len(args))
	for _, a := range args {
		if !slices.ContainsFunc(names, func(name string) bool { return strings.HasPrefix(string(a), "--"+name+"=") }) {
			out = append(out, string(a))
		}
	}
	return out
}

// waitReady waits until the API server at serverURL answers /readyz with ok,
// with cfg's credentials.
func waitReady(ctx context.Context, cfg *rest.Config, serverURL string) error {
	cfg = rest.CopyConfig(cfg)
	cfg.Host = serverURL
	clientset, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	var last error
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		var body []byte
		body, last = clientset.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return last == nil && string(body) == "ok", nil
	})
	if err != nil {
		return fmt.Errorf("not ready: %w", errors.Join(err, last))
	}
	return nil
}

func hostPort(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return rawURL
	}
	return u.Host
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// pointAtBalancer rewrites a kubeconfig so that every cluster in it is
// reached through the control plane's address (the balancer, with several
// API servers).
func (e *ControlPlane) pointAtBalancer(raw []byte) ([]byte, error) {
	if e.balancer == nil {
		return raw, nil
	}
	config, err := clientcmd.Load(raw)
	if err != nil {
		return nil, err
	}
	for _, cluster := range config.Clusters {
		cluster.Server = e.Config.Host
		// With OwnAddresses, the servers' CA besides envtest's.
		cluster.CertificateAuthorityData = e.Config.CAData
	}
	return clientcmd.Write(*config)
}

// ServerConfig reaches API server i (0 is the first; with LaggingAPIServer
// the last one lags) directly, not through the balancer, as an administrator.
func (e *ControlPlane) ServerConfig(i int) *rest.Config {
	if e.ownAddresses {
		cfg := rest.CopyConfig(e.Config)
		cfg.Host = e.extra[i].url
		return cfg
	}
	cfg := rest.CopyConfig(e.environment.Config)
	if i > 0 {
		cfg.Host = e.extra[i-1].url
	}
	return cfg
}
