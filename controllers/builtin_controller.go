package controllers

import (
	"context"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/migrator"
)

// BuiltInMigrationReconciler keeps a StorageMigration for every built-in
// resource (served by kube-apiserver itself, not from a CRD or an aggregated
// API) that restow can migrate, so that a control-plane upgrade that moves
// one's storage version gets its objects re-stored without anyone asking.
//
// It creates them with spec.firstPass Skip: at first sight the
// StorageMigration records the storage version the API servers store at as
// its baseline and rewrites nothing (restow cannot know what earlier
// releases stored; kubectl restow verify can). It reads discovery at start,
// when an API server's identity Lease appears, goes or changes holder (a
// server on a new host; one restarted in place keeps its Lease, so the
// period sees an in-place upgrade) and every Interval, and wakes the StorageMigrations whose
// resource's storageVersionHash moved from the one they recorded; the
// StorageMigration controller then waits for every API server to store at
// the new version before the pass. It deletes only the StorageMigrations it
// made, once their resource is gone from discovery.
type BuiltInMigrationReconciler struct {
	Client client.Client
	// APIReader lists APIServices live.
	APIReader client.Reader
	// Discovery reads the API servers' discovery, uncached.
	Discovery discovery.DiscoveryInterface
	// Leases lists and watches the API servers' identity Leases.
	Leases   kubernetes.Interface
	Recorder events.EventRecorder
	// Exclude holds resource.group patterns (path.Match syntax, "events"
	// for the core group's) of resources left alone.
	Exclude []string
	// ReEncrypt names the resources re-encrypted after an encryption key
	// rotation: each gets its StorageMigration whatever Exclude says, and
	// with ReEncryptOnly (--auto-migrate-builtins off) they alone do.
	ReEncrypt     []schema.GroupResource
	ReEncryptOnly bool
	// Interval is how often discovery is read when nothing else says to.
	Interval time.Duration
	// Wake reaches the StorageMigration controller.
	Wake chan<- event.GenericEvent
	// Idle returns once no pass rewrites (migrator.Migrator's WaitIdle).
	Idle func(context.Context) error
	// Sweep reads every API server's own discovery of the group versions
	// (migrator.Migrator's SweepServerHashes).
	Sweep func(context.Context, []schema.GroupVersion) (migrator.ServerHashes, error)

	// FirstLook, when set, returns once the automatic migration of CRDs
	// has looked at each CRD once (AutoMigrationReconciler's FirstLook),
	// and Due says whether a StorageMigration someone asked for waits to
	// start (StorageMigrationReconciler's due): the first sweep waits for
	// both, for a migration about to begin has not yet entered the gate
	// Idle waits on.
	FirstLook func(context.Context) error
	Due       func(context.Context) bool
	// warm is set once the first sweep has waited for them.
	warm atomic.Bool

	// seen, when set, receives each sweep, for the StorageMigration
	// controller to leave resources that did not move alone.
	seen *sweptHashes

	// missing counts, per StorageMigration it made, the complete reads in
	// a row that did not list its resource (one worker: no lock needed).
	missing map[string]int
}

// DefaultBuiltInInterval is how often the built-in resources' discovery is
// read by default, as kube-storage-version-migrator's trigger polls.
const DefaultBuiltInInterval = 10 * time.Minute

// DefaultEncryptionCheckInterval is how often, by default, the
// StorageMigration of a resource restow re-encrypts reads every API server's
// encryption state: a reload there is re-encrypted within about a minute.
// kube-apiserver itself reads its configuration file for changes every
// minute, and asks a KMS v2 plugin for its key ID every minute.
const DefaultEncryptionCheckInterval = 30 * time.Second

// DefaultBuiltInExclude is what --auto-migrate-builtins-exclude leaves alone
// by default: Events live an hour and are written once.
var DefaultBuiltInExclude = []string{"events", "events.events.k8s.io"}

