// Package migrator owns one migration pass over a resource: resolve it, wait
// until the API server stores at the new version, list metadata in pages,
// rewrite every object with bounded concurrency through a no-op merge patch,
// classify each result, report progress, and finish by pruning a CRD's
// status.storedVersions. It knows nothing of reconcile loops, so the operator
// and the CLI run the same pass.
package migrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	clientdiscovery "k8s.io/client-go/discovery"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/storedversions"
)

// Defaults for a pass.
const (
	DefaultConcurrency = 16
	DefaultPageSize    = 500
	// maxFailedObjects bounds the failures a pass keeps, as the API does.
	maxFailedObjects = 10
)

// DefaultRetryBackoff spaces the retries of one object after transient errors:
// about 40 seconds in all before the pass gives up and reports a transient
// error, to resume later from its continue token.
var DefaultRetryBackoff = wait.Backoff{Duration: 250 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 9, Cap: 10 * time.Second}

// Migrator runs passes. Its clients must not be cached: every decision is
// made on a live read.
type Migrator struct {
	// Client writes CRD status (pruning).
	Client client.Client
	// Reader reads CRDs live.
	Reader client.Reader
	// Metadata lists and patches objects as metadata only.
	Metadata metadata.Interface
	// Discovery shows which storage version the API server uses.
	Discovery clientdiscovery.DiscoveryInterface
	// Mapper resolves resources that are not served from a CRD.
	Mapper meta.RESTMapper
}

// Target is a resource resolved for a pass.
type Target struct {
	// Resource is the group, version and resource the pass lists and patches through.
	Resource   schema.GroupVersionResource
	Kind       string
	Namespaced bool
	// CRD is set when the resource is served from a CustomResourceDefinition.
	CRD *CRDState
}

// CRDState is what a pass remembers of a CRD when it begins.
type CRDState struct {
	Name           string
	StorageVersion string
	Generation     int64
	StoredVersions []string
	ServedVersions []string
}

// TargetVersion is the version objects are stored at after the pass: the CRD's
// storage version, or for other resources the version they are served at.
func (t Target) TargetVersion() string {
	if t.CRD != nil {
		return t.CRD.StorageVersion
	}
	return t.Resource.Version
}

// Resolve finds the resource, reads its CRD live, and checks that the API
// server already stores at the CRD's storage version. It returns a
// *StalledError for a resource that does not exist and a *WaitError while the
// API server has not switched yet.
func (m *Migrator) Resolve(ctx context.Context, gr schema.GroupResource) (Target, error) {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	err := m.Reader.Get(ctx, client.ObjectKey{Name: gr.String()}, crd)
	switch {
	case err == nil:
		return m.resolveCRD(crd)
	case !apierrors.IsNotFound(err):
		return Target{}, &TransientError{Err: fmt.Errorf("reading CRD %s: %w", gr, err)}
	}
	mapping, err := m.restMapping(gr)
	if err != nil {
		return Target{}, err
	}
	return Target{
		Resource:   mapping.Resource,
		Kind:       mapping.GroupVersionKind.Kind,
		Namespaced: mapping.Scope.Name() == meta.RESTScopeNameNamespace,
	}, nil
}

func (m *Migrator) restMapping(gr schema.GroupResource) (*meta.RESTMapping, error) {
	gvk, err := m.Mapper.KindFor(gr.WithVersion(""))
	if err == nil {
		var mapping *meta.RESTMapping
		if mapping, err = m.Mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err == nil {
			return mapping, nil
		}
	}
	if meta.IsNoMatchError(err) {
		return nil, &StalledError{Reason: migrationv1alpha1.UnsupportedReason, Message: fmt.Sprintf("the API server serves no resource %s", gr)}
	}
	return nil, &TransientError{Err: fmt.Errorf("resolving %s: %w", gr, err)}
}

