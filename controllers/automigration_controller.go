package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/storedversions"
	"github.com/restow/restow/internal/svm"
)

// AutoMigrationReconciler ensures that a StorageMigration exists for every CRD
// whose status.storedVersions lists more than its storage version, so that
// switching a CRD's storage version is enough to get every object re-stored
// and storedVersions pruned.
//
// It only ever creates StorageMigrations named after the CRD, labelled
// AutomaticLabel and owned by the CRD, and only ever deletes such a
// StorageMigration when one made by someone else covers the same resource.
// It never changes a StorageMigration, so it does not fight a GitOps tool.
type AutoMigrationReconciler struct {
	Client client.Client
	// APIReader reads CRDs live: the cache holds their metadata only.
	APIReader client.Reader
	Recorder  events.EventRecorder
	// Selector limits automatic migration to the CRDs whose labels match;
	// nil selects every CRD.
	Selector labels.Selector
	// Standard, when set, holds the standard StorageVersionMigrations: the
	// trigger leaves a resource that one of them is migrating to it.
	Standard *StandardMigrations
	// Wake, when set, hands each StorageMigration the trigger creates to the
	// StorageMigration controller at once, rather than through the
	// controller's watch: that watch may run through an API server whose
	// watch lags, as the CRD event that led here did, and a second lag
	// would be waited out before the pass could even begin.
	Wake chan<- event.GenericEvent

	// looked holds the names of the CRDs reconciled at least once, and
	// created those of the StorageMigrations created, for FirstLook.
	looked, created sync.Map

	// heldBack remembers, per CRD, the StorageVersionMigration the trigger
	// last said it held back for, so the event is sent once.
	heldBack sync.Map
}

// +kubebuilder:rbac:groups=migration.restow.dev,resources=storagemigrations,verbs=get;list;watch;create;delete

// SetupWithManager registers the reconciler. It watches CRDs as metadata only
// (their schemas can be large) and StorageMigrations being created or
// deleted, which may change whether a CRD is covered.
func (r *AutoMigrationReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil || r.APIReader == nil || r.Recorder == nil {
		return errors.New("AutoMigrationReconciler needs Client, APIReader and Recorder")
	}
	if r.Selector == nil {
		r.Selector = labels.Everything()
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named("automigration").
		For(&apiextensionsv1.CustomResourceDefinition{}, builder.OnlyMetadata, builder.WithPredicates(predicate.NewPredicateFuncs(r.mayMigrate))).
		Watches(&migrationv1alpha1.StorageMigration{},
			handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
				return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: crdName(o.(*migrationv1alpha1.StorageMigration))}}}
			}),
			builder.WithPredicates(predicate.Funcs{
				UpdateFunc:  func(event.UpdateEvent) bool { return false },
				GenericFunc: func(event.GenericEvent) bool { return false },
			}))
	if r.Standard != nil {
		// A standard migration that starts or ends may change the decision.
		b = b.Watches(svm.New(r.Standard.Version), handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: standardResource(o).String()}}}
		}), builder.WithPredicates(standardStateChanged))
	}
	return b.Complete(r)
}

// mayMigrate filters CRD events on metadata, sparing a live read of CRDs that
// are opted out or not selected. Reconcile decides again on the live object.
func (r *AutoMigrationReconciler) mayMigrate(o client.Object) bool {
	return !optedOut(o) && r.Selector.Matches(labels.Set(o.GetLabels()))
}

func optedOut(o metav1.Object) bool {
	return o.GetAnnotations()[migrationv1alpha1.AutoMigrateAnnotation] == "false"
}

