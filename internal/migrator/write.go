package migrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/metadata"
	"k8s.io/klog/v2"

	"github.com/restow/restow/internal/storedversions"
)

// The write path of a pass: one object's rewrite (rewrite, rewriteObject),
// as an update of the object as listed or as a merge patch (write, update,
// patch), each request retried through transient errors (retryTransient)
// and paced (package pace).
//
// The first pass over a CRD's objects lists them whole and writes each back
// as listed, with an update (PUT) whose body is the API server's own bytes
// and whose resourceVersion is the precondition. The API server then decodes
// the body once, where a merge patch has it encode the object, merge the
// patch into it and decode the result, 17% of its CPU in the last profile
// (docs/benchmarks.md). Both fail with 409 when the object changed
// since it was read, and everything after the answer is the same. They
// differ in when the API server read the object: the patch reads it as it
// writes, the update stores what the list read, decoded then (converted,
// defaulted, pruned by the CRD as it was at that moment). So a body is
// written back only while it is fresh (maxBodyAge); an older one, and one
// the API server refuses as invalid or too large, is patched instead. The
// merge patch also stays for what has no listed body, or must not be written
// back as listed: pages listed through an older version, objects re-read
// after a 409, objects whose managedFields must be re-pointed, rewrites
// through /status, the re-check, and resources not served from a CRD, whose
// contents (Secrets) restow does not read.

const (
	// maxBodyAge is how long after its page was listed an object may be
	// written back as listed; after it, it is patched.
	maxBodyAge = 10 * time.Second
	// metadataAccept asks for the answer to a write as metadata only.
	metadataAccept = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
)

// write rewrites obj: as listed when body holds it, was listed less than
// maxBodyAge before the write is sent, and may be written back as is; else
// with the merge patch,
// which answers for itself. A 403 to the update (no update permission, or an
// admission webhook denying it) sends this object and the rest of the
// migration to the merge patch, which needs only patch permission; a 422 or
// 413 (a body the API server refuses, which it may accept as a patch of the
// object as it is now) sends this object.
func (mg *migration) write(ctx context.Context, obj *metav1.PartialObjectMetadata, body json.RawMessage, listed time.Time) (bool, error) {
	if body != nil && mg.writesWhole() {
		if _, stale, err := mg.repointedManagedFields(obj); err == nil && !stale {
			wrote, err := mg.update(ctx, obj, body, listed)
			switch {
			case errors.Is(err, errBodyStale):
				klog.FromContext(ctx).V(4).Info("The listed body got too old while its write waited; patching the object", "object", klog.KObj(obj))
			case apierrors.IsForbidden(err):
				if !mg.updateRefused.Swap(true) {
					klog.FromContext(ctx).Info("The API server refused to update an object as listed; rewriting with merge patches from now on", "object", klog.KObj(obj), "error", Message(err))
				}
			case apierrors.IsInvalid(err), apierrors.IsRequestEntityTooLargeError(err):
				klog.FromContext(ctx).V(1).Info("The API server refused an object as listed; patching it", "object", klog.KObj(obj), "error", Message(err))
			default:
				return wrote, err
			}
		}
	}
	size := int64(len(body))
	if body == nil {
		size = mg.objectBytes(ctx)
	}
	return mg.patch(ctx, obj, size)
}

// errBodyStale says a listed body got too old to be written back while its
// write waited for a slot: the object is patched instead.
var errBodyStale = errors.New("the listed body is older than maxBodyAge")