func (m *Migrator) resolveCRD(crd *apiextensionsv1.CustomResourceDefinition) (Target, error) {
	state := &CRDState{
		Name:           crd.Name,
		StorageVersion: storedversions.StorageVersion(crd),
		Generation:     crd.Generation,
		StoredVersions: crd.Status.StoredVersions,
		ServedVersions: storedversions.ServedVersions(crd),
	}
	if len(state.ServedVersions) == 0 {
		return Target{}, &StalledError{Reason: migrationv1alpha1.UnsupportedReason, Message: fmt.Sprintf("CRD %s serves no version", crd.Name)}
	}
	if !crd.DeletionTimestamp.IsZero() {
		return Target{}, &StalledError{Reason: migrationv1alpha1.UnsupportedReason, Message: fmt.Sprintf("CRD %s is being deleted", crd.Name)}
	}
	notServing, err := storedversions.NotServingStorageVersion(m.Discovery, crd)
	if err != nil {
		return Target{}, &TransientError{Err: err}
	}
	if notServing != "" {
		return Target{}, &WaitError{Reason: migrationv1alpha1.WaitingForStorageVersionReason, Message: notServing}
	}
	// Read through the storage version when it is served: no conversion.
	version := state.ServedVersions[0]
	for _, v := range state.ServedVersions {
		if v == state.StorageVersion {
			version = v
		}
	}
	return Target{
		Resource:   schema.GroupVersionResource{Group: crd.Spec.Group, Version: version, Resource: crd.Spec.Names.Plural},
		Kind:       crd.Spec.Names.Kind,
		Namespaced: crd.Spec.Scope == apiextensionsv1.NamespaceScoped,
		CRD:        state,
	}, nil
}

// Options tune a pass.
type Options struct {
	Concurrency int
	PageSize    int64
	// ViaStatus rewrites through the /status subresource.
	ViaStatus bool
	// Continue resumes a pass after the page that ended with this token.
	Continue string
	// RetryBackoff spaces retries of transient errors; zero means DefaultRetryBackoff.
	RetryBackoff wait.Backoff
}

// Counts counts objects by outcome.
type Counts = migrationv1alpha1.ObjectCounts

// Progress is a snapshot of a pass under way.
type Progress struct {
	Counts
	// RemainingEstimate is the list's remainingItemCount after the last page, if given.
	RemainingEstimate *int64
	// Continue resumes the pass after the last page whose every object is done.
	Continue string
	// Retrying describes the transient error being retried, or is "".
	Retrying string
}

// Failure is an object the pass could not rewrite.
type Failure = migrationv1alpha1.FailedObject

// Result is the outcome of a pass that listed every object.
type Result struct {
	Counts
	// Failures holds the first few objects that could not be rewritten.
	Failures []Failure
}

// Observer receives progress. Progress may be called from several goroutines
// and must be cheap: it runs after every page and on every transient error.
type Observer func(Progress)

// Rewrite lists every object of the target and rewrites each unchanged, so
// the API server stores it at the storage version. A rewrite that fails
// permanently is recorded in the result and the pass goes on. It returns a
// *TransientError when transient errors persist past the retry backoff and a
// *StalledError when the resource cannot be listed or patched; either way the
// last Progress has the token to resume from.
func (m *Migrator) Rewrite(ctx context.Context, target Target, opts Options, observe Observer) (Result, error) {
	if opts.Concurrency <= 0 {
		opts.Concurrency = DefaultConcurrency
	}
	if opts.PageSize <= 0 {
		opts.PageSize = DefaultPageSize
	}
	if opts.RetryBackoff.Steps == 0 {
		opts.RetryBackoff = DefaultRetryBackoff
	}
	if observe == nil {
		observe = func(Progress) {}
	}
	p := &pass{migrator: m, target: target, opts: opts, observe: observe, continueToken: opts.Continue}
	return p.run(ctx)
}

// pass is the state of one Rewrite.
type pass struct {
	migrator *Migrator
	target   Target
	opts     Options
	observe  Observer

	listed, migrated, skipped, failed atomic.Int64
	// isRetrying mirrors retrying != "", so a success clears the message
	// without taking mu on every object.
	isRetrying atomic.Bool

	mu            sync.Mutex
	failures      []Failure
	continueToken string
	remaining     *int64
	retrying      string
	stopErr       error
}

// page is one list response.
type page struct {
	items     []metav1.PartialObjectMetadata
	next      string
	remaining *int64
}

