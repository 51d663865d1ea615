package controllers

// The trigger of built-in resources' setup and its requests: it looks at
// every resource at once, at start, every Interval, and whenever the set of
// API servers changes, as their identity Leases and the kubernetes
// Service's addresses show it.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"

	coordinationv1 "k8s.io/api/coordination/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/restow/restow/internal/migrator"
)

// The reconciler's requests: it looks at every resource at once. builtInKey
// comes at start and every Interval; serversKey when an API server's
// identity Lease appears, goes or changes holder, or an address comes to or
// leaves the kubernetes Service's EndpointSlices (a server restow can read
// from then on, as one whose baseline it could not prove waits for).
var (
	builtInKey = reconcile.Request{NamespacedName: client.ObjectKey{Name: "built-in-resources"}}
	serversKey = reconcile.Request{NamespacedName: client.ObjectKey{Name: "api-servers"}}
)

// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=watch
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=watch
// +kubebuilder:rbac:groups=apiregistration.k8s.io,resources=apiservices,verbs=list
// +kubebuilder:rbac:urls=/metrics,verbs=get

// SetupWithManager registers the reconciler, with informers of its own of
// the identity Leases in kube-system and of default/kubernetes's
// EndpointSlices (the manager's cache would watch every Lease of the
// cluster, nodes' heartbeats among them, and every EndpointSlice).
func (r *BuiltInMigrationReconciler) SetupWithManager(mgr ctrl.Manager) error {
	switch {
	case r.Client == nil, r.APIReader == nil, r.Discovery == nil, r.Leases == nil, r.Recorder == nil, r.Wake == nil, r.Idle == nil, r.Sweep == nil:
		return errors.New("BuiltInMigrationReconciler needs Client, APIReader, Discovery, Leases, Recorder, Wake, Idle and Sweep")
	case r.Interval <= 0:
		return errors.New("BuiltInMigrationReconciler needs Interval > 0")
	}
	for _, p := range r.Exclude {
		if _, err := path.Match(p, ""); err != nil {
			return fmt.Errorf("excluded resource pattern %q: %w", p, err)
		}
	}
	leases := toolscache.NewSharedIndexInformer(toolscache.NewFilteredListWatchFromClient(
		r.Leases.CoordinationV1().RESTClient(), "leases", metav1.NamespaceSystem,
		func(o *metav1.ListOptions) { o.LabelSelector = migrator.IdentityLeaseSelector },
	), &coordinationv1.Lease{}, 0, toolscache.Indexers{})
	addresses := toolscache.NewSharedIndexInformer(toolscache.NewFilteredListWatchFromClient(
		r.Leases.DiscoveryV1().RESTClient(), "endpointslices", metav1.NamespaceDefault,
		func(o *metav1.ListOptions) { o.LabelSelector = discoveryv1.LabelServiceName + "=kubernetes" },
	), &discoveryv1.EndpointSlice{}, 0, toolscache.Indexers{})
	for _, informer := range []toolscache.SharedIndexInformer{leases, addresses} {
		if err := mgr.Add(leaderRunnable(func(ctx context.Context) error {
			informer.RunWithContext(ctx)
			return nil
		})); err != nil {
			return err
		}
	}
	// One event at start, whatever the Leases say.
	start := make(chan event.GenericEvent, 1)
	start <- event.GenericEvent{Object: &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: builtInKey.Name}}}
	to := func(key reconcile.Request) handler.EventHandler {
		return handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request { return []reconcile.Request{key} })
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("builtinmigration").
		WatchesRawSource(source.Channel(start, to(builtInKey))).
		WatchesRawSource(&source.Informer{Informer: leases, Handler: to(serversKey), Predicates: []predicate.Predicate{serverChanged}}).
		WatchesRawSource(&source.Informer{Informer: addresses, Handler: to(serversKey), Predicates: []predicate.Predicate{addressesChanged}}).
		Complete(r)
}

// serverChanged passes a Lease that appears or goes, and one whose holder
// changed (a server that restarted, after an upgrade among others), not
// its renewals every ten seconds.
var serverChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		before, after := e.ObjectOld.(*coordinationv1.Lease), e.ObjectNew.(*coordinationv1.Lease)
		return ptr.Deref(before.Spec.HolderIdentity, "") != ptr.Deref(after.Spec.HolderIdentity, "")
	},
}

// addressesChanged passes an EndpointSlice that appears or goes, and one
// whose set of addresses changed, not a change of conditions alone.
var addressesChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		return !slices.Equal(sliceAddresses(e.ObjectOld), sliceAddresses(e.ObjectNew))
	},
}

// sliceAddresses are an EndpointSlice's addresses, sorted.
func sliceAddresses(o runtime.Object) []string {
	slice, ok := o.(*discoveryv1.EndpointSlice)
	if !ok {
		return nil
	}
	set := map[string]bool{}
	for _, e := range slice.Endpoints {
		for _, a := range e.Addresses {
			set[a] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// leaderRunnable runs fn on the leader only.
type leaderRunnable func(ctx context.Context) error

func (f leaderRunnable) Start(ctx context.Context) error { return f(ctx) }
func (leaderRunnable) NeedLeaderElection() bool          { return true }

var _ manager.LeaderElectionRunnable = leaderRunnable(nil)
