package migrator

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/restow/restow/internal/migrator/pace"
)

// An object that cannot be converted (a conversion webhook refusing it)
// fails every list page that holds it when listed through a version it must
// be converted to. listPage gets past it through a served version it is
// still stored at; once the old version is unserved (the documented next
// step), no served version lists it, and every pass would stop at that page
// for good. So the pass isolates the object by its key:
//
//   - the longest prefix of the page that lists is found by halving the
//     limit, and rewritten as a page of its own;
//   - the key of an object that fails to list while the one after it does
//     not is found by bisecting the key space, one character at a time,
//     with one-object lists that start at a chosen key. A continue token
//     is a resourceVersion and the key to start from (the API server's
//     storage.EncodeContinue, unchanged since Kubernetes 1.8), so the pass
//     writes such tokens itself, at the snapshot the pass lists at;
//   - that object is recorded as failed, named, with the list's error, and
//     the list goes on after it. If the API server's counts show that other
//     objects came before it since the last one listed (several unconvertible
//     objects in a row), they are counted as failed too, and named as a range.
//
// A failed object means the pass prunes nothing, so nothing it passed over is
// ever taken as migrated. Isolation needs evidence that the cause is the
// object, not the API server: one of its lists must have returned an object.
// Otherwise, or past maxFailedObjects isolations in a pass, or when a
// token is refused, the list error stands (TransientError, resumed later).

// maxIsolationProbes bounds the one-object lists of one isolation.
const maxIsolationProbes = 3000

// keyHigh is above every character of an object's key: keys are names and
// namespaces, printable ASCII.
const keyHigh = "\x7f"

// continueToken is the API server's continue token (storage.continueToken).
type continueToken struct {
	APIVersion      string `json:"v"`
	ResourceVersion int64  `json:"rv"`
	StartKey        string `json:"start"`
}

func encodeContinue(start string, rv int64) string {
	data, _ := json.Marshal(continueToken{APIVersion: "meta.k8s.io/v1", ResourceVersion: rv, StartKey: start})
	return base64.RawURLEncoding.EncodeToString(data)
}

func decodeContinue(token string) (continueToken, error) {
	data, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil {
		return continueToken{}, err
	}
	var c continueToken
	if err := json.Unmarshal(data, &c); err != nil {
		return continueToken{}, err
	}
	if c.APIVersion != "meta.k8s.io/v1" || c.ResourceVersion <= 0 {
		return continueToken{}, fmt.Errorf("unknown continue token %q", data)
	}
	return c, nil
}

// isolation is the state of one isolation: the snapshot it lists at and
// what it learned.
type isolation struct {
	mg      *migration
	rv      int64
	probes  int
	listErr error
	// converted is set once a list returned an object: the API server
	// converts others.
	converted bool
}

// probeResult is what a one-object list from a key found.
type probeResult struct {
	failed bool
	item   *metav1.PartialObjectMetadata
	// atOrAfter is how many objects have keys at or after the start.
	atOrAfter int64
	next      string
}

// probe lists one object's metadata, through the storage version, from the
// first key at or after start.
func (iso *isolation) probe(ctx context.Context, start string) (probeResult, error) {
	for attempt := 0; ; attempt++ {
		if iso.probes++; iso.probes > maxIsolationProbes {
			return probeResult{}, errors.New("too many lists")
		}
		list, err := iso.mg.resource.List(ctx, metav1.ListOptions{Limit: 1, Continue: encodeContinue(cleanStart(start), iso.rv)})
		switch {
		case err == nil:
			if len(list.Items) == 0 {
				return probeResult{}, nil
			}
			iso.converted = true
			r := probeResult{item: &list.Items[0], atOrAfter: 1, next: list.Continue}
			if list.RemainingItemCount != nil {
				r.atOrAfter += *list.RemainingItemCount
			}
			return r, nil
		case objectFails(err):
			return probeResult{failed: true}, nil
		case classify(err) != transient || attempt >= 3:
			// Overload or a connection that fails again and again, a
			// refused or expired token: no answer about the object.
			return probeResult{}, err
		}
		if err := pace.SleepUntil(ctx, time.Now().Add(time.Duration(100<<attempt)*time.Millisecond)); err != nil {
			return probeResult{}, err
		}
	}
}

