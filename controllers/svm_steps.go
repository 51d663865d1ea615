package controllers

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	svmv1 "k8s.io/api/storagemigration/v1"
	"k8s.io/apiextensions-apiserver/pkg/apihelpers"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/svm"
)

// The deciding steps of the StorageVersionMigration controller: each fills
// in an svmOutcome and writes nothing (svm_record.go writes it).

// start claims m, or starts a run of a claimed m. Nothing is written to
// a StorageVersionMigration before restow claims it, and the claim (Running
// and the resource version the migration covers, in one update) is written
// only after claimGrace with no status from anyone. The run starts on the
// next reconcile, once the live object shows the claim and no other writer:
// so restow never migrates an object whose status another controller has
// written, and never writes Running alone, which the in-tree
// resource-version controller would answer.
func (r *StorageVersionMigrationReconciler) start(ctx context.Context, m *svmv1.StorageVersionMigration) svmOutcome {
	gr := schema.GroupResource{Group: m.Spec.Resource.Group, Resource: m.Spec.Resource.Resource}
	older, err := r.olderActive(ctx, m, gr)
	switch {
	case err != nil:
		return svmOutcome{requeue: r.runs.waiting.When(m.Name), err: err}
	case older != nil:
		return waitingForOlder(older, r.runs.waiting.When(m.Name))
	}
	claimed := m.Status.ResourceVersion != "" && meta.IsStatusConditionTrue(m.Status.Conditions, string(svmv1.MigrationRunning))
	if wait := claimGrace - time.Since(m.CreationTimestamp.Time); !claimed && wait > 0 {
		return svmOutcome{requeue: wait}
	}
	res := resolve(ctx, r.Migrator, gr)
	if res.waiting == "" {
		r.runs.waiting.Forget(m.Name)
	}
	var out svmOutcome
	switch {
	case res.waiting != "":
		out = svmOutcome{running: res.waiting, requeue: r.runs.waitFor(m.Name, res)}
	case res.stalled != "":
		return r.unsupported(m, res.stalled)
	case res.transient != nil:
		out = svmOutcome{running: "Retrying after a transient error: " + migrator.Message(res.transient), requeue: transientRetryDelay}
	case !claimed:
		return r.claim(ctx, gr, res.target)
	default:
		return r.launch(ctx, m, gr, res.target)
	}
	if !claimed {
		// Nothing is said on an object restow has not claimed.
		out.running = ""
	}
	return out
}

// unsupported ends m Failed when its resource cannot be migrated, once the
// grace for a resource that is not served yet is over. Failed is final and
// needs no claim: restow is the only writer of this status, or decide would
// have stopped.
func (r *StorageVersionMigrationReconciler) unsupported(m *svmv1.StorageVersionMigration, message string) svmOutcome {
	grace := r.UnknownResourceGrace
	if grace <= 0 {
		grace = unknownResourceGrace
	}
	if time.Since(m.CreationTimestamp.Time) < grace {
		return svmOutcome{requeue: r.runs.waiting.When(m.Name)}
	}
	out := svmOutcome{end: &svmEnd{svmv1.MigrationFailed, svmFailedReason, message},
		events: []svmEvent{{stepEvent: stepEvent{corev1.EventTypeWarning, migrationv1alpha1.UnsupportedReason, "Migrate", message}}}}
	if m.Status.ResourceVersion == "" {
		// With no list of the resource to take status.resourceVersion
		// from, m's own: 1.35 refuses a status without a well-formed one
		// (1.36 accepts none), and the field says nothing of a migration
		// that never began.
		out.resourceVersion = m.ResourceVersion
	}
	return out
}

// claim writes restow's claim on the object: Running, and the resource version of a
// list of the target now, which says which objects the migration covers.
func (r *StorageVersionMigrationReconciler) claim(ctx context.Context, gr schema.GroupResource, target migrator.Target) svmOutcome {
	list, err := r.Migrator.Metadata.Resource(target.Resource).List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		ctrl.LoggerFrom(ctx).Info("Could not read the resource version to claim a StorageVersionMigration with; retrying", "error", migrator.Message(err))
		return svmOutcome{requeue: transientRetryDelay}
	}
	return svmOutcome{
		resourceVersion: list.GetResourceVersion(),
		running:         fmt.Sprintf("Claimed by restow: rewriting %s to %s starts shortly", gr, target.TargetVersion()),
		requeue:         restartDelay,
	}
}