// update writes obj back as listed, body being the API server's own encoding
// of it at the resourceVersion read, and reports, as patch does, whether the
// API server wrote. The body is the API server's own output, pruned on read,
// so field validation has nothing to find: it is skipped, and the API server
// validates the values as for any write.
//
// The body's age is checked once the request has its slot, just before it is
// sent: the wait for a slot (behind the pace, and behind a Retry-After) can
// take longer than maxBodyAge, and a CRD schema change within it would store
// a body pruned by the old schema (errBodyStale). For the same reason client-go
// never sends the body again by itself after a 429: the answer comes back
// here, and the next attempt checks the age again.
func (mg *migration) update(ctx context.Context, obj *metav1.PartialObjectMetadata, body json.RawMessage, listed time.Time) (wrote bool, err error) {
	cost, err := mg.takeSpace(ctx, int64(len(body)))
	if err != nil {
		return false, err
	}
	// What the write spent of etcd's room: nothing until it is sent.
	written, sent := obj.ResourceVersion, false
	defer func() {
		if sent {
			mg.spaceSpent(cost, obj.ResourceVersion, written, err)
		} else {
			mg.spaceSpent(cost, "", "", nil)
		}
	}()
	if err := mg.pace.Acquire(ctx); err != nil {
		return false, err
	}
	if time.Since(listed) >= maxBodyAge {
		mg.pace.Cancel()
		return false, errBodyStale
	}
	// The body must reach the API server while it is fresh: client-go's
	// rate limiter and the API server's Priority and Fairness queue may hold
	// the request too, so it is given up when the body gets too old. One
	// the API server already took counts as changed by someone else (the
	// patch that follows answers 409), and is re-checked.
	putCtx, cancel := context.WithDeadline(ctx, listed.Add(maxBodyAge))
	defer cancel()
	start, sent := mg.pace.Now(), true
	data, err := answer(mg.request(mg.m.Objects.Put(), obj.Namespace, obj.Name).
		MaxRetries(0).
		Param("fieldValidation", metav1.FieldValidationIgnore).
		SetHeader("Content-Type", "application/json").
		SetHeader("Accept", metadataAccept).
		Body([]byte(body)).
		Do(putCtx))
	if err != nil && ctx.Err() == nil && putCtx.Err() != nil {
		// The API server may have taken it: its bytes count until a
		// compaction.
		mg.pace.Cancel()
		written = ""
		return false, errBodyStale
	}
	mg.pace.Release(start, err)
	if err != nil {
		return false, err
	}
	var answer metav1.PartialObjectMetadata
	if err := utiljson.Unmarshal(data, &answer); err != nil {
		written = ""
		return false, fmt.Errorf("decoding the answer to a rewrite of %s: %w", klog.KObj(obj), err)
	}
	if written = answer.ResourceVersion; written == "" {
		return false, fmt.Errorf("the answer to a rewrite of %s has no resourceVersion", klog.KObj(obj))
	}
	mg.successes.Add(1)
	mg.noteOwnWrite(written)
	return written != obj.ResourceVersion, nil
}

// rewrite brings one object to the storage version and counts how. It
// returns an error only when the pass must stop.
func (mg *migration) rewrite(ctx context.Context, obj metav1.PartialObjectMetadata, body json.RawMessage, listed time.Time, t *tally) error {
	log := klog.FromContext(ctx)
	before := mg.successes.Load()
	out, err := mg.rewriteObject(ctx, &obj, body, listed)
	if out == transient && ctx.Err() == nil && mg.failsAlone(ctx, before) {
		// The API server answers others, so this object alone keeps
		// failing (a conversion webhook refusing it): record it and go on
		// rather than hold up every other object.
		out = permanent
	}
	switch out {
	case migrated:
		t.migrated.Add(1)
		log.V(4).Info("Rewrote object", "object", klog.KObj(&obj))
	case alreadyStored:
		t.alreadyStored.Add(1)
		log.V(4).Info("Object was already stored at the target version", "object", klog.KObj(&obj))
	case skipped:
		t.skipped.Add(1)
		log.V(4).Info("Skipped object changed or deleted since listed", "object", klog.KObj(&obj), "reason", apierrors.ReasonForError(err))
	case permanent:
		log.V(4).Info("Could not rewrite object", "object", klog.KObj(&obj), "reason", reasonFor(err))
		t.fail(Failure{Namespace: obj.Namespace, Name: obj.Name, Reason: reasonFor(err), Message: Message(err)})
	default:
		return mg.passError("rewriting "+klog.KObj(&obj).String(), err)
	}
	return nil
}

// failsAlone decides, once one object's retries are spent, whether it fails
// alone: fewer than half of the workers are retrying too, and the API server
// rewrote another object since this one's first attempt, or, when no other
// object is retrying, answers a one-object list now. Lists alone are no
// evidence while others fail too: with the pace cut to a request or two by
// timeouts, few objects are retrying at any moment, and the pass's lists
// still succeed. When everything fails (the API server or a conversion
// webhook down), the pass stops instead and resumes later.
func (mg *migration) failsAlone(ctx context.Context, successesBefore int64) bool {
	retrying := mg.retrying.Load()
	switch {
	case 2*retrying >= int64(mg.opts.Concurrency):
		return false
	case mg.successes.Load() > successesBefore:
		return true
	case retrying > 0:
		return false
	}
	_, _, err := mg.listPage(ctx, "", 1, false, false)
	return err == nil
}