// cleanStart makes start a key the API server takes: it refuses a start key
// that path.Clean would change. The first key at or after the result is the
// first at or after start, since no object's key holds an empty, "." or
// ".." segment, or starts with "/".
func cleanStart(start string) string {
	for _, s := range []string{start, start + "\x00"} {
		if path.Clean("/"+s) == "/"+s {
			return s
		}
	}
	// A "/" after a "/" or at the start: no key has it there, nor anything
	// below the next character.
	return start[:len(start)-1] + "0"
}

// errNothingToIsolate says the first object after the page's start lists:
// the page failed for another cause than one object (its size).
var errNothingToIsolate = errors.New("the first object after the page's start lists")

// isolate lists past the object that fails the page from token, returning
// the pages that replace it: the objects before it, and it alone as failed.
// before is how many objects the list had left at token, if known. When the
// snapshot it lists at was compacted meanwhile, it starts again at a
// snapshot of now.
func (mg *migration) isolate(ctx context.Context, token string, limit int64, listErr error, before *int64) ([]page, error) {
	lo, rv := "\x00", int64(0)
	if token != "" {
		c, err := decodeContinue(token)
		if err != nil {
			return nil, err
		}
		lo, rv = c.StartKey, c.ResourceVersion
	}
	pages, err := mg.isolateAt(ctx, lo, rv, limit, listErr, before)
	if apierrors.IsResourceExpired(err) {
		klog.FromContext(ctx).V(1).Info("The snapshot of the list was compacted; isolating at a snapshot of now")
		pages, err = mg.isolateAt(ctx, lo, 0, limit, listErr, nil)
	}
	return pages, err
}

// isolateAt isolates from the key lo at the snapshot rv (0: now).
func (mg *migration) isolateAt(ctx context.Context, lo string, rv, limit int64, listErr error, before *int64) ([]page, error) {
	iso := &isolation{mg: mg, listErr: listErr, rv: rv}
	if rv == 0 {
		current, err := mg.currentResourceVersion(ctx)
		if err != nil {
			return nil, err
		}
		iso.rv = current
	}
	var pages []page
	prefix, err := iso.longestPrefix(ctx, lo, limit)
	if err != nil {
		return nil, err
	}
	if prefix != nil {
		metadataOnly(prefix.Items)
		if prefix.Continue == "" {
			// The page lists whole now: nothing to isolate.
			return []page{{items: prefix.Items, next: "", remaining: prefix.RemainingItemCount, resourceVersion: prefix.ResourceVersion, listed: time.Now()}}, nil
		}
		iso.converted = true
		pages = append(pages, page{items: prefix.Items, next: prefix.Continue, remaining: prefix.RemainingItemCount, resourceVersion: prefix.ResourceVersion, listed: time.Now()})
		c, err := decodeContinue(prefix.Continue)
		if err != nil {
			return nil, err
		}
		lo, before, iso.rv = c.StartKey, prefix.RemainingItemCount, c.ResourceVersion
	}

	key, after, err := iso.boundary(ctx, lo)
	switch {
	case errors.Is(err, errNothingToIsolate) && len(pages) > 0:
		// The page failed for its size: the part that lists is progress.
		return pages, nil
	case err != nil:
		return nil, err
	case !iso.converted:
		return nil, errors.New("no object listed: the API server fails them all")
	}
	// Once more, so a failure that passed is not taken for the object's.
	if again, err := iso.probe(ctx, key); err != nil || !again.failed {
		return nil, errors.Join(fmt.Errorf("the object at key %q lists on a second look", key), err)
	}
	klog.FromContext(ctx).Info("Isolated an object that no served version lists; passing over it", "key", key, "lists", iso.probes, "error", Message(listErr))
	return append(pages, iso.failedPage(key, lo, after, before)), nil
}

// longestPrefix lists the longest prefix of the page from the key lo that
// lists, halving the limit; nil when not even one object does.
func (iso *isolation) longestPrefix(ctx context.Context, lo string, limit int64) (*metav1.PartialObjectMetadataList, error) {
	good, bad := int64(0), limit
	var prefix *metav1.PartialObjectMetadataList
	for bad-good > 1 {
		mid := (good + bad) / 2
		list, err := iso.mg.resource.List(ctx, metav1.ListOptions{Limit: mid, Continue: encodeContinue(cleanStart(lo), iso.rv)})
		switch {
		case err == nil:
			good, prefix = mid, list
		case objectFails(err):
			bad = mid
		default:
			return nil, err
		}
	}
	return prefix, nil
}