// Reconcile reads the CRD live, decides, and creates or retires the
// automatic StorageMigration.
func (r *AutoMigrationReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	defer r.looked.Store(req.Name, struct{}{})
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := r.APIReader.Get(ctx, req.NamespacedName, crd); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	var all migrationv1alpha1.StorageMigrationList
	// Read-only use of the cached objects: no copy needed.
	if err := r.Client.List(ctx, &all, client.UnsafeDisableDeepCopy); err != nil {
		return ctrl.Result{}, err
	}
	var covering []*migrationv1alpha1.StorageMigration
	for i := range all.Items {
		if crdName(&all.Items[i]) == crd.Name {
			covering = append(covering, &all.Items[i])
		}
	}

	standard, err := r.Standard.active(ctx, schema.GroupResource{Group: crd.Spec.Group, Resource: crd.Spec.Names.Plural})
	if err != nil {
		return ctrl.Result{}, err
	}
	d := decideAutoMigration(crd, r.Selector, covering, standard)
	log := ctrl.LoggerFrom(ctx)
	if d.action != autoHoldBack {
		r.heldBack.Delete(crd.Name)
	}
	switch d.action {
	case autoCreate:
		return ctrl.Result{}, r.create(ctx, crd)
	case autoHoldBack:
		if said, _ := r.heldBack.Swap(crd.Name, standard.Name); said != standard.Name {
			log.Info("Holding back the automatic StorageMigration", "reason", d.why)
			r.Recorder.Eventf(crd, nil, corev1.EventTypeNormal, "AutomaticMigrationHeldBack", "AutoMigrate",
				"Not creating a StorageMigration: %s. restow creates one if that migration ends and status.storedVersions still lists old versions (--defer-to-storage-version-migrations=false migrates regardless)", d.why)
		}
	case autoRetire:
		for _, sm := range d.retire {
			// A fresh object: sm belongs to the cache and must not be handed to a write.
			retired := &migrationv1alpha1.StorageMigration{ObjectMeta: metav1.ObjectMeta{Name: sm.Name}}
			if err := r.Client.Delete(ctx, retired, client.Preconditions{UID: &sm.UID}); client.IgnoreNotFound(err) != nil {
				return ctrl.Result{}, err
			}
			log.Info("Deleted the automatic StorageMigration: another one covers the resource", "storageMigration", klog.KObj(sm))
			r.Recorder.Eventf(crd, nil, corev1.EventTypeNormal, "AutomaticMigrationRetired", "AutoMigrate",
				"Deleted the automatic StorageMigration %s: %s", sm.Name, d.why)
		}
	default:
		log.V(1).Info("No automatic StorageMigration needed", "reason", d.why)
	}
	return ctrl.Result{}, nil
}

// FirstLook returns once every CRD in the manager's cache that the trigger
// may migrate has been reconciled at least once, and every StorageMigration
// it created is in the cache (where StorageMigrationReconciler's due sees
// it), or with ctx's error. It reads the cache only.
func (r *AutoMigrationReconciler) FirstLook(ctx context.Context) error {
	var crds metav1.PartialObjectMetadataList
	crds.SetGroupVersionKind(apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinitionList"))
	if err := r.Client.List(ctx, &crds); err != nil {
		return err
	}
	return wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(context.Context) (bool, error) {
		for i := range crds.Items {
			if _, ok := r.looked.Load(crds.Items[i].Name); !ok && r.mayMigrate(&crds.Items[i]) {
				return false, nil
			}
		}
		cached := true
		r.created.Range(func(name, _ any) bool {
			err := r.Client.Get(ctx, client.ObjectKey{Name: name.(string)}, &migrationv1alpha1.StorageMigration{})
			cached = !apierrors.IsNotFound(err)
			return cached
		})
		return cached, nil
	})
}

// create makes the automatic StorageMigration of crd. If a StorageMigration
// of that name already exists, it is either this CRD's (the cache had not
// seen it yet) or another resource's, which the user is told about.
func (r *AutoMigrationReconciler) create(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition) error {
	sm := &migrationv1alpha1.StorageMigration{
		ObjectMeta: metav1.ObjectMeta{
			Name:   crd.Name,
			Labels: map[string]string{migrationv1alpha1.AutomaticLabel: "true"},
		},
		Spec: migrationv1alpha1.StorageMigrationSpec{
			Resource: migrationv1alpha1.GroupResource{Group: crd.Spec.Group, Resource: crd.Spec.Names.Plural},
		},
	}
	// A plain owner reference, not a controller one with blockOwnerDeletion:
	// the garbage collector deletes the StorageMigration with its CRD either
	// way, and blocking would need update on customresourcedefinitions/finalizers.
	if err := controllerutil.SetOwnerReference(crd, sm, r.Client.Scheme()); err != nil {
		return err
	}
	err := r.Client.Create(ctx, sm)
	switch {
	case err == nil:
		r.created.Store(sm.Name, struct{}{})
		ctrl.LoggerFrom(ctx).Info("Created the automatic StorageMigration", "storageMigration", klog.KObj(sm),
			"storedVersions", crd.Status.StoredVersions, "storageVersion", storedversions.StorageVersion(crd))
		r.Recorder.Eventf(crd, nil, corev1.EventTypeNormal, "AutomaticMigrationCreated", "AutoMigrate",
			"Created StorageMigration %s: status.storedVersions is %v and the storage version is %s",
			sm.Name, crd.Status.StoredVersions, storedversions.StorageVersion(crd))
		if r.Wake == nil {
			return nil
		}
		select {
		case r.Wake <- event.GenericEvent{Object: sm}:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	case !apierrors.IsAlreadyExists(err):
		return err
	}
	existing := &migrationv1alpha1.StorageMigration{}
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(sm), existing); err != nil {
		// Not in the cache yet (or gone again): the next event decides anew.
		return client.IgnoreNotFound(err)
	}
	if crdName(existing) != crd.Name {
		r.Recorder.Eventf(crd, nil, corev1.EventTypeWarning, "AutomaticMigrationNameTaken", "AutoMigrate",
			"Cannot create StorageMigration %s: one of that name exists for %s. Create a StorageMigration for this CRD under another name",
			sm.Name, crdName(existing))
	}
	return nil
}

