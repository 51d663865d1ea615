package migrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/client-go/metadata"
	"k8s.io/klog/v2"
)

// The list of a pass: pages of whole objects through the storage version
// when they may be written back as listed (update, in write.go), else of
// metadata, through a fallback version when one object fails the list
// (isolate.go takes such a page apart), each page's bodies held within the
// Migrator's budget until the page is done.

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
)

// list sends the pages of the resource to pages until the list ends: whole
// objects when whole is set and the pass may write them back as listed,
// else metadata.
func (mg *migration) list(ctx context.Context, token string, whole bool, pages chan<- page) error {
	// Pages of whole objects hold about wholePageBytes (above).
	wholeLimit := min(mg.opts.PageSize, firstWholePage)
	// remaining is how many objects the list has left at token, if known.
	var remaining *int64
	for {
		limit := mg.opts.PageSize
		if whole && mg.writesWhole() {
			limit = wholeLimit
		}
		var list *metav1.PartialObjectMetadataList
		var bodies []json.RawMessage
		// A body's age counts from when its list was sent: the API server
		// decoded it with the CRD as it was then.
		var listed time.Time
		err := mg.retryTransient(ctx, func() error {
			var err error
			listed = time.Now()
			list, bodies, err = mg.listPage(ctx, token, limit, whole, true)
			return err
		})
		if err != nil && classify(err) == transient && mg.mayIsolate() {
			isolated, ierr := mg.isolate(ctx, token, limit, err, remaining)
			if ierr == nil {
				for _, pg := range isolated {
					if !mg.send(ctx, pages, pg) {
						return nil
					}
					token, remaining = pg.next, pg.remaining
				}
				if token == "" {
					return nil
				}
				continue
			}
			klog.FromContext(ctx).V(1).Info("Could not isolate the object that fails a list page", "error", ierr.Error())
		}
		if err != nil {
			return mg.passError("listing", err)
		}
		mg.noteSizes(bodies)
		pg := page{items: list.Items, bodies: bodies, listed: listed, next: list.Continue, remaining: list.RemainingItemCount, resourceVersion: list.ResourceVersion}
		if bodies != nil {
			wholeLimit = nextWholeLimit(mg.opts.PageSize, wholeLimit, bodies)
			mg.holdBodies(ctx, &pg)
		}
		if !mg.send(ctx, pages, pg) {
			return nil
		}
		if list.Continue == "" {
			return nil
		}
		token, remaining = list.Continue, list.RemainingItemCount
	}
}

// send hands a listed page to the workers, or returns false when the pass
// ends first.
func (mg *migration) send(ctx context.Context, pages chan<- page, pg page) bool {
	select {
	case pages <- pg:
		return true
	case <-ctx.Done():
		mg.release(pg.charge)
		return false
	}
}

// mayIsolate reports whether a page that no served version lists may be
// taken apart (isolate.go): in a pass over a whole resource, a CRD's, up to
// maxFailedObjects times in a migration. The re-check isolates as the first
// pass does: an object written at the old version within the settle window
// that cannot be converted fails its page there too.
func (mg *migration) mayIsolate() bool {
	return mg.target.CRD != nil && !mg.target.Partial() && mg.isolated.Add(1) <= maxFailedObjects
}