// launch starts the run of a claimed m, from the checkpoint of its last
// run if that paused.
func (r *StorageVersionMigrationReconciler) launch(ctx context.Context, m *svmv1.StorageVersionMigration, gr schema.GroupResource, target migrator.Target) svmOutcome {
	prune, why := r.mayPrune(ctx, gr)
	r.mu.Lock()
	saved := r.resume[m.Name]
	delete(r.resume, m.Name)
	r.mu.Unlock()
	cp, _, _ := migrator.ResumeFrom(saved, target)
	if !r.runs.startRun(ctx, r.Migrator, m, target, r.runOptions(prune, cp)) {
		return svmOutcome{}
	}
	ctrl.LoggerFrom(ctx).Info("Starting a migration", "resource", gr, "targetVersion", target.TargetVersion(), "prune", prune)
	msg := fmt.Sprintf("restow is rewriting %s to %s", gr, target.TargetVersion())
	if why != "" {
		msg += "; " + why
	}
	return svmOutcome{running: msg, requeue: r.StatusInterval,
		events: []svmEvent{{stepEvent: stepEvent{corev1.EventTypeNormal, "PassStarted", "Migrate", msg}}}}
}

// follow says what the run rn of m is doing or, once it ended, how: the end
// it records is the run's, as often as the write of it has to be tried; the
// run is forgotten only once status holds it.
func (r *StorageVersionMigrationReconciler) follow(ctx context.Context, rn *run, m *svmv1.StorageVersionMigration) svmOutcome {
	state := rn.read()
	if !state.done {
		if r.otherRunner(ctx, rn.target, m) {
			return conflictOutcome(inTreeRunner, fmt.Sprintf("%q marks CRD %s as migrating this StorageVersionMigration (condition StorageMigrating) while restow's run is under way",
				inTreeRunner, rn.target.CRD.Name))
		}
		return svmOutcome{running: runUnderWay(rn.target, state.progress, statusProgress(state.progress), time.Now()).message, requeue: r.StatusInterval}
	}
	v := judge(rn.target, state, time.Now())
	out := svmOutcome{settles: rn, ended: &runEnd{resource: rn.target.Resource.GroupResource().String(), result: v.result}}
	switch {
	case v.condition == conditionReady:
		msg := v.message
		if len(state.result.Pruned) > 0 {
			msg += fmt.Sprintf("; %v removed from status.storedVersions", state.result.Pruned)
		}
		out.end = &svmEnd{svmv1.MigrationSucceeded, svmSucceededReason, msg}
		out.events = []svmEvent{{stepEvent: stepEvent{corev1.EventTypeNormal, migrationv1alpha1.SucceededReason, "Migrate", msg}}}
		out.ended.succeeded, out.ended.pruned = true, len(state.result.Pruned) > 0
		out.ended.duration = v.summary.CompletionTime.Sub(v.summary.StartTime.Time)
		r.runs.stalled.Forget(m.Name)
	case v.next == nextStalled:
		msg := v.message
		if failures := failureList(state.result.Failures); failures != "" {
			msg = fmt.Sprintf("%d of %d objects could not be rewritten to %s, nothing was pruned: %s", state.result.Failed, state.result.Listed, rn.target.TargetVersion(), failures)
		}
		out.end = &svmEnd{svmv1.MigrationFailed, svmFailedReason, msg}
		out.events = []svmEvent{{stepEvent: stepEvent{corev1.EventTypeWarning, v.reason, "Migrate", msg}}}
	case v.next == nextResume:
		cp := state.progress.Checkpoint
		out.resume, out.running, out.requeue = &cp, v.message, r.runs.stalled.When(m.Name)
	case v.next == nextSpace:
		// Failed is final for a StorageVersionMigration: etcd's room comes
		// back, so the run resumes instead, and says why it waits.
		cp := state.progress.Checkpoint
		out.resume, out.running, out.requeue = &cp, v.message, r.StalledRetryBase
	default:
		// The CRD changed under the run: a new run starts.
		out.running, out.requeue = v.message, restartDelay
	}
	return out
}

// inTreeRunner is the field manager of kube-controller-manager's migration
// runner, which marks the CRD it migrates with the StorageMigrating
// condition, "Migration <name> is running" (Kubernetes 1.35 and later).
const inTreeRunner = "migration-runner-controller"

