package migrator

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// fate is what one object's rewrite came to: the engine counts objects by
// their fate.
type fate int

const (
	// migrated: the API server accepted the rewrite.
	migrated fate = iota
	// skipped: someone wrote or deleted the object after it was listed; any
	// write since the storage switch stored it at the new version.
	skipped
	// transient: the API server or a conversion webhook failed in a way that
	// passes; retry with backoff.
	transient
	// permanent: the object cannot be rewritten as it is (admission denial,
	// invalid object, forbidden); record it and go on.
	permanent
	// unsupported: the resource cannot be rewritten at all.
	unsupported
	// alreadyStored: the API server accepted the rewrite and wrote nothing,
	// since the object was already stored at the target version.
	alreadyStored
	// halted: restow itself stops the pass (a *StalledError: etcd's room,
	// package quota) before it sends the write.
	halted
)

func (o fate) String() string {
	return [...]string{"migrated", "skipped", "transient", "permanent", "unsupported", "alreadyStored", "halted"}[o]
}

// classify maps the error of one rewrite (or list) to a fate.
func classify(err error) fate {
	var stalled *StalledError
	switch {
	case err == nil:
		return migrated
	case errors.As(err, &stalled):
		return halted
	case apierrors.IsConflict(err), apierrors.IsNotFound(err), apierrors.IsGone(err) && !apierrors.IsResourceExpired(err):
		return skipped
	case apierrors.IsMethodNotSupported(err):
		return unsupported
	case apierrors.IsTooManyRequests(err), apierrors.IsServerTimeout(err), apierrors.IsTimeout(err),
		apierrors.IsServiceUnavailable(err), apierrors.IsInternalError(err), apierrors.IsUnexpectedServerError(err),
		apierrors.IsUnauthorized(err):
		// A conversion webhook that is down or failing surfaces as 500; an
		// API server restarting as 503, 429 or a connection error; 401 while
		// credentials rotate.
		return transient
	case apierrors.IsBadRequest(err), apierrors.IsForbidden(err), apierrors.IsInvalid(err),
		apierrors.IsRequestEntityTooLargeError(err):
		return permanent
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		code := status.Status().Code
		switch {
		case code >= 500 || code == 0:
			return transient
		case code >= 400:
			return permanent
		}
	}
	// No API status: the connection failed (refused, reset, EOF, timeout).
	// Nothing was decided about the object.
	return transient
}

// maxReasonLength is what status.failedObjects[].reason holds.
const maxReasonLength = 64

// reasonPattern is a CamelCase reason such as Forbidden, as the API server
// and well-behaved webhooks set Status.Reason.
var reasonPattern = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9]*$`)

// reasonFor is a short CamelCase reason for a permanent failure, for
// status.failedObjects. A webhook may put a whole sentence into its
// Status.Reason (webhooks built on older controller-runtime, Gatekeeper):
// then the reason is the one of the answer's HTTP code, such as Invalid for
// 422 (the sentence is in the message already), so status can always hold
// it.
func reasonFor(err error) string {
	reason := string(apierrors.ReasonForError(err))
	if reasonPattern.MatchString(reason) && len(reason) <= maxReasonLength && reason != string(metav1.StatusReasonUnknown) {
		return reason
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		code := int(status.Status().Code)
		if byCode := apierrors.NewGenericServerResponse(code, "", schema.GroupResource{}, "", "", 0, false).ErrStatus.Reason; byCode != metav1.StatusReasonUnknown && byCode != "" {
			return string(byCode)
		}
	}
	return "Failed"
}

// maxMessageLength bounds a message in a condition or
// status.failedObjects (which holds 512 bytes).
const maxMessageLength = 300

// Message is the API server's message for err, cut to fit a condition or
// status.failedObjects, with the values of the fields it names withheld.
// The API server's field errors quote the value they refuse ("spec.password:
// Invalid value: \"...\": ..."), and status, events and logs must never hold
// object contents. A webhook's or an admission policy's own words are kept
// as they are otherwise: they come from the cluster's admins, who choose
// what their messages say.
func Message(err error) string {
	return MessageUpTo(err, maxMessageLength)
}

// MessageUpTo is Message cut at limit bytes rather than 300: for a
// condition's message, which may be longer than status.failedObjects holds.
func MessageUpTo(err error, limit int) string {
	msg := err.Error()
	var status apierrors.APIStatus
	if errors.As(err, &status) && status.Status().Message != "" {
		msg = status.Status().Message
	}
	return cut(withholdValues(msg), limit)
}

// cut shortens msg to at most limit bytes, ending it with "..." if cut.
func cut(msg string, limit int) string {
	if len(msg) > limit {
		msg = strings.ToValidUTF8(msg[:limit-3], "") + "..."
	}
	return msg
}

// valueMarkers start a rejected value in a field error's text (the API
// server's field.Error.ErrorBody). The counts after "Too many" and "Too
// few" are no contents.
var valueMarkers = []string{"Invalid value: ", "Unsupported value: ", "Duplicate value: ", "Not found: "}

// withheld stands in for a value withheld from a message.
const withheld = "(value withheld)"

// withholdValues replaces the values of field errors in msg with withheld,
// keeping the fields and the details: the value after each marker, and,
// from the first marker on, every double-quoted string, since a detail may
// quote the value again (OpenAPI's format errors: `must be of type email:
// "..."`) and a value printed as Go syntax quotes the strings in it. The
// object's name before the first marker is kept.
func withholdValues(msg string) string {
	first := -1
	for _, m := range valueMarkers {
		if i := strings.Index(msg, m); i >= 0 && (first < 0 || i < first) {
			first = i
		}
	}
	if first < 0 {
		return msg
	}
	var b strings.Builder
	b.WriteString(msg[:first])
	rest := msg[first:]
	for rest != "" {
		if marker, ok := valueMarkerAt(rest); ok {
			b.WriteString(marker)
			b.WriteString(withheld)
			rest = afterValue(rest[len(marker):])
			continue
		}
		if rest[0] == '"' {
			if quoted, err := strconv.QuotedPrefix(rest); err == nil {
				b.WriteString(withheld)
				rest = rest[len(quoted):]
				continue
			}
		}
		b.WriteByte(rest[0])
		rest = rest[1:]
	}
	return b.String()
}