// listPage lists one page through the storage version (whole objects, when
// whole is set and the pass may write them back as listed) and, if that
// fails transiently, metadata through each fallback version: one object
// whose conversion fails (a conversion webhook refusing it) fails every page
// that holds it when listed through a version it must be converted to, but
// not when listed through the version it is still stored at. A continue
// token is the same whichever version lists through it. A page listed
// through a fallback version has no bodies: its objects are patched. With
// elsewhere set, a page the usual API server does not answer in time may be
// listed through another (listPromptly); without, only the usual server
// answers, as evidence that it works.
func (mg *migration) listPage(ctx context.Context, token string, limit int64, whole, elsewhere bool) (*metav1.PartialObjectMetadataList, []json.RawMessage, error) {
	listFirst := func(ctx context.Context) listFunc {
		return listMetadata(ctx, mg.target.scope(mg.resource), limit)
	}
	if whole && mg.writesWhole() {
		listFirst = func(ctx context.Context) listFunc {
			return func(token string) (*metav1.PartialObjectMetadataList, []json.RawMessage, error) {
				return mg.listWhole(ctx, token, limit)
			}
		}
	}
	var list *metav1.PartialObjectMetadataList
	var bodies []json.RawMessage
	var err error
	if elsewhere {
		list, bodies, err = mg.listPromptly(ctx, token, limit, listFirst)
	} else {
		list, bodies, err = mg.listThrough(ctx, token, listFirst(ctx))
	}
	if err == nil || classify(err) != transient {
		return list, bodies, err
	}
	for _, v := range mg.target.fallbackVersions() {
		gvr := schema.GroupVersionResource{Group: mg.target.Resource.Group, Version: v, Resource: mg.target.Resource.Resource}
		if fallback, _, ferr := mg.listThrough(ctx, token, listMetadata(ctx, mg.target.scope(mg.m.Metadata.Resource(gvr)), limit)); ferr == nil {
			klog.FromContext(ctx).V(1).Info("Listed a page through an older version, since the list through the storage version failed", "version", v, "error", Message(err))
			return fallback, nil, nil
		}
	}
	return nil, nil, err
}

// listAttemptTimeout bounds a list page through one API server while
// restow can list through the others at their own addresses. A server
// whose watch cache is behind etcd holds a page at a resourceVersion it has
// not seen for 3 s, then answers "Too large resource version" with a
// Retry-After of 1 s, which client-go follows up to 10 times: through a
// server whose watch lags 90 s, a page waited 43 s, then failed, and the
// retries went on until the lag ended.
const listAttemptTimeout = 5 * time.Second

// viaPages is how many pages in a row go to the server listElsewhere found
// before the usual one is tried again (its lag may have ended).
const viaPages = 20

// listPromptly lists one page with list, bounded by listAttemptTimeout when
// restow has two or more API server addresses and can verify them (whether
// it reaches every server does not matter here: any server answers a list
// from etcd), and, when that attempt runs out of time, is refused for the
// resourceVersion, or fails without an answer from the server (a broken
// connection, client-go's rate limiter refusing a wait past the deadline),
// through each of those servers in turn (listElsewhere). Once that fails
// too, pages are no longer timed for the rest of the migration: the
// slowness is the resource's, or the addresses do not answer.
func (mg *migration) listPromptly(ctx context.Context, token string, limit int64, list func(context.Context) listFunc) (*metav1.PartialObjectMetadataList, []json.RawMessage, error) {
	if len(mg.target.APIServerAddresses) < 2 || !mg.m.verifiesServers() || mg.slowLists.Load() {
		return mg.listThrough(ctx, token, list(ctx))
	}
	// A page listed elsewhere has no bodies, so it may hold a whole page
	// (a one-object list stays one).
	if limit > 1 {
		limit = max(limit, mg.opts.PageSize)
	}
	if mg.listVia.Load() != nil && mg.viaPages.Add(1)%viaPages != 0 {
		// A server answered where the usual one did not: the pages go
		// there first while it answers.
		if items, err := mg.listElsewhere(ctx, token, limit); err == nil {
			return items, nil, nil
		}
		mg.listVia.Store(nil)
	}
	attempt, cancel := context.WithTimeout(ctx, listAttemptTimeout)
	defer cancel()
	items, bodies, err := mg.listThrough(attempt, token, list(attempt))
	var status apierrors.APIStatus
	if err == nil || ctx.Err() != nil || attempt.Err() == nil && !resourceVersionTooLarge(err) && errors.As(err, &status) {
		if err == nil {
			mg.listVia.Store(nil)
		}
		return items, bodies, err
	}
	log := klog.FromContext(ctx)
	log.V(1).Info("Listing the page through the API servers at their own addresses, since the usual one did not answer in time or its watch cache is behind etcd",
		"error", Message(err))
	items, err = mg.listElsewhere(ctx, token, limit)
	if err == nil {
		return items, nil, nil
	}
	log.V(1).Info("No page is timed any more in this migration: the API servers at their own addresses did not answer either", "error", Message(err))
	mg.slowLists.Store(true)
	return mg.listThrough(ctx, token, list(ctx))
}