func (p *pass) run(parent context.Context) (Result, error) {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()

	// List one page ahead, so workers do not wait for the list between pages.
	pages := make(chan page, 1)
	listErr := make(chan error, 1)
	go func() {
		defer close(pages)
		listErr <- p.list(ctx, pages)
	}()

	work := make(chan metav1.PartialObjectMetadata)
	var pageDone, workers sync.WaitGroup
	for range p.opts.Concurrency {
		workers.Go(func() {
			for obj := range work {
				if err := p.rewrite(ctx, obj); err != nil {
					p.stop(err)
					cancel()
				}
				pageDone.Done()
			}
		})
	}
	for pg := range pages {
		p.listed.Add(int64(len(pg.items)))
		for _, obj := range pg.items {
			pageDone.Add(1)
			select {
			case work <- obj:
			case <-ctx.Done():
				pageDone.Done()
			}
		}
		pageDone.Wait()
		if ctx.Err() != nil {
			break
		}
		// Every object of the page is done: resuming from here loses nothing.
		p.mu.Lock()
		p.continueToken, p.remaining = pg.next, pg.remaining
		p.mu.Unlock()
		p.observe(p.progress())
	}
	close(work)
	workers.Wait()
	cancel()
	drain(pages)
	lastListErr := <-listErr

	p.mu.Lock()
	defer p.mu.Unlock()
	result := Result{Counts: p.counts(), Failures: p.failures}
	switch {
	case p.stopErr != nil:
		return result, p.stopErr
	case parent.Err() != nil:
		// Never report an interrupted pass as complete.
		return result, parent.Err()
	default:
		return result, lastListErr
	}
}

func drain(pages <-chan page) {
	for range pages {
		continue
	}
}

// stop records the first error that stops the pass.
func (p *pass) stop(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopErr == nil {
		p.stopErr = err
	}
}

// list sends the pages of the resource to pages until the list ends.
func (p *pass) list(ctx context.Context, pages chan<- page) error {
	resource := p.migrator.Metadata.Resource(p.target.Resource)
	token := p.continueToken
	for {
		var list *metav1.PartialObjectMetadataList
		err := p.retryTransient(ctx, func() error {
			var err error
			list, err = resource.List(ctx, metav1.ListOptions{Limit: p.opts.PageSize, Continue: token})
			for expired := 0; apierrors.IsResourceExpired(err) && token != "" && expired < 3; expired++ {
				// The token outlived etcd's compaction. The error carries a
				// token that continues inconsistently: objects changed since
				// are already stored at the new version, and rewrites are
				// idempotent, so nothing is missed. Without one, start over.
				token = inconsistentContinue(err)
				klog.FromContext(ctx).V(2).Info("Continue token expired, continuing the list", "restarted", token == "")
				list, err = resource.List(ctx, metav1.ListOptions{Limit: p.opts.PageSize, Continue: token})
			}
			return err
		})
		if err != nil {
			return p.passError("listing", err)
		}
		pg := page{items: list.Items, next: list.Continue, remaining: list.RemainingItemCount}
		select {
		case pages <- pg:
		case <-ctx.Done():
			return nil
		}
		if list.Continue == "" {
			return nil
		}
		token = list.Continue
	}
}

func inconsistentContinue(err error) string {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return status.Status().Continue
	}
	return ""
}

// rewrite writes one object back unchanged. The merge patch carries only the
// resourceVersion read by the list, as a precondition: the API server decodes
// the stored object, re-encodes it at the storage version and writes it only
// if its bytes changed. The response is metadata only. It returns an error
// only when the pass must stop.
func (p *pass) rewrite(ctx context.Context, obj metav1.PartialObjectMetadata) error {
	log := klog.FromContext(ctx)
	err := p.retryTransient(ctx, func() error {
		return p.patch(ctx, &obj)
	})
	if apierrors.IsConflict(err) && p.staleManagedFields(&obj) {
		// A write since the list stored the object at the new version, but
		// it may have left other managers' entries naming the old version:
		// re-read and clean them up.
		conflict := err
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			fresh, err := p.resource(obj.Namespace).Get(ctx, obj.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !p.staleManagedFields(fresh) {
				return errNothingToClean
			}
			return p.retryTransient(ctx, func() error { return p.patch(ctx, fresh) })
		})
		if errors.Is(err, errNothingToClean) {
			err = conflict // someone else's write did it all: skipped
		}
	}
	switch classify(err) {
	case migrated:
		p.migrated.Add(1)
		log.V(4).Info("Rewrote object", "object", klog.KObj(&obj))
	case skipped:
		p.skipped.Add(1)
		log.V(4).Info("Skipped object changed since listed", "object", klog.KObj(&obj), "reason", apierrors.ReasonForError(err))
	case permanent:
		p.failed.Add(1)
		log.V(4).Info("Could not rewrite object", "object", klog.KObj(&obj), "reason", reasonFor(err))
		p.mu.Lock()
		if len(p.failures) < maxFailedObjects {
			p.failures = append(p.failures, Failure{Namespace: obj.Namespace, Name: obj.Name, Reason: reasonFor(err), Message: Message(err)})
		}
		p.mu.Unlock()
	default:
		return p.passError("rewriting "+klog.KObj(&obj).String(), err)
	}
	return nil
}

