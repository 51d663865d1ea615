package migrator

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The lag bound: when every API server stores at the new version.
//
// A production control plane runs several kube-apiservers on one etcd, and
// each switches a CRD's storage version when its own CRD informer sees the
// update. Until then it stores the CRD's objects at the old version, and it
// answers a write of an unchanged object stored at the old version with
// "unchanged" (the bytes it would write equal etcd's). No API says which
// server answered a request or whether every server has switched (the
// StorageVersion API never covered CRDs), so nothing such a server may have
// answered can count as proof: not a write's answer, not "already stored",
// not a list snapshot taken meanwhile, not the readiness gate's discovery
// read (which one server answered). restow relies on a stated bound instead:
// every API server switches within LagBound of the CRD update. Resolve reads
// the CRD live before it takes the migration's StartTime, so by StartTime +
// LagBound every server has switched; the first pass starts only then, and
// the settle window counts from then, so that a write that began on a late
// server's old storage has ended before the prune. Nothing is proven before
// the bound, so nothing needs proving again after it; the cost is time, not
// requests.
//
// A control plane of one API server has no lag to wait for, and its first
// pass starts informerLag after the gate, as it always did: Resolve counts
// the API servers by their identity Leases in kube-system, and treats a count
// it cannot read, or of none, as several. API servers that share a host name
// share one identity Lease (kube-apiserver names it after a hash of the host
// name), so such a control plane looks like one server: Migrator.AssumeSeveral
// turns the count off.

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
)

// lagWait is how long after Resolve saw the switch the last API server may
// switch too (zero with one API server), and how many API servers Resolve
// found (0 when it could not tell, with why).
//
// A read that fails transiently is a *TransientError: treated as several
// servers, it would refuse a checkpoint taken with the count of one and make
// the pass start over each time it happens. Any other failure (RBAC) is
// stable, and means several.
func (m *Migrator) lagWait(ctx context.Context) (wait time.Duration, servers int, unknown string, err error) {
	bound := m.LagBound
	if bound <= 0 {
		bound = DefaultLagBound
	}
	if m.AssumeSeveral {
		return bound, 0, "the count of identity Leases is turned off (--assume-several-apiservers)", nil
	}
	leases := &coordinationv1.LeaseList{}
	err = m.Reader.List(ctx, leases, client.InNamespace(metav1.NamespaceSystem), client.MatchingLabels{identityLeaseLabel: "kube-apiserver"})
	switch {
	case err != nil && classify(err) == transient:
		return 0, 0, "", &TransientError{Err: fmt.Errorf("counting the API servers by their identity Leases in kube-system: %w", err)}
	case err != nil:
		klog.FromContext(ctx).V(1).Info("Could not count the API servers; assuming several", "error", Message(err))
		return bound, 0, "their identity Leases in kube-system could not be read: " + Message(err), nil
	case len(leases.Items) == 0:
		return bound, 0, "kube-system holds no identity Lease of an API server", nil
	case len(leases.Items) == 1:
		return 0, 1, "", nil
	}
	// Every Lease counts, expired or not: one that looks expired may be a
	// live server's seen through a skewed clock, and a dead server's costs
	// only the wait until kube-apiserver collects it.
	return bound, len(leases.Items), "", nil
}

// LagMessage says why a migration of target waits until switchedBy before
// its first pass, for status and the CLI.
func LagMessage(target Target, switchedBy time.Time) string {
	who := fmt.Sprintf("the control plane runs %d API servers (identity Leases in kube-system)", target.APIServers)
	if target.APIServers == 0 {
		who = "the number of API servers is unknown (" + target.APIServersUnknown + "), so restow assumes several"
	}
	return fmt.Sprintf("Waiting until %s before the first pass, so that every API server stores at %s: %s, each switches when its own informer sees the CRD update, and restow assumes none lags more than %s (--apiserver-lag-bound); an answer from a server that has not switched proves nothing",
		switchedBy.UTC().Format(time.RFC3339), target.TargetVersion(), who, target.LagWait)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