// rewriteObject rewrites obj, as listed when body holds it, and confirms
// what a 409 or 404 means. Neither
// proves anything by itself: an admission webhook may answer either, and a
// missing subresource answers 404. A look at the object (lookup) tells: it
// is gone (skipped), it changed since listed (skipped: the re-check after
// the settle window covers the change, and a re-read re-points stale
// managedFields), or it is unchanged, so the answer came from elsewhere and
// the object counts as failed.
func (mg *migration) rewriteObject(ctx context.Context, obj *metav1.PartialObjectMetadata, body json.RawMessage, listed time.Time) (fate, error) {
	current := obj
	for changed := 0; ; changed++ {
		wrote := false
		err := mg.retryTransient(ctx, func() error {
			var err error
			wrote, err = mg.write(ctx, current, body, listed)
			return err
		})
		switch {
		case err == nil && !wrote:
			return alreadyStored, nil
		case classify(err) != skipped:
			return classify(err), err
		}
		var fresh *metav1.PartialObjectMetadata
		lookErr := mg.retryTransient(ctx, func() error {
			var err error
			fresh, err = mg.lookup(ctx, current)
			return err
		})
		switch {
		case lookErr != nil && classify(lookErr) == transient:
			return transient, lookErr
		case lookErr != nil:
			// Any other answer is no proof that the object changed.
			return permanent, lookErr
		case fresh == nil:
			return skipped, err
		case fresh.UID == current.UID && fresh.ResourceVersion == current.ResourceVersion:
			return permanent, unconfirmed(err)
		case changed >= maxChangedRetries || !mg.staleManagedFields(fresh):
			return skipped, err
		}
		// Re-read as metadata: patched from now on.
		current, body = fresh, nil
	}
}

// lookup reads obj's metadata as it is now, or nil when it is gone. It lists
// rather than getting the object, so a migration needs no get permission,
// and the list is metadata only: one object, from obj's key, at a
// resourceVersion of now (from a one-CRD list, as isolation takes it). That
// list has a limit and no selector, so the API server answers it from etcd
// while its watch cache of the resource is not ready. A list by field
// selector on the name, which only that cache answers, took minutes of 429s
// "storage is (re)initializing" for as long as another object of the
// resource could not be converted and so kept the cache from starting; it
// is what lookup falls back to where CRDs may not be listed. A list that
// answers 404 comes from an API server that does not serve this version
// (yet: HA, starting up) or from a proxy, and proves nothing about the
// object: it is transient.
func (mg *migration) lookup(ctx context.Context, obj *metav1.PartialObjectMetadata) (*metav1.PartialObjectMetadata, error) {
	c := mg.client(obj.Namespace)
	for attempt := 0; ; attempt++ {
		rv, err := mg.currentResourceVersion(ctx)
		if apierrors.IsForbidden(err) {
			return mg.lookupBySelector(ctx, obj)
		}
		if err != nil {
			return nil, err
		}
		list, err := c.List(ctx, metav1.ListOptions{Limit: 1, Continue: encodeContinue(cleanStart(obj.Name), rv)})
		if apierrors.IsResourceExpired(err) && attempt < 2 {
			continue // compacted between the two lists
		}
		if err != nil {
			return nil, lookupError(err)
		}
		metadataOnly(list.Items)
		if len(list.Items) == 1 && list.Items[0].Name == obj.Name {
			return &list.Items[0], nil
		}
		return nil, nil
	}
}

// lookupBySelector is lookup by a list with a field selector on the name.
func (mg *migration) lookupBySelector(ctx context.Context, obj *metav1.PartialObjectMetadata) (*metav1.PartialObjectMetadata, error) {
	list, err := mg.client(obj.Namespace).List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", obj.Name).String()})
	if err != nil {
		return nil, lookupError(err)
	}
	metadataOnly(list.Items)
	for i := range list.Items {
		if list.Items[i].Name == obj.Name {
			return &list.Items[i], nil
		}
	}
	return nil, nil
}

func lookupError(err error) error {
	if apierrors.IsNotFound(err) {
		return apierrors.NewServiceUnavailable("listing the object by name answered 404: " + Message(err))
	}
	return err
}