// failedPage is the page of the object at key, passed over as failed, with
// the objects before it since lo counted as failed too when the API
// server's counts (before, after) show them, and the token after it.
func (iso *isolation) failedPage(key, lo string, after probeResult, before *int64) page {
	failed := page{items: []metav1.PartialObjectMetadata{{ObjectMeta: keyMeta(key, iso.mg.target.Namespaced)}}, listed: time.Now(), resourceVersion: strconv.FormatInt(iso.rv, 10)}
	note := "passed over: no served version lists it, so it was found by its key"
	switch {
	case before == nil:
		note += "; objects before it in key order may not have been listed either"
	case *before-after.atOrAfter > 1:
		failed.uncounted = *before - after.atOrAfter - 1
		note += fmt.Sprintf("; %d more before it, after %q, could not be listed either", failed.uncounted, strings.TrimSuffix(lo, "\x00"))
	}
	message := cut(note+": "+Message(iso.listErr), maxMessageLength)
	failed.unlisted = []*Failure{{Namespace: failed.items[0].Namespace, Name: failed.items[0].Name, Reason: reasonFor(iso.listErr), Message: message}}
	if after.item != nil {
		failed.next = encodeContinue(key+"\x00", iso.rv)
		failed.remaining = &after.atOrAfter
	}
	return failed
}

// boundary finds, at or after lo, the key of an object that fails to list
// while the first after it does not, bisecting between a start that fails
// (lo) and one that lists (keyHigh) one character at a time. It returns the
// probe from just after that key.
func (iso *isolation) boundary(ctx context.Context, lo string) (string, probeResult, error) {
	switch r, err := iso.probe(ctx, lo); {
	case err != nil:
		return "", probeResult{}, err
	case !r.failed:
		return "", probeResult{}, errNothingToIsolate
	}
	high, err := iso.probe(ctx, keyHigh)
	if err != nil || high.failed {
		return "", probeResult{}, errors.Join(errors.New("a list past every key fails"), err)
	}
	// fails(low) and !fails(high) hold throughout.
	low, highKey := lo, keyHigh
	for {
		k := commonPrefixLen(low, highKey)
		lc, hc := -1, int(highKey[k])
		if k < len(low) {
			lc = int(low[k])
		}
		// The printable characters strictly between the two at position k.
		first, last := max(lc+1, 0x21), min(hc-1, 0x7e)
		if first <= last {
			// Bisect them: chars [first, last], with low below and high above.
			below, above := first-1, last+1
			for above-below > 1 {
				mid := (below + above) / 2
				s := highKey[:k] + string(rune(mid))
				r, err := iso.probe(ctx, s)
				if err != nil {
					return "", probeResult{}, err
				}
				if r.failed {
					below, low = mid, s
				} else {
					above, highKey = mid, s
				}
			}
			continue
		}
		if lc == -1 {
			// low is a prefix of high, with nothing between: low is the key.
			after, err := iso.probe(ctx, low+"\x00")
			if err != nil {
				return "", probeResult{}, err
			}
			if after.failed {
				return "", probeResult{}, fmt.Errorf("the object after key %q fails to list too", low)
			}
			return low, after, nil
		}
		// Nothing between at position k: look further along low's branch.
		highKey = low[:k+1] + keyHigh
	}
}

// objectFails reports whether a list's error is what an object that cannot
// be converted or decoded answers: a 500 (the API server's "corrupt object"
// or the conversion webhook's failure), not overload (429, 503, 504) or a
// connection that failed.
func objectFails(err error) bool {
	var status apierrors.APIStatus
	return errors.As(err, &status) && status.Status().Code == http.StatusInternalServerError
}

func commonPrefixLen(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// keyMeta is the namespace and name an object's key holds.
func keyMeta(key string, namespaced bool) metav1.ObjectMeta {
	if namespaced {
		if ns, name, ok := strings.Cut(key, "/"); ok {
			return metav1.ObjectMeta{Namespace: ns, Name: name}
		}
	}
	return metav1.ObjectMeta{Name: key}
}

// crdResource is CustomResourceDefinitions, listed for a resourceVersion.
var crdResource = apiextensionsv1.SchemeGroupVersion.WithResource("customresourcedefinitions")

// currentResourceVersion is a resourceVersion of now, from a list of CRDs:
// unlike the target's, it lists.
func (mg *migration) currentResourceVersion(ctx context.Context) (int64, error) {
	list, err := mg.m.Metadata.Resource(crdResource).List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(list.ResourceVersion, 10, 64)
}