type autoAction int

const (
	autoNothing autoAction = iota
	autoCreate
	autoRetire
	// autoHoldBack: a StorageMigration would be created, but a standard
	// StorageVersionMigration is migrating the resource.
	autoHoldBack
)

// autoDecision is what the automatic trigger does for one CRD, and why.
type autoDecision struct {
	action autoAction
	why    string
	// retire holds the automatic StorageMigrations to delete.
	retire []*migrationv1alpha1.StorageMigration
}

// decideAutoMigration decides for a CRD read live, given the
// StorageMigrations whose resource is the CRD's and the standard
// StorageVersionMigration that is migrating it, if any (nil when none, or
// when the trigger does not defer to them).
func decideAutoMigration(crd *apiextensionsv1.CustomResourceDefinition, selector labels.Selector, covering []*migrationv1alpha1.StorageMigration, standard *svm.Migration) autoDecision {
	if !crd.DeletionTimestamp.IsZero() {
		return autoDecision{why: "the CRD is being deleted"}
	}
	var automatic, others []*migrationv1alpha1.StorageMigration
	for _, sm := range covering {
		if isAutomaticFor(sm, crd) {
			automatic = append(automatic, sm)
		} else {
			others = append(others, sm)
		}
	}
	switch {
	case len(others) > 0 && len(automatic) > 0:
		return autoDecision{action: autoRetire, retire: automatic, why: fmt.Sprintf("StorageMigration %s covers the resource", others[0].Name)}
	case standard != nil && standard.State != svm.Pending && len(automatic) > 0:
		// Only for one under way: a Pending one may have no controller.
		return autoDecision{action: autoRetire, retire: automatic, why: standardWhy(standard)}
	case len(covering) > 0:
		return autoDecision{why: fmt.Sprintf("StorageMigration %s covers the resource", covering[0].Name)}
	case optedOut(crd):
		return autoDecision{why: fmt.Sprintf("the CRD is annotated %s=false", migrationv1alpha1.AutoMigrateAnnotation)}
	case selector != nil && !selector.Matches(labels.Set(crd.Labels)):
		return autoDecision{why: "the CRD's labels do not match the automatic migration selector"}
	case storedversions.StorageVersion(crd) == "":
		return autoDecision{why: "the CRD has no storage version"}
	case !storedversions.NeedsMigration(crd):
		return autoDecision{why: "status.storedVersions lists only the storage version"}
	}
	if standard != nil {
		return autoDecision{action: autoHoldBack, why: standardWhy(standard)}
	}
	return autoDecision{action: autoCreate, why: fmt.Sprintf("status.storedVersions is %v", crd.Status.StoredVersions)}
}

func standardWhy(m *svm.Migration) string {
	if m.State.Final() {
		return fmt.Sprintf("StorageVersionMigration %s (%s) has not been wound up by its controller yet, which prunes status.storedVersions next", m.Name, m.State)
	}
	if m.State == svm.Pending {
		return fmt.Sprintf("StorageVersionMigration %s (Pending: no controller has started it yet) is to migrate the resource", m.Name)
	}
	return fmt.Sprintf("StorageVersionMigration %s (%s) is migrating the resource", m.Name, m.State)
}

// isAutomaticFor tells whether restow created sm for crd by itself: it carries
// the automatic label and an owner reference to this very CRD.
func isAutomaticFor(sm *migrationv1alpha1.StorageMigration, crd *apiextensionsv1.CustomResourceDefinition) bool {
	return sm.Labels[migrationv1alpha1.AutomaticLabel] == "true" &&
		slices.ContainsFunc(sm.OwnerReferences, func(o metav1.OwnerReference) bool { return o.UID == crd.UID })
}
