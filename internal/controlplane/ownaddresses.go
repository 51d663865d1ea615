package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// securePortFlag names kube-apiserver's port flag. Every API server on an
// address of its own listens on envtest's server's port (each has its
// network namespace, so they need not differ): the kubernetes Service,
// which that server created, sends its endpoints' port there, and the
// servers publish their addresses with it, as a control plane whose
// servers share one port does.
const securePortFlag = "--secure-port="

// identityLeaseLabel marks kube-apiserver's identity Leases in kube-system.
const identityLeaseLabel = "apiserver.kubernetes.io/identity"

// startOwnAddresses starts opts.APIServers API servers, each in a network
// namespace of its own on an address of its own (netns.go), with a serving
// certificate for that address and the default/kubernetes Service's names
// from one CA, publishing its address in the Service's endpoints. envtest's
// API server only starts the control plane: once these are ready it is
// stopped and its identity Lease deleted, so that every API server left
// serves on an address of its own. Config reaches them through the
// balancer, and trusts their CA besides envtest's.
func (e *ControlPlane) startOwnAddresses(ctx context.Context, opts Options) error {
	first, err := e.apiServerArgs()
	if err != nil {
		return err
	}
	ca, err := newServingCA()
	if err != nil {
		return err
	}
	if e.pkiDir, err = os.MkdirTemp("", "restow-apiservers-"); err != nil {
		return err
	}
	cfg := rest.CopyConfig(e.environment.Config)
	cfg.CAData = append(append([]byte{}, cfg.CAData...), ca.certPEM...)
	securePort := ""
	for _, a := range first {
		if p, ok := strings.CutPrefix(string(a), securePortFlag); ok {
			securePort = p
		}
	}
	if securePort == "" {
		return errors.New("envtest's kube-apiserver has no --secure-port flag")
	}
	own := ownServer{first: first, ca: ca, cfg: cfg, etcd: hostPort(e.EtcdURL()), securePort: securePort}
	backends := make([]string, 0, opts.APIServers)
	for i := range opts.APIServers {
		backend, err := e.startOwnAPIServer(ctx, opts, own, i)
		if err != nil {
			return err
		}
		backends = append(backends, backend)
	}
	if e.balancer, err = newBalancer(backends); err != nil {
		return err
	}
	e.Config = rest.CopyConfig(cfg)
	e.Config.Host = "https://" + e.balancer.addr()
	e.ownAddresses = true
	return e.retireEnvtestAPIServer(ctx)
}

// ownServer is what every API server on an address of its own starts from:
// envtest's server's flags (first, the binary first), the serving CA, a
// client configuration that trusts it, etcd's address and the port.
type ownServer struct {
	first      [][]byte
	ca         *servingCA
	cfg        *rest.Config
	etcd       string
	securePort string
}

// startOwnAPIServer starts API server i in a network namespace of its own,
// reaching etcd through a forward on its host address (the lag proxy for
// the lagging server), and waits until it is ready; it returns the
// server's host:port for the balancer.
func (e *ControlPlane) startOwnAPIServer(ctx context.Context, opts Options, own ownServer, i int) (string, error) {
	network, err := newHostNetwork(i)
	if err != nil {
		return "", err
	}
	e.networks = append(e.networks, network)
	var etcdAddr string
	if opts.LaggingAPIServer && i == opts.APIServers-1 {
		if e.lag, err = newLagProxyOn(network.host.String(), own.etcd); err != nil {
			return "", err
		}
		etcdAddr = e.lag.addr()
	} else {
		forward, err := newBalancerOn(network.host.String(), []string{own.etcd})
		if err != nil {
			return "", err
		}
		e.forwards = append(e.forwards, forward)
		etcdAddr = forward.addr()
	}
	certFile, keyFile, err := e.writeServingCert(own.ca, i, network.server)
	if err != nil {
		return "", err
	}
	args := withoutFlag(own.first[1:], "secure-port", "bind-address", "advertise-address", "etcd-servers",
		"tls-cert-file", "tls-private-key-file", "endpoint-reconciler-type")
	args = append(args,
		securePortFlag+own.securePort,
		"--bind-address="+network.server.String(),
		"--advertise-address="+network.server.String(),
		"--etcd-servers=http://"+etcdAddr,
		"--tls-cert-file="+certFile,
		"--tls-private-key-file="+keyFile,
	)
	if opts.UnpublishedAPIServer && i > 0 && i == opts.APIServers-1 {
		args = append(args, "--endpoint-reconciler-type=none")
	}
	hostname := fmt.Sprintf("restow-apiserver-%d", i)
	if opts.SharedHostName {
		hostname = "restow-apiserver"
	}
	server, err := startExtraAPIServer(string(own.first[0]), args, hostname, network.name)
	if err != nil {
		return "", err
	}
	server.url = "https://" + net.JoinHostPort(network.server.String(), own.securePort)
	e.extra = append(e.extra, server)
	if err := waitReady(ctx, own.cfg, server.url); err != nil {
		return "", fmt.Errorf("API server %d on %s: %w", i+1, server.url, err)
	}
	return hostPort(server.url), nil
}