// unconfirmed rewords a 409 or 404 that a look at the object showed not to
// be about it, keeping its code and reason.
func unconfirmed(err error) error {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return err
	}
	st := status.Status()
	st.Message = fmt.Sprintf("answered %s for an object that exists unchanged (an admission webhook, or a missing subresource): %s", st.Reason, st.Message)
	return &apierrors.StatusError{ErrStatus: st}
}

// client is the client for the target in namespace (ignored when cluster-scoped).
func (mg *migration) client(namespace string) metadata.ResourceInterface {
	if mg.target.Namespaced {
		return mg.resource.Namespace(namespace)
	}
	return mg.resource
}

// staleManagedFields reports whether obj's managedFields name a version of
// the CRD that it no longer serves.
func (mg *migration) staleManagedFields(obj *metav1.PartialObjectMetadata) bool {
	_, stale, _ := mg.repointedManagedFields(obj)
	return stale
}

func (mg *migration) repointedManagedFields(obj *metav1.PartialObjectMetadata) ([]metav1.ManagedFieldsEntry, bool, error) {
	crd := mg.target.CRD
	if crd == nil {
		return nil, false, nil
	}
	return storedversions.RepointManagedFields(obj.ManagedFields, mg.target.Resource.Group, crd.ServedVersions, crd.StorageVersion)
}

// rewritePatch is the merge patch of a rewrite: the resourceVersion read, as
// a precondition, and managedFields only when they must be re-pointed.
type rewritePatch struct {
	Metadata struct {
		ResourceVersion string                      `json:"resourceVersion"`
		ManagedFields   []metav1.ManagedFieldsEntry `json:"managedFields,omitempty"`
	} `json:"metadata"`
}

// patch writes obj back unchanged, re-pointing stale managedFields, and
// records the resourceVersion the API server answered with. It reports
// whether the API server wrote: it skips a write whose encoding equals what
// etcd holds, and answers with the resourceVersion read, only when the
// object is stored at the target version already. The /status subresource
// ignores metadata, so a patch that carries managedFields goes to the main
// resource even with ViaStatus.
func (mg *migration) patch(ctx context.Context, obj *metav1.PartialObjectMetadata, size int64) (bool, error) {
	var body rewritePatch
	body.Metadata.ResourceVersion = obj.ResourceVersion
	managedFields, repoint, err := mg.repointedManagedFields(obj)
	if err != nil {
		return false, apierrors.NewBadRequest(err.Error())
	}
	var subresources []string
	if repoint {
		body.Metadata.ManagedFields = managedFields
	} else if mg.opts.ViaStatus {
		subresources = []string{"status"}
	}
	data, err := json.Marshal(&body)
	if err != nil {
		return false, err
	}
	cost, err := mg.takeSpace(ctx, size)
	if err != nil {
		return false, err
	}
	if err := mg.pace.Acquire(ctx); err != nil {
		mg.spaceSpent(cost, "", "", nil)
		return false, err
	}
	start := mg.pace.Now()
	written, err := mg.client(obj.Namespace).Patch(ctx, obj.Name, types.MergePatchType, data, metav1.PatchOptions{}, subresources...)
	mg.pace.Release(start, err)
	if err != nil {
		mg.spaceSpent(cost, obj.ResourceVersion, "", err)
		return false, err
	}
	mg.spaceSpent(cost, obj.ResourceVersion, written.ResourceVersion, nil)
	mg.successes.Add(1)
	mg.noteOwnWrite(written.ResourceVersion)
	return written.ResourceVersion != obj.ResourceVersion, nil
}

// retryTransient runs fn until it succeeds, fails for a cause that is not
// transient, the backoff runs out or ctx ends, reporting what it retries.
func (mg *migration) retryTransient(ctx context.Context, fn func() error) error {
	var last error
	failing := false
	defer func() {
		if failing && mg.retrying.Add(-1) == 0 {
			mg.setRetrying("")
		}
	}()
	err := wait.ExponentialBackoffWithContext(ctx, mg.opts.RetryBackoff, func(context.Context) (bool, error) {
		last = fn()
		switch {
		case last == nil:
			return true, nil
		case classify(last) != transient:
			return false, last
		}
		if !failing {
			failing = true
			mg.retrying.Add(1)
		}
		mg.setRetrying(Message(last))
		return false, nil
	})
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case wait.Interrupted(err):
		return last
	}
	return err
}