// resourceVersionTooLarge says whether err is an API server's answer that
// its watch cache has not reached the resourceVersion a list needs: for a
// consistent list, etcd's latest.
func resourceVersionTooLarge(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil {
		return false
	}
	return slices.ContainsFunc(status.Status().Details.Causes, func(c metav1.StatusCause) bool {
		return c.Type == metav1.CauseTypeResourceVersionTooLarge
	})
}

// listElsewhere lists one page's metadata, never whole objects (a server
// whose CRD informer lags would decode them with an old schema, and an
// update would write that back), through the API servers at their own
// addresses, the one that last answered first, each bounded by
// listAttemptTimeout, for a page the usual client's server did not answer
// in time or said its watch cache is behind etcd. Every server answers a
// list from etcd's state (a consistent one, or one at a continue token's
// resourceVersion), so the page is the same; it has no bodies, so its
// objects are patched. It returns the last error when no server answers.
func (mg *migration) listElsewhere(ctx context.Context, token string, limit int64) (*metav1.PartialObjectMetadataList, error) {
	addresses := mg.target.APIServerAddresses
	if via := mg.listVia.Load(); via != nil {
		addresses = append([]string{*via}, slices.DeleteFunc(slices.Clone(addresses), func(a string) bool { return a == *via })...)
	}
	var err error
	for _, address := range addresses {
		var server metadata.Interface
		if server, err = mg.m.serverMetadata(address); err != nil {
			return nil, err
		}
		attempt, cancel := context.WithTimeout(ctx, listAttemptTimeout)
		var list *metav1.PartialObjectMetadataList
		list, _, err = mg.listThrough(attempt, token, listMetadata(attempt, mg.target.scope(server.Resource(mg.target.Resource)), limit))
		cancel()
		if err == nil {
			if via := mg.listVia.Swap(&address); via == nil || *via != address {
				klog.FromContext(ctx).V(1).Info("Listing pages through another API server", "server", address)
			}
			return list, nil
		}
	}
	return nil, err
}

// listFunc lists one page from a continue token.
type listFunc func(token string) (*metav1.PartialObjectMetadataList, []json.RawMessage, error)

// listMetadata lists pages of limit objects' metadata through resource.
func listMetadata(ctx context.Context, resource metadata.ResourceInterface, limit int64) listFunc {
	return func(token string) (*metav1.PartialObjectMetadataList, []json.RawMessage, error) {
		list, err := resource.List(ctx, metav1.ListOptions{Limit: limit, Continue: token})
		if err == nil {
			metadataOnly(list.Items)
		}
		return list, nil, err
	}
}

// metadataOnly keeps of listed objects only what a rewrite uses: name,
// namespace, UID, resourceVersion and managedFields. Annotations and labels
// are dropped as soon as they are decoded: the annotation
// kubectl.kubernetes.io/last-applied-configuration holds an object's whole
// contents (a Secret's data, when it was applied with kubectl), and a
// metadata-only list still carries it.
func metadataOnly(items []metav1.PartialObjectMetadata) {
	for i := range items {
		m := &items[i].ObjectMeta
		items[i] = metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{
			Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion, ManagedFields: m.ManagedFields,
		}}
	}
}

// listThrough lists one page with list. The list's snapshot must still be in
// etcd: when the token outlived etcd's compaction, the error carries a token
// that continues inconsistently. Objects changed since are already stored at
// the new version (and re-checked before any prune), and rewrites are
// idempotent, so nothing is missed. Without one, it starts over.
func (mg *migration) listThrough(ctx context.Context, token string, list listFunc) (*metav1.PartialObjectMetadataList, []json.RawMessage, error) {
	items, bodies, err := list(token)
	for expired := 0; apierrors.IsResourceExpired(err) && token != "" && expired < 3; expired++ {
		token = inconsistentContinue(err)
		klog.FromContext(ctx).V(2).Info("Continue token expired, continuing the list", "restarted", token == "")
		items, bodies, err = list(token)
	}
	return items, bodies, err
}

func inconsistentContinue(err error) string {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return status.Status().Continue
	}
	return ""
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
