package migrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
)

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
	// firstWholePage is the limit of the first page of whole objects, before
	// their size is known.
	firstWholePage = 10
	// wholePageBytes is what a page of whole objects should hold: each next
	// page's limit is what fits at the size of the largest object on the
	// page before, at most twice that page's limit. An estimate, not a
	// bound: a page whose objects are larger than the last page's holds
	// more, at most --page-size objects of the largest size etcd stores.
	wholePageBytes = 4 << 20
	// DefaultBodyBytes is Migrator.BodyBytes by default: what all passes
	// hold of listed objects at once, the pages being read and decoded
	// included.
	DefaultBodyBytes = 32 << 20
	// maxBodyAge is how long after its page was listed an object may be
	// written back as listed; after it, it is patched.
	maxBodyAge = 10 * time.Second
	// metadataAccept asks for the answer to a write as metadata only.
	metadataAccept = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
)

// writesWhole reports whether the first pass lists whole objects and writes
// them back as listed.
func (mg *migration) writesWhole() bool {
	return mg.m.Objects != nil && mg.target.CRD != nil && !mg.opts.ViaStatus && !mg.updateRefused.Load()
}

// request points req at the target's objects in namespace, or at the
// object name in it.
func (mg *migration) request(req *rest.Request, namespace, name string) *rest.Request {
	gvr := mg.target.Resource
	req = req.AbsPath("/apis", gvr.Group, gvr.Version)
	if mg.target.Namespaced && namespace != "" {
		req = req.Namespace(namespace)
	}
	req = req.Resource(gvr.Resource)
	if name != "" {
		req = req.Name(name)
	}
	return req
}

// listWhole lists one page of whole objects through the storage version:
// their metadata, and each as the API server encoded it.
func (mg *migration) listWhole(ctx context.Context, token string, limit int64) (*metav1.PartialObjectMetadataList, []json.RawMessage, error) {
	namespace := ""
	if mg.target.Partial() {
		namespace = mg.target.Namespace
	}
	var data []byte
	var release func()
	for {
		var err error
		data, release, err = mg.readWholePage(ctx, namespace, token, limit)
		switch {
		case errors.Is(err, errPageTooLarge) && limit > 1:
			limit = max(1, limit/4)
			continue
		case errors.Is(err, errPageTooLarge):
			// Not one object fits what the budget has left: this page is
			// listed as metadata, and patched.
			klog.FromContext(ctx).V(1).Info("Listed objects held by passes are at their budget; patching this page", "error", err.Error())
			return listMetadata(ctx, mg.target.scope(mg.resource), limit)(token)
		case err != nil:
			return nil, nil, err
		}
		break
	}
	// The read stays charged until the page is decoded.
	defer release()
	// Case-sensitive, as the API server decodes.
	var raw struct {
		metav1.ListMeta `json:"metadata"`
		Items           []json.RawMessage `json:"items"`
	}
	if err := utiljson.Unmarshal(data, &raw); err != nil {
		return nil, nil, fmt.Errorf("decoding a list of %s: %w", mg.target.Resource.GroupResource(), err)
	}
	list := &metav1.PartialObjectMetadataList{ListMeta: raw.ListMeta, Items: make([]metav1.PartialObjectMetadata, len(raw.Items))}
	for i, item := range raw.Items {
		if err := utiljson.Unmarshal(item, &list.Items[i]); err != nil {
			return nil, nil, fmt.Errorf("decoding a list of %s: %w", mg.target.Resource.GroupResource(), err)
		}
	}
	metadataOnly(list.Items)
	return list, raw.Items, nil
}

// errPageTooLarge says a page of whole objects would not fit the budget.
var errPageTooLarge = errors.New("a page of whole objects is larger than the budget has left")

// maxWholePageRead bounds the answer to one list of whole objects that a
// pass reads before it gives up and lists fewer.
const maxWholePageRead = 4 * wholePageBytes

// readWholePage reads one list of whole objects, at most maxWholePageRead
// bytes, charging the budget twice what it reads as it reads (decoding
// holds the answer and a copy of each object at once), so passes reading at
// once share it. An answer that does not fit is dropped unread
// (errPageTooLarge), and the caller lists fewer. release gives the charge
// back, once the page is decoded.
func (mg *migration) readWholePage(ctx context.Context, namespace, token string, limit int64) (data []byte, release func(), err error) {
	reader := &chargedReader{mg: mg, most: maxWholePageRead}
	defer func() {
		if err != nil {
			reader.release()
		}
	}()
	req := mg.request(mg.m.Objects.Get(), namespace, "").
		Param("limit", strconv.FormatInt(limit, 10)).
		SetHeader("Accept", "application/json")
	if token != "" {
		req = req.Param("continue", token)
	}
	stream, err := req.Stream(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = stream.Close() }()
	reader.r = stream
	data, err = io.ReadAll(reader)
	if errors.Is(err, errPageTooLarge) {
		return nil, nil, fmt.Errorf("%w: %d objects are more than %d bytes, or than the budget has left", errPageTooLarge, limit, reader.read)
	}
	if err != nil {
		return nil, nil, err
	}
	return data, reader.release, nil
}