var errNothingToClean = errors.New("managedFields already clean")

// resource is the client for the target in namespace (ignored when cluster-scoped).
func (p *pass) resource(namespace string) metadata.ResourceInterface {
	resource := p.migrator.Metadata.Resource(p.target.Resource)
	if p.target.Namespaced {
		return resource.Namespace(namespace)
	}
	return resource
}

// staleManagedFields reports whether obj's managedFields name a version of
// the CRD that it no longer serves.
func (p *pass) staleManagedFields(obj *metav1.PartialObjectMetadata) bool {
	_, stale, _ := p.repointedManagedFields(obj)
	return stale
}

func (p *pass) repointedManagedFields(obj *metav1.PartialObjectMetadata) ([]metav1.ManagedFieldsEntry, bool, error) {
	crd := p.target.CRD
	if crd == nil {
		return nil, false, nil
	}
	return storedversions.RepointManagedFields(obj.ManagedFields, p.target.Resource.Group, crd.ServedVersions, crd.StorageVersion)
}

// rewritePatch is the merge patch of a rewrite: the resourceVersion read, as
// a precondition, and managedFields only when they must be re-pointed.
type rewritePatch struct {
	Metadata struct {
		ResourceVersion string                      `json:"resourceVersion"`
		ManagedFields   []metav1.ManagedFieldsEntry `json:"managedFields,omitempty"`
	} `json:"metadata"`
}

// patch writes obj back unchanged, re-pointing stale managedFields. The
// /status subresource ignores metadata, so a patch that carries
// managedFields goes to the main resource even with ViaStatus.
func (p *pass) patch(ctx context.Context, obj *metav1.PartialObjectMetadata) error {
	var body rewritePatch
	body.Metadata.ResourceVersion = obj.ResourceVersion
	managedFields, repoint, err := p.repointedManagedFields(obj)
	if err != nil {
		return apierrors.NewBadRequest(err.Error())
	}
	var subresources []string
	if repoint {
		body.Metadata.ManagedFields = managedFields
	} else if p.opts.ViaStatus {
		subresources = []string{"status"}
	}
	data, err := json.Marshal(&body)
	if err != nil {
		return err
	}
	_, err = p.resource(obj.Namespace).Patch(ctx, obj.Name, types.MergePatchType, data, metav1.PatchOptions{}, subresources...)
	return err
}

// retryTransient runs fn until it succeeds, fails for a cause that is not
// transient, or the backoff runs out, reporting what it is retrying.
func (p *pass) retryTransient(ctx context.Context, fn func() error) error {
	err := retry.OnError(p.opts.RetryBackoff, func(err error) bool {
		if ctx.Err() != nil || classify(err) != transient {
			return false
		}
		p.setRetrying(Message(err))
		return true
	}, fn)
	if err == nil && p.isRetrying.Load() {
		p.setRetrying("")
	}
	return err
}

func (p *pass) setRetrying(msg string) {
	p.mu.Lock()
	changed := p.retrying != msg
	p.retrying = msg
	p.isRetrying.Store(msg != "")
	p.mu.Unlock()
	if changed {
		p.observe(p.progress())
	}
}

// passError turns an error that stops the pass into a typed one.
func (p *pass) passError(doing string, err error) error {
	switch classify(err) {
	case skipped:
		if apierrors.IsNotFound(err) {
			// The list itself found no resource: its CRD is gone.
			return &StalledError{Reason: migrationv1alpha1.UnsupportedReason, Message: fmt.Sprintf("%s %s: the resource no longer exists: %s", doing, p.target.Resource.GroupResource(), Message(err))}
		}
		return &TransientError{Err: fmt.Errorf("%s %s: %w", doing, p.target.Resource.GroupResource(), err)}
	case unsupported, permanent:
		// A list or patch refused for the whole resource.
		return &StalledError{Reason: migrationv1alpha1.UnsupportedReason, Message: fmt.Sprintf("%s %s: %s", doing, p.target.Resource.GroupResource(), Message(err))}
	default:
		return &TransientError{Err: fmt.Errorf("%s %s: %w", doing, p.target.Resource.GroupResource(), err)}
	}
}

func (p *pass) counts() Counts {
	return Counts{Listed: p.listed.Load(), Migrated: p.migrated.Load(), Skipped: p.skipped.Load(), Failed: p.failed.Load()}
}

func (p *pass) progress() Progress {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Progress{Counts: p.counts(), RemainingEstimate: p.remaining, Continue: p.continueToken, Retrying: p.retrying}
}