// Reconcile reads discovery, creates the StorageMigrations of resources
// seen for the first time, and deletes its own whose resource is gone. It
// wakes each StorageMigration of a built-in resource whose recorded
// storageVersionHash any API server no longer publishes: the read through
// the usual client reaches one server, maybe one not upgraded yet, so it
// sweeps every server's own discovery too (one request per group version
// and server), and wakes every StorageMigration that recorded a hash when
// it cannot read every server. One that nothing moved costs no request.
func (r *BuiltInMigrationReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if err := r.backgroundTurn(ctx); err != nil {
		return ctrl.Result{}, err
	}
	found, groupVersions, complete, err := r.discover(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	servers, err := r.Sweep(ctx, groupVersions)
	if err != nil {
		// Not every server was read: nothing shows that none moved, so
		// every StorageMigration that recorded a hash is woken.
		servers = migrator.ServerHashes{Unseen: migrator.Message(err)}
	}
	if r.seen != nil {
		r.seen.publish(found, servers)
	}
	var all migrationv1alpha1.StorageMigrationList
	if err := r.Client.List(ctx, &all); err != nil {
		return ctrl.Result{}, err
	}
	covered := byResource(all.Items)
	log := ctrl.LoggerFrom(ctx)
	for _, res := range found {
		if res.skip != "" {
			log.V(1).Info("Leaving a built-in resource alone", "resource", res.gr.String(), "reason", res.skip)
			continue
		}
		if len(covered[res.gr]) == 0 {
			if err := r.create(ctx, res, servers); err != nil {
				return ctrl.Result{}, err
			}
			continue
		}
		if err := r.wakeMoved(ctx, res, covered[res.gr], servers); err != nil {
			return ctrl.Result{}, err
		}
	}
	if complete {
		if err := r.retire(ctx, all.Items, found); err != nil {
			return ctrl.Result{}, err
		}
		r.sayUnknownReEncrypted(ctx, found)
	}
	if req == serversKey {
		// builtInKey keeps the period.
		return ctrl.Result{}, nil
	}
	return ctrl.Result{RequeueAfter: r.Interval}, nil
}

// backgroundTurn waits while a migration is under way, for at most
// backgroundDeferMax (warming up first, once): discovery's sweep is
// background work. It returns ctx's error once ctx has ended.
func (r *BuiltInMigrationReconciler) backgroundTurn(ctx context.Context) error {
	if !r.warm.Swap(true) {
		warm, cancel := context.WithTimeout(ctx, backgroundDeferMax)
		r.warmUp(warm)
		cancel()
	}
	idle, cancel := context.WithTimeout(ctx, backgroundDeferMax)
	_ = r.Idle(idle)
	cancel()
	return ctx.Err()
}

// byResource groups StorageMigrations by the resource they cover.
func byResource(items []migrationv1alpha1.StorageMigration) map[schema.GroupResource][]*migrationv1alpha1.StorageMigration {
	covered := map[schema.GroupResource][]*migrationv1alpha1.StorageMigration{}
	for i := range items {
		sm := &items[i]
		gr := schema.GroupResource{Group: sm.Spec.Resource.Group, Resource: sm.Spec.Resource.Resource}
		covered[gr] = append(covered[gr], sm)
	}
	return covered
}

// sayUnknownReEncrypted logs the resources --reencrypt-resources names
// that a complete discovery read does not list among the built-in ones: a
// misspelt name, or a resource served from a CRD, whose objects restow
// does not re-encrypt on its own.
func (r *BuiltInMigrationReconciler) sayUnknownReEncrypted(ctx context.Context, found []builtIn) {
	var unknown []string
	for _, gr := range r.ReEncrypt {
		if !slices.ContainsFunc(found, func(b builtIn) bool { return b.gr == gr }) {
			unknown = append(unknown, gr.String())
		}
	}
	if len(unknown) > 0 {
		ctrl.LoggerFrom(ctx).Info("--reencrypt-resources names resources that are not built-in resources the API servers serve; restow re-encrypts none of them",
			"resources", unknown)
	}
}

// wakeMoved wakes each of the StorageMigrations of res whose recorded
// storageVersionHash the usual read or some API server's own discovery
// (servers) no longer shows, or every one that recorded a hash when not
// every server was read.
func (r *BuiltInMigrationReconciler) wakeMoved(ctx context.Context, res builtIn, migrations []*migrationv1alpha1.StorageMigration, servers migrator.ServerHashes) error {
	for _, sm := range migrations {
		recorded := recordedHash(sm)
		if recorded == "" && sm.Status.LastPass == nil {
			// Nothing recorded yet: what it first saw is watched as if
			// recorded, and without that its own first reconcile decides.
			if recorded = sm.Annotations[migrationv1alpha1.FirstSeenHashAnnotation]; recorded == "" {
				continue
			}
		}
		if recorded != "" && recorded != res.hash {
			ctrl.LoggerFrom(ctx).Info("The storage version of a built-in resource moved", "resource", res.gr.String(), "storageMigration", klog.KObj(sm),
				"recorded", recorded, "now", res.hash)
		}
		if recorded == res.hash && !servers.Moved(res.gr, recorded) && !unprovenBaseline(sm) {
			// Every API server still publishes the hash it recorded, and
			// showed it: nothing to look at, and no request for it.
			continue
		}
		if err := r.wake(ctx, sm); err != nil {
			return err
		}
	}
	return nil
}

// recordedHash is the storageVersionHash sm's resource was last stored at,
// by its last pass or its baseline; "" when it recorded none.
func recordedHash(sm *migrationv1alpha1.StorageMigration) string {
	switch {
	case sm.Status.LastPass != nil && sm.Status.LastPass.StorageVersionHash != "":
		return sm.Status.LastPass.StorageVersionHash
	case sm.Status.Baseline != nil:
		return sm.Status.Baseline.StorageVersionHash
	}
	return ""
}

func (r *BuiltInMigrationReconciler) wake(ctx context.Context, sm *migrationv1alpha1.StorageMigration) error {
	select {
	case r.Wake <- event.GenericEvent{Object: sm.DeepCopy()}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// create makes the StorageMigration of a built-in resource seen for the
// first time, named after it. When every API server publishes one hash for
// it (servers), that hash is its first sight (FirstSeenHashAnnotation):
// its baseline, whenever it is recorded.
func (r *BuiltInMigrationReconciler) create(ctx context.Context, res builtIn, servers migrator.ServerHashes) error {
	sm := &migrationv1alpha1.StorageMigration{
		ObjectMeta: metav1.ObjectMeta{
			Name: res.gr.String(),
			Labels: map[string]string{
				migrationv1alpha1.AutomaticLabel: "true",
				migrationv1alpha1.BuiltInLabel:   "true",
			},
		},
		Spec: migrationv1alpha1.StorageMigrationSpec{
			Resource:  migrationv1alpha1.GroupResource{Group: res.gr.Group, Resource: res.gr.Resource},
			FirstPass: migrationv1alpha1.FirstPassSkip,
		},
	}
	if res.hash != "" && !servers.Moved(res.gr, res.hash) {
		sm.Annotations = map[string]string{migrationv1alpha1.FirstSeenHashAnnotation: res.hash}
	}
	err := r.Client.Create(ctx, sm)
	switch {
	case err == nil:
		ctrl.LoggerFrom(ctx).Info("Created the automatic StorageMigration of a built-in resource", "storageMigration", klog.KObj(sm))
		r.Recorder.Eventf(sm, nil, corev1.EventTypeNormal, "AutomaticMigrationCreated", "AutoMigrate",
			"Created for built-in resource %s: it records the storage version the API servers store at as its baseline, and re-stores the objects when that changes", res.gr)
		return nil
	case apierrors.IsAlreadyExists(err):
		// Not in the cache yet (a sweep soon after the one that created
		// it: the usual case, hence debug), or another resource's of that
		// name: the StorageMigration of that name says which.
		ctrl.LoggerFrom(ctx).V(1).Info("A StorageMigration named after a built-in resource exists", "storageMigration", klog.KObj(sm))
		return nil
	}
	return err
}

// retire deletes the StorageMigrations this reconciler made whose resource
// discovery no longer lists (a release that removed an API) in
// retireAfter complete reads in a row, not one: a server that is starting
// may list less without an error. It leaves any other alone.
func (r *BuiltInMigrationReconciler) retire(ctx context.Context, all []migrationv1alpha1.StorageMigration, found []builtIn) error {
	missing := map[string]int{}
	for i := range all {
		sm := &all[i]
		gr := schema.GroupResource{Group: sm.Spec.Resource.Group, Resource: sm.Spec.Resource.Resource}
		if !isBuiltInAutomatic(sm) || slices.ContainsFunc(found, func(b builtIn) bool { return b.gr == gr }) {
			continue
		}
		if missing[sm.Name] = r.missing[sm.Name] + 1; missing[sm.Name] < retireAfter {
			continue
		}
		retired := &migrationv1alpha1.StorageMigration{ObjectMeta: metav1.ObjectMeta{Name: sm.Name}}
		if err := r.Client.Delete(ctx, retired, client.Preconditions{UID: &sm.UID}); client.IgnoreNotFound(err) != nil {
			return err
		}
		ctrl.LoggerFrom(ctx).Info("Deleted the automatic StorageMigration of a built-in resource the API servers no longer serve", "storageMigration", klog.KObj(sm))
		delete(missing, sm.Name)
	}
	r.missing = missing
	return nil
}

// retireAfter is how many complete reads of discovery in a row must miss a
// resource before its automatic StorageMigration is deleted.
const retireAfter = 3

// isBuiltInAutomatic tells whether restow made sm for a built-in resource.
func isBuiltInAutomatic(sm *migrationv1alpha1.StorageMigration) bool {
	return sm.Labels[migrationv1alpha1.AutomaticLabel] == "true" && sm.Labels[migrationv1alpha1.BuiltInLabel] == "true"
}

// builtIn is a resource discovery lists, with the storageVersionHash it
// publishes, and why restow leaves it alone if it does.
type builtIn struct {
	gr   schema.GroupResource
	hash string
	skip string
}

// discover lists the resources that kube-apiserver serves itself, from
// aggregated discovery (one request) and the discovery document of each of
// their group versions, which alone carries storageVersionHash; read are
// the group versions whose document it read. complete says every group
// version was read: only then may a resource missing from the list be
// taken as gone.
func (r *BuiltInMigrationReconciler) discover(ctx context.Context) (found []builtIn, read []schema.GroupVersion, complete bool, err error) {
	groups, err := r.Discovery.ServerGroups()
	if err != nil {
		return nil, nil, false, fmt.Errorf("reading discovery: %w", err)
	}
	aggregated, err := r.aggregatedGroupVersions(ctx)
	if err != nil {
		return nil, nil, false, err
	}
	crds, err := r.crdResources(ctx)
	if err != nil {
		return nil, nil, false, err
	}
	complete = true
	seen := map[schema.GroupResource]bool{}
	for _, g := range groups.Groups {
		for _, v := range g.Versions {
			if aggregated[v.GroupVersion] {
				continue
			}
			resources, err := r.Discovery.ServerResourcesForGroupVersion(v.GroupVersion)
			if err != nil {
				ctrl.LoggerFrom(ctx).Info("Cannot read a group version's discovery", "groupVersion", v.GroupVersion, "error", err.Error())
				complete = false
				continue
			}
			if gv, err := schema.ParseGroupVersion(v.GroupVersion); err == nil {
				read = append(read, gv)
			}
			for _, res := range resources.APIResources {
				gr := schema.GroupResource{Group: g.Name, Resource: res.Name}
				if strings.Contains(res.Name, "/") || seen[gr] || crds[gr] {
					continue
				}
				seen[gr] = true
				found = append(found, builtIn{gr: gr, hash: res.StorageVersionHash, skip: r.skips(gr, res)})
			}
		}
	}
	return found, read, complete, nil
}

// skips says why restow leaves a built-in resource alone, or "".
func (r *BuiltInMigrationReconciler) skips(gr schema.GroupResource, res metav1.APIResource) string {
	reEncrypted := slices.Contains(r.ReEncrypt, gr)
	if r.ReEncryptOnly && !reEncrypted {
		return "--auto-migrate-builtins is off, and --reencrypt-resources does not name it"
	}
	for _, p := range r.Exclude {
		if ok, _ := path.Match(p, gr.String()); ok && !reEncrypted {
			return "excluded by --auto-migrate-builtins-exclude (" + p + ")"
		}
	}
	switch {
	case res.StorageVersionHash == "":
		return "discovery publishes no storageVersionHash: the API server stores no objects of it in etcd"
	case !slices.Contains(res.Verbs, "list") || !slices.Contains(res.Verbs, "patch"):
		return fmt.Sprintf("its verbs %v do not include list and patch, which a pass needs", res.Verbs)
	}
	return ""
}

// aggregatedGroupVersions are the group versions an APIService sends to
// another server (spec.service set): their objects are not in the API
// servers' etcd, and restow never touches them.
func (r *BuiltInMigrationReconciler) aggregatedGroupVersions(ctx context.Context) (map[string]bool, error) {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiregistration.k8s.io", Version: "v1", Kind: "APIServiceList"})
	if err := r.APIReader.List(ctx, list); err != nil {
		return nil, fmt.Errorf("listing APIServices: %w", err)
	}
	aggregated := map[string]bool{}
	for _, s := range list.Items {
		if service, _, _ := unstructured.NestedMap(s.Object, "spec", "service"); service != nil {
			group, _, _ := unstructured.NestedString(s.Object, "spec", "group")
			version, _, _ := unstructured.NestedString(s.Object, "spec", "version")
			aggregated[schema.GroupVersion{Group: group, Version: version}.String()] = true
		}
	}
	return aggregated, nil
}

// crdResources are the resources served from CRDs: the automatic trigger
// of CRDs has those.
func (r *BuiltInMigrationReconciler) crdResources(ctx context.Context) (map[schema.GroupResource]bool, error) {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinitionList"})
	if err := r.Client.List(ctx, list); err != nil {
		return nil, fmt.Errorf("listing CRDs: %w", err)
	}
	crds := map[schema.GroupResource]bool{}
	for _, crd := range list.Items {
		crds[schema.ParseGroupResource(crd.Name)] = true
	}
	return crds, nil
}