// chargedReader reads a list's answer, charging the Migrator's budget for
// every byte read, twice.
type chargedReader struct {
	r    io.Reader
	mg   *migration
	most int64
	read int64
}

func (c *chargedReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		if c.read+int64(n) > c.most || !c.mg.m.charge(2*int64(n), c.mg.budget()) {
			return 0, errPageTooLarge
		}
		c.read += int64(n)
	}
	return n, err
}

// release gives back what was read, once.
func (c *chargedReader) release() {
	c.mg.m.bodyBytes.Add(-2 * c.read)
	c.read = 0
}

// budget is what the Migrator's passes may hold of listed objects.
func (mg *migration) budget() int64 {
	if mg.m.BodyBytes > 0 {
		return mg.m.BodyBytes
	}
	return DefaultBodyBytes
}

// holdBodies charges a page's bodies to the Migrator's budget, or drops
// them (the page is patched) when they do not fit.
func (mg *migration) holdBodies(ctx context.Context, pg *page) {
	var size int64
	for _, b := range pg.bodies {
		size += int64(len(b))
	}
	if mg.m.bodyBytes.Add(size) > mg.budget() {
		mg.m.bodyBytes.Add(-size)
		pg.bodies = nil
		klog.FromContext(ctx).V(1).Info("Listed objects held by passes are at their budget; patching this page", "objects", len(pg.items), "bytes", size)
		return
	}
	pg.charge = &atomic.Int64{}
	pg.charge.Store(size)
}

// release returns a page's charge (nil for a page without bodies) to the
// budget, once.
func (mg *migration) release(charge *atomic.Int64) {
	if charge != nil {
		mg.m.bodyBytes.Add(-charge.Swap(0))
	}
}

// answer is the body of a successful result, or the API server's error
// as the typed clients return it: Raw alone keeps only the status code.
func answer(result rest.Result) ([]byte, error) {
	if err := result.Error(); err != nil {
		return nil, err
	}
	return result.Raw()
}

// nextWholeLimit is the limit of the page after one of limit objects that
// held bodies: as many objects of the largest one's size as fit in
// wholePageBytes, at most twice limit and the page size, at least 1.
func nextWholeLimit(pageSize, limit int64, bodies []json.RawMessage) int64 {
	largest := 1
	for _, b := range bodies {
		largest = max(largest, len(b))
	}
	return max(1, min(pageSize, 2*limit, int64(wholePageBytes)/int64(largest)))
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
func (mg *migration) update(ctx context.Context, obj *metav1.PartialObjectMetadata, body json.RawMessage, listed time.Time) (bool, error) {
	if err := mg.pace.acquire(ctx); err != nil {
		return false, err
	}
	if time.Since(listed) >= maxBodyAge {
		mg.pace.cancel()
		return false, errBodyStale
	}
	// The body must reach the API server while it is fresh: client-go's
	// rate limiter and the API server's Priority and Fairness queue may hold
	// the request too, so it is given up when the body gets too old. One
	// the API server already took counts as changed by someone else (the
	// patch that follows answers 409), and is re-checked.
	putCtx, cancel := context.WithDeadline(ctx, listed.Add(maxBodyAge))
	defer cancel()
	start := mg.pace.now()
	data, err := answer(mg.request(mg.m.Objects.Put(), obj.Namespace, obj.Name).
		MaxRetries(0).
		Param("fieldValidation", metav1.FieldValidationIgnore).
		SetHeader("Content-Type", "application/json").
		SetHeader("Accept", metadataAccept).
		Body([]byte(body)).
		Do(putCtx))
	if err != nil && ctx.Err() == nil && putCtx.Err() != nil {
		mg.pace.cancel()
		return false, errBodyStale
	}
	mg.pace.release(start, err)
	if err != nil {
		return false, err
	}
	var written metav1.PartialObjectMetadata
	if err := utiljson.Unmarshal(data, &written); err != nil {
		return false, fmt.Errorf("decoding the answer to a rewrite of %s: %w", klog.KObj(obj), err)
	}
	if written.ResourceVersion == "" {
		return false, fmt.Errorf("the answer to a rewrite of %s has no resourceVersion", klog.KObj(obj))
	}
	mg.successes.Add(1)
	mg.noteOwnWrite(written.ResourceVersion)
	return written.ResourceVersion != obj.ResourceVersion, nil
}

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
	return mg.patch(ctx, obj)
}