// otherRunner reports whether another controller carries out m, as its CRD shows it: the
// StorageMigrating condition that kube-controller-manager's migration
// runner sets while it migrates a StorageVersionMigration, naming m. Its
// writes to m's status may change nothing (restow's claim already says
// Running), and so leave no field manager there; the CRD's condition is
// what it leaves. False when nothing shows another runner, for a resource
// without a CRD, or when the CRD cannot be read (looked at again at the
// next --status-interval).
func (r *StorageVersionMigrationReconciler) otherRunner(ctx context.Context, target migrator.Target, m *svmv1.StorageVersionMigration) bool {
	if target.CRD == nil {
		return false
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := r.Migrator.Reader.Get(ctx, client.ObjectKey{Name: target.CRD.Name}, crd); err != nil {
		return false
	}
	c := apihelpers.FindCRDCondition(crd, apiextensionsv1.StorageMigrating)
	return c != nil && c.Status == apiextensionsv1.ConditionTrue && strings.Contains(c.Message, "Migration "+m.Name+" is running")
}

// conflictOutcome stops restow's run of the object, if any: another
// controller, other, acts on it, as evidence shows. Its event and log say
// so once.
func conflictOutcome(other, evidence string) svmOutcome {
	msg := fmt.Sprintf("%s: another controller (such as kube-controller-manager's) acts on it, "+
		"so restow leaves it alone and writes nothing more. Turn off --serve-storage-version-migrations, or the other controller", evidence)
	return svmOutcome{stop: true, events: []svmEvent{{
		stepEvent: stepEvent{corev1.EventTypeWarning, ControllerConflictReason, "Migrate", msg},
		once:      saidConflict, onceAs: other, logError: true,
	}}}
}

// waitingForOlder says, once per older migration, that the object waits for older,
// and who writes that one's status.
func waitingForOlder(older *svmv1.StorageVersionMigration, requeue time.Duration) svmOutcome {
	by := "no controller has started it"
	if other := otherStatusWriter(older); other != "" {
		by = fmt.Sprintf("its status is written by %q", other)
	} else if svm.StateOf(older) == svm.Running {
		by = "restow is carrying it out"
	}
	msg := fmt.Sprintf("Waiting for StorageVersionMigration %s (%s) of the same resource to end: they run one at a time, oldest first; %s. Delete it if nothing will finish it",
		older.Name, svm.StateOf(older), by)
	return svmOutcome{requeue: requeue, events: []svmEvent{{
		stepEvent: stepEvent{corev1.EventTypeNormal, WaitingForOlderReason, "Migrate", msg},
		once:      saidWaiting, onceAs: older.Name,
	}}}
}

// mayPrune says whether a run of gr may prune status.storedVersions: not
// when a StorageMigration of the resource asks restow not to
// (spec.pruneStoredVersions: false), and why not.
func (r *StorageVersionMigrationReconciler) mayPrune(ctx context.Context, gr schema.GroupResource) (bool, string) {
	var list migrationv1alpha1.StorageMigrationList
	if err := r.Client.List(ctx, &list, client.MatchingFields{resourceIndex: gr.String()}); err != nil {
		return false, "status.storedVersions is left as it is: the StorageMigrations of the resource could not be read (" + migrator.Message(err) + ")"
	}
	for _, sm := range list.Items {
		if !pruneEnabled(&sm) {
			return false, fmt.Sprintf("status.storedVersions is left as it is: StorageMigration %s sets pruneStoredVersions: false", sm.Name)
		}
	}
	return true, ""
}

// olderActive returns an older StorageVersionMigration of gr that has not
// ended: the migrations of one resource run one at a time, oldest first, as
// in the in-tree controller.
func (r *StorageVersionMigrationReconciler) olderActive(ctx context.Context, m *svmv1.StorageVersionMigration, gr schema.GroupResource) (*svmv1.StorageVersionMigration, error) {
	all, err := svm.ForResource(ctx, r.Cache, r.Version, gr)
	if err != nil {
		return nil, err
	}
	for _, o := range all {
		if o.UID == m.UID {
			return nil, nil
		}
		if !svm.StateOf(o).Final() {
			return o, nil
		}
	}
	return nil, nil
}

// failureList names up to five failed objects and why, values withheld.
func failureList(failures []migrator.Failure) string {
	var parts []string
	for i, f := range failures {
		if i == 5 {
			parts = append(parts, fmt.Sprintf("and %d more", len(failures)-i))
			break
		}
		name := f.Name
		if f.Namespace != "" {
			name = f.Namespace + "/" + f.Name
		}
		parts = append(parts, fmt.Sprintf("%s (%s: %s)", name, f.Reason, f.Message))
	}
	return strings.Join(parts, "; ")
}
