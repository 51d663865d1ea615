package migrator

import (
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Counting the API servers, and the lag bound.
//
// A production control plane runs several kube-apiservers on one etcd, and
// each switches a CRD's storage version when its own CRD informer sees the
// update. Until then it stores the CRD's objects at the old version, and it
// answers a write of an unchanged object stored at the old version with
// "unchanged" (the bytes it would write equal etcd's). No answer says which
// server gave it, so nothing such a server may have answered can count as
// proof: not a write's answer, not "already stored", not a list snapshot
// taken meanwhile, not the readiness gate's discovery read (which one
// server answered). So the first pass waits until every API server has
// switched: switch.go reads each one's own discovery at its address, and
// where it cannot see every server, relies on a stated bound: every API
// server switches within LagBound of the CRD update. Resolve reads the CRD
// live before it takes the migration's StartTime, so by StartTime +
// LagBound every server has switched; the settle window counts from when
// every server switched, so that a write that began on a late server's old
// storage has ended before the prune.
//
// A control plane of one API server has no lag to wait for, and its first
// pass starts informerLag after the gate, as it always did. Resolve counts
// the API servers by every signal it can read and takes the largest count,
// so that one signal saying "one" is not enough when another disagrees:
//   - identity Leases in kube-system. API servers that share a host name
//     share one (kube-apiserver names it after a hash of the host name), and
//     API servers with APIServerIdentity off have none;
//   - the addresses in the default/kubernetes Service's EndpointSlices, which
//     every API server publishes (its --advertise-address) unless it runs
//     with --endpoint-reconciler-type=none. Servers behind one address
//     (a managed control plane's load balancer) show as one;
//   - the addresses the user names (Migrator.APIServerAddresses).
// A signal it cannot read, or Leases of none, make the number unknown,
// which means several. An EndpointSlice that lists no address (servers that
// publish none, or only a loopback address, which the API refuses) says
// nothing either way. Migrator.AssumeSeveral turns the count off.

const (
	// DefaultLagBound is how long any API server may take to see a CRD
	// update after another has: far beyond the lag of a healthy informer
	// (well under a second), and within what a migration can wait, as it
	// waits for the settle window anyway.
	DefaultLagBound = 30 * time.Second
	// informerLag is the least wait before a first pass: on a control plane
	// of one API server, whose answer to the readiness gate is the one that
	// counts, a margin for its informer and its handler to agree.
	informerLag = time.Second
	// identityLeaseLabel marks kube-apiserver's identity Leases in kube-system.
	identityLeaseLabel = "apiserver.kubernetes.io/identity"
	// IdentityLeaseSelector selects kube-apiserver's identity Leases (in
	// kube-system).
	IdentityLeaseSelector = identityLeaseLabel + "=kube-apiserver"
	// kubernetesService is the Service whose endpoints are the API servers'
	// addresses, in the default namespace.
	kubernetesService = "kubernetes"
)

// apiServerSignal is what one source says of the number of API servers.
type apiServerSignal struct {
	// source names it for status: "identity Leases in kube-system".
	source string
	// count is what it says; 0 with unknown set when it could not tell, or
	// with silent set when it says nothing either way.
	count   int
	unknown string
	silent  bool
	// detail adds what it saw, for status ("10.0.0.1, 10.0.0.2").
	detail string
}

func (s apiServerSignal) String() string {
	switch {
	case s.unknown != "":
		return s.source + ": unknown (" + s.unknown + ")"
	case s.silent:
		return s.source + ": none listed"
	case s.detail != "":
		return fmt.Sprintf("%s: %d (%s)", s.source, s.count, s.detail)
	default:
		return fmt.Sprintf("%s: %d", s.source, s.count)
	}
}

// countAPIServers combines the signals: the largest count any of them
// shows, 1 only if every signal that says anything says 1, and 0 (unknown,
// with why) if a signal could not be read and none shows more than one.
func countAPIServers(signals []apiServerSignal) (servers int, unknown string) {
	var unknowns []string
	for _, s := range signals {
		servers = max(servers, s.count)
		if s.unknown != "" {
			unknowns = append(unknowns, s.String())
		}
	}
	switch {
	case servers > 1:
		return servers, ""
	case len(unknowns) > 0:
		return 0, strings.Join(unknowns, "; ")
	case servers == 0:
		return 0, "no signal lists an API server"
	}
	return 1, ""
}

// census is what Resolve learns of the API servers: how many there are
// (0 when it could not tell), what each signal said, and the addresses at
// which restow can reach each one directly (switch.go).
type census struct {
	servers   int
	signals   string
	addresses []string
	// unseen, when set, says why restow cannot know that it reaches every
	// server at the addresses (switch.go).
	unseen string
}

// lagWait is how long after Resolve saw the switch the last API server may
// switch too by the lag bound (zero with one API server), and what Resolve
// found of the API servers.
//
// A read that fails transiently is a *TransientError: treated as several
// servers, it would refuse a checkpoint taken with the count of one and make
// the pass start over each time it happens. Any other failure (RBAC) is
// stable, and means several.
func (m *Migrator) lagWait(ctx context.Context) (time.Duration, census, error) {
	bound := m.lagBound()
	if m.AssumeSeveral {
		off := "the count of API servers is turned off (--assume-several-apiservers)"
		return bound, census{signals: off, addresses: m.APIServerAddresses, unseen: off}, nil
	}
	leases, err := m.leaseSignal(ctx)
	if err != nil {
		return 0, census{}, err
	}
	endpoints, addresses, err := m.endpointSignal(ctx)
	if err != nil {
		return 0, census{}, err
	}
	endpointHosts := distinctHosts(addresses)
	all := []apiServerSignal{leases, endpoints}
	if len(m.APIServerAddresses) > 0 {
		all = append(all, apiServerSignal{source: "addresses named by --apiservers", count: len(m.APIServerAddresses), detail: strings.Join(m.APIServerAddresses, ", ")})
		for _, a := range m.APIServerAddresses {
			if !slices.Contains(addresses, a) {
				addresses = append(addresses, a)
			}
		}
	}
	counted, _ := countAPIServers(all)
	if remembered := m.counted.note(counted); remembered.count > 0 {
		all = append(all, remembered)
	}
	servers, unknown := countAPIServers(all)
	said := make([]string, 0, len(all))
	for _, s := range all {
		said = append(said, s.String())
	}
	c := census{servers: servers, signals: strings.Join(said, "; "), addresses: addresses,
		unseen: unseen(all, servers, endpointHosts, len(m.APIServerAddresses))}
	if servers != 1 {
		klog.FromContext(ctx).V(1).Info("Counted the API servers", "servers", servers, "signals", c.signals, "unknown", unknown)
		return bound, c, nil
	}
	return 0, c, nil
}

// countMemory is the most API servers counted within countMemoryWindow: a
// server that restarts (as each does in a rolling upgrade) takes its
// identity Lease and its address away for a while, and a count of one
// then, with no other signal to disagree, would pass for a control plane
// of one. The last count that showed more stands until the window after
// it passes.
type countMemory struct {
	mu    sync.Mutex
	count int
	at    time.Time
}

// countMemoryWindow is how long a count of API servers is remembered since
// it was last seen: several times the built-in trigger's default interval,
// whose reads of every built-in resource count the servers again, so that
// a quiet cluster's memory has not lapsed when a server restarts.
const countMemoryWindow = time.Hour

// note remembers servers (counted now; 0 when unknown) and returns, as a
// signal, a larger count seen within the window; none otherwise.
func (c *countMemory) note(servers int) apiServerSignal {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if servers >= c.count || now.Sub(c.at) > countMemoryWindow {
		c.count, c.at = servers, now
		return apiServerSignal{}
	}
	return apiServerSignal{source: "API servers counted within the last " + countMemoryWindow.String(), count: c.count,
		detail: "at " + c.at.UTC().Format(time.RFC3339)}
}

// unseen says why restow cannot know that the addresses it has reach every
// one of servers API servers, or "" if it can: every signal was read, and
// one source alone (default/kubernetes's EndpointSlices, at distinct
// hosts, or --apiservers) lists as many addresses as the largest count. A
// union of both is not trusted: a load balancer's address among them, or
// one server named twice, would pass for a server that restow never sees.
func unseen(signals []apiServerSignal, servers, endpointHosts, named int) string {
	for _, s := range signals {
		if s.unknown != "" {
			return "the number of API servers is not known for certain (" + s.String() + ")"
		}
	}
	switch {
	case servers == 0:
		return "no signal lists an API server"
	case endpointHosts >= servers || named >= servers:
		return ""
	case named == 0:
		return fmt.Sprintf("%d API servers counted, %d of them at an address in default/kubernetes's EndpointSlices (name them all with --apiservers)", servers, endpointHosts)
	}
	return fmt.Sprintf("%d API servers counted, %d of them at an address in default/kubernetes's EndpointSlices and %d named by --apiservers (name them all there)", servers, endpointHosts, named)
}

// distinctHosts counts the distinct hosts of host:port addresses.
func distinctHosts(addresses []string) int {
	hosts := map[string]bool{}
	for _, a := range addresses {
		if h, _, err := net.SplitHostPort(a); err == nil {
			hosts[h] = true
		}
	}
	return len(hosts)
}

func (m *Migrator) lagBound() time.Duration {
	if m.LagBound <= 0 {
		return DefaultLagBound
	}
	return m.LagBound
}

// leaseSignal counts kube-apiserver's identity Leases in kube-system. Every
// Lease counts, expired or not: one that looks expired may be a live
// server's seen through a skewed clock, and a dead server's costs only the
// wait until kube-apiserver collects it. A read that fails transiently is a
// *TransientError; any other failure (RBAC) makes the signal unknown.
func (m *Migrator) leaseSignal(ctx context.Context) (apiServerSignal, error) {
	s := apiServerSignal{source: "identity Leases in kube-system"}
	leases := &coordinationv1.LeaseList{}
	err := m.Reader.List(ctx, leases, client.InNamespace(metav1.NamespaceSystem), client.MatchingLabels{identityLeaseLabel: "kube-apiserver"})
	switch {
	case err != nil && classify(err) == transient:
		return s, &TransientError{Err: fmt.Errorf("counting the API servers by their identity Leases in kube-system: %w", err)}
	case err != nil:
		s.unknown = "could not be read: " + Message(err)
	case len(leases.Items) == 0:
		s.unknown = "none, as with APIServerIdentity off"
	default:
		s.count = len(leases.Items)
	}
	return s, nil
}

// endpointSignal counts the distinct addresses in the default/kubernetes
// Service's EndpointSlices, ready or not, and returns each as host:port
// with the Service's https port, for restow to reach each server at.
func (m *Migrator) endpointSignal(ctx context.Context) (apiServerSignal, []string, error) {
	s := apiServerSignal{source: "addresses in default/kubernetes's EndpointSlices"}
	list := &discoveryv1.EndpointSliceList{}
	err := m.Reader.List(ctx, list, client.InNamespace(metav1.NamespaceDefault), client.MatchingLabels{discoveryv1.LabelServiceName: kubernetesService})
	switch {
	case err != nil && classify(err) == transient:
		return s, nil, &TransientError{Err: fmt.Errorf("counting the API servers by the kubernetes Service's EndpointSlices: %w", err)}
	case err != nil:
		s.unknown = "could not be read: " + Message(err)
		return s, nil, nil
	}
	addresses := map[string]bool{}
	var reach []string
	for _, slice := range list.Items {
		port := httpsPort(slice.Ports)
		for _, e := range slice.Endpoints {
			for _, a := range e.Addresses {
				addresses[a] = true
				if hp := net.JoinHostPort(a, strconv.Itoa(int(port))); port > 0 && !slices.Contains(reach, hp) {
					reach = append(reach, hp)
				}
			}
		}
	}
	if len(addresses) == 0 {
		s.silent = true
		return s, nil, nil
	}
	s.count = len(addresses)
	s.detail = strings.Join(slices.Sorted(maps.Keys(addresses)), ", ")
	slices.Sort(reach)
	return s, reach, nil
}

// httpsPort is the port of an EndpointSlice of the kubernetes Service: the
// one named https, or the only one; 0 if it has none.
func httpsPort(ports []discoveryv1.EndpointPort) int32 {
	for _, p := range ports {
		if p.Port != nil && (ptr.Deref(p.Name, "") == "https" || len(ports) == 1) {
			return *p.Port
		}
	}
	return 0
}

// LagMessage says why a migration of target waits until at most switchedBy
// before its first pass, for status and the CLI.
func LagMessage(target Target, switchedBy time.Time) string {
	who := fmt.Sprintf("the control plane runs %d API servers (%s)", target.APIServers, target.APIServerSignals)
	if target.APIServers == 0 {
		who = "the number of API servers is unknown (" + target.APIServerSignals + "), so restow assumes several"
	}
	if len(target.APIServerAddresses) > 0 {
		return fmt.Sprintf("Waiting for every API server to store at %s before the first pass: %s, and each switches when its own informer sees the CRD update; restow reads each server's own discovery at %s, and for any it cannot reach it waits until %s (--apiserver-lag-bound of %s)",
			target.TargetVersion(), who, strings.Join(target.APIServerAddresses, ", "), switchedBy.UTC().Format(time.RFC3339), target.LagWait)
	}
	return fmt.Sprintf("Waiting until %s before the first pass, so that every API server stores at %s: %s, each switches when its own informer sees the CRD update, and with no address to reach each one at, restow assumes none lags more than %s (--apiserver-lag-bound); an answer from a server that has not switched proves nothing",
		switchedBy.UTC().Format(time.RFC3339), target.TargetVersion(), who, target.LagWait)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