// RestartOwnAPIServer stops API server i of those on addresses of their
// own (SIGTERM, SIGKILL after APIServerShutdownGrace), as a rolling update
// of the control plane would, and starts it again in its network namespace
// with the same flags, less those named in without (such as
// "emulated-version": an upgrade to the binary's own release), address and
// certificate. It returns once the new process answers /readyz.
func (e *ControlPlane) RestartOwnAPIServer(ctx context.Context, i int, without ...string) error {
	if !e.ownAddresses || i < 0 || i >= len(e.extra) {
		return fmt.Errorf("no API server %d on an address of its own", i)
	}
	old := e.extra[i]
	Terminate(old.cmd.Process, old.exited, APIServerShutdownGrace)
	server, err := startExtraAPIServer(old.binary, withoutFlag(stringsToBytes(old.args), without...), old.name, old.network)
	if err != nil {
		return err
	}
	server.url = old.url
	e.extra[i] = server
	return waitReady(ctx, e.Config, server.url)
}

// writeServingCert writes API server i's serving certificate and key.
func (e *ControlPlane) writeServingCert(ca *servingCA, i int, address net.IP) (certFile, keyFile string, err error) {
	// 127.0.0.1 too: clients reach the servers through the balancer there.
	certPEM, keyPEM, err := ca.serve(int64(i), address, net.IPv4(127, 0, 0, 1))
	if err != nil {
		return "", "", err
	}
	certFile = filepath.Join(e.pkiDir, "apiserver-"+strconv.Itoa(i)+".crt")
	keyFile = filepath.Join(e.pkiDir, "apiserver-"+strconv.Itoa(i)+".key")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, os.WriteFile(keyFile, keyPEM, 0o600)
}

// retireEnvtestAPIServer stops the API server envtest started (on loopback,
// so in no Service's endpoints) and deletes its identity Lease, through the
// servers on their own addresses.
func (e *ControlPlane) retireEnvtestAPIServer(ctx context.Context) error {
	pid, err := e.apiServerPID()
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(pid)
	if err != nil {
		return err
	}
	_ = syscall.Kill(n, syscall.SIGTERM)
	gone := func(context.Context) (bool, error) {
		_, err := os.Stat(filepath.Join("/proc", pid))
		return errors.Is(err, os.ErrNotExist), nil
	}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, APIServerShutdownGrace, true, gone); err != nil {
		_ = syscall.Kill(n, syscall.SIGKILL)
		if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, gone); err != nil {
			return fmt.Errorf("envtest's kube-apiserver did not stop: %w", err)
		}
	}
	hostname, err := os.Hostname()
	if err != nil {
		return err
	}
	c, err := client.New(e.Config, client.Options{Scheme: e.Scheme})
	if err != nil {
		return err
	}
	return c.DeleteAllOf(ctx, &coordinationv1.Lease{}, client.InNamespace("kube-system"),
		client.MatchingLabels{identityLeaseLabel: "kube-apiserver", corev1.LabelHostname: hostname})
}

// stopOwnAddresses removes what startOwnAddresses made beside the servers:
// the forwarders to etcd, the network namespaces and the certificates.
func (e *ControlPlane) stopOwnAddresses() error {
	var errs []error
	for _, f := range e.forwards {
		errs = append(errs, f.close())
	}
	for _, n := range e.networks {
		errs = append(errs, n.close())
	}
	if e.pkiDir != "" {
		errs = append(errs, os.RemoveAll(e.pkiDir))
	}
	return errors.Join(errs...)
}

// APIServerSignals reads what a client in the cluster sees of its API
// servers: the host names on their identity Leases in kube-system, and the
// addresses in the default/kubernetes Service's EndpointSlices.
func (e *ControlPlane) APIServerSignals(ctx context.Context) (hostnames, addresses []string, err error) {
	leases := &coordinationv1.LeaseList{}
	if err := e.Client.List(ctx, leases, client.InNamespace("kube-system"), client.MatchingLabels{identityLeaseLabel: "kube-apiserver"}); err != nil {
		return nil, nil, err
	}
	for _, l := range leases.Items {
		hostnames = append(hostnames, l.Labels[corev1.LabelHostname])
	}
	endpoints := &discoveryv1.EndpointSliceList{}
	if err := e.Client.List(ctx, endpoints, client.InNamespace("default"), client.MatchingLabels{discoveryv1.LabelServiceName: "kubernetes"}); err != nil {
		return nil, nil, err
	}
	for _, s := range endpoints.Items {
		for _, ep := range s.Endpoints {
			addresses = append(addresses, ep.Addresses...)
		}
	}
	sort.Strings(hostnames)
	sort.Strings(addresses)
	return hostnames, addresses, nil
}

func stringsToBytes(args []string) [][]byte {
	out := make([][]byte, len(args))
	for i, a := range args {
		out[i] = []byte(a)
	}
	return out
}
