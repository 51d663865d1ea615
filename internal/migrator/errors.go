package migrator

import (
	"errors"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// outcome is what one object's rewrite came to.
type outcome int

const (
	// migrated: the API server accepted the rewrite.
	migrated outcome = iota
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
)

func (o outcome) String() string {
	return [...]string{"migrated", "skipped", "transient", "permanent", "unsupported", "alreadyStored"}[o]
}

// classify maps the error of one rewrite (or list) to an outcome.
func classify(err error) outcome {
	switch {
	case err == nil:
		return migrated
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

// reasonFor is a short CamelCase reason for a permanent failure, for
// status.failedObjects.
func reasonFor(err error) string {
	if reason := apierrors.ReasonForError(err); reason != metav1.StatusReasonUnknown && reason != "" {
		return string(reason)
	}
	return "Failed"
}

// Message is the API server's message for err, cut to fit a condition or
// status.failedObjects. It never
// carries object contents: the API server's messages name fields, not values
// of secret data, and the operator reads no contents but a CRD's objects,
// only to send them back unchanged (update.go).
func Message(err error) string {
	msg := err.Error()
	var status apierrors.APIStatus
	if errors.As(err, &status) && status.Status().Message != "" {
		msg = status.Status().Message
	}
	const maxLen = 300
	if len(msg) > maxLen {
		msg = msg[:maxLen-3] + "..."
	}
	return msg
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
	Message string
}

func (e *StalledError) Error() string { return "stalled: " + e.Message }

// WaitError means the migration has not started because the API server is
// not ready for it yet (it does not store at the new version yet).
type WaitError struct {
	Message string
}

func (e *WaitError) Error() string { return "waiting: " + e.Message }
