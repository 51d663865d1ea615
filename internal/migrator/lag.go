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
// A control plane of one API server pays only informerLag: Resolve counts
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
	// informerLag is the wait on a control plane of one API server, where the
	// server that answered the readiness gate is the one that answers every
	// request: a margin for its informer and its handler to agree.
	informerLag = time.Second
	// identityLeaseLabel marks kube-apiserver's identity Leases in kube-system.
	identityLeaseLabel = "apiserver.kubernetes.io/identity"
)

// lagWait is how long after Resolve saw the switch a migration of a CRD's
// objects waits before its first pass, and how many API servers Resolve
// found (0 when it could not tell, with why).
func (m *Migrator) lagWait(ctx context.Context) (wait time.Duration, servers int, unknown string) {
	bound := m.LagBound
	if bound <= 0 {
		bound = DefaultLagBound
	}
	if m.AssumeSeveral {
		return bound, 0, "the count of identity Leases is turned off (--assume-several-apiservers)"
	}
	servers, err := m.countAPIServers(ctx)
	switch {
	case err != nil:
		klog.FromContext(ctx).V(1).Info("Could not count the API servers; assuming several", "error", Message(err))
		return bound, 0, "their identity Leases in kube-system could not be read: " + Message(err)
	case servers == 0:
		return bound, 0, "kube-system holds no live identity Lease of an API server"
	case servers == 1:
		return informerLag, 1, ""
	}
	return bound, servers, ""
}

// countAPIServers counts the kube-apiserver identity Leases in kube-system
// that are still held: each running API server renews its own.
func (m *Migrator) countAPIServers(ctx context.Context) (int, error) {
	leases := &coordinationv1.LeaseList{}
	err := m.Reader.List(ctx, leases, client.InNamespace(metav1.NamespaceSystem), client.MatchingLabels{identityLeaseLabel: "kube-apiserver"})
	if err != nil {
		return 0, err
	}
	now := time.Now()
	n := 0
	for _, l := range leases.Items {
		if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
			continue
		}
		if l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second).After(now) {
			n++
		}
	}
	return n, nil
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