func valueMarkerAt(s string) (string, bool) {
	for _, m := range valueMarkers {
		if strings.HasPrefix(s, m) {
			return m, true
		}
	}
	return "", false
}

// afterValue is what follows the value that s starts with: a string
// quoted as Go quotes it, or a JSON value (number, bool, null, object,
// array), as field.Error prints them. Anything else is withheld up to the
// detail that follows it (": ..."), or to the end; the quoted strings in
// what follows are withheld by the caller.
func afterValue(s string) string {
	if quoted, err := strconv.QuotedPrefix(s); err == nil {
		return s[len(quoted):]
	}
	dec := json.NewDecoder(strings.NewReader(s))
	var v any
	if err := dec.Decode(&v); err == nil {
		return s[dec.InputOffset():]
	}
	if i := strings.Index(s, ": "); i >= 0 {
		return s[i:]
	}
	return ""
}

// TransientError means the pass could not go on for a cause that passes (an
// API server restarting, a conversion webhook down). Retry later; the pass
// resumes from its continue token.
type TransientError struct {
	Err error
}

func (e *TransientError) Error() string { return "transient: " + e.Err.Error() }
func (e *TransientError) Unwrap() error { return e.Err }

// StalledError means the migration cannot go on without a user's action:
// the resource does not exist, cannot be listed or patched, or cannot be
// migrated as asked. Message says what to change.
type StalledError struct {
	// Reason says why, when it is not that the resource cannot be
	// migrated: ReasonAPIServerLagging, or "".
	Reason  string
	Message string
}

// ReasonAPIServerLagging is StalledError.Reason when an API server restow
// reaches still stored at the old version Migrator.LagLimit after the
// switch (switch.go).
const ReasonAPIServerLagging = "APIServerLagging"

func (e *StalledError) Error() string { return "stalled: " + e.Message }

// ReasonUnsupported is the reason of a StalledError without one of its
// own: the resource cannot be migrated as asked.
const ReasonUnsupported = "Unsupported"

// Why is the reason a StorageMigration's Stalled condition, or the plugin,
// gives for e: its Reason, or ReasonUnsupported.
func (e *StalledError) Why() string {
	if e.Reason != "" {
		return e.Reason
	}
	return ReasonUnsupported
}

// WaitError means the migration has not started because the API server is
// not ready for it yet (it does not store at the new version yet).
type WaitError struct {
	Message string
	// Servers: the API servers store a built-in resource at different
	// versions, or some cannot be read, as during a control-plane upgrade,
	// which takes minutes to hours, not a CRD informer's second.
	Servers bool
}

func (e *WaitError) Error() string { return "waiting: " + e.Message }

// passError turns an error that stops the pass into a typed one.
func (mg *migration) passError(doing string, err error) error {
	gr := mg.target.Resource.GroupResource()
	switch classify(err) {
	case halted:
		return err
	case skipped:
		if apierrors.IsNotFound(err) {
			// The list itself found no resource: its CRD is gone.
			return &StalledError{Message: fmt.Sprintf("%s %s: the resource no longer exists: %s", doing, gr, Message(err))}
		}
		return &TransientError{Err: fmt.Errorf("%s %s: %w", doing, gr, err)}
	case unsupported, permanent:
		// A list or rewrite refused for the whole resource.
		return &StalledError{Message: fmt.Sprintf("%s %s: %s", doing, gr, Message(err))}
	default:
		return &TransientError{Err: fmt.Errorf("%s %s: %w", doing, gr, err)}
	}
}
