package migrator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

func TestClassify(t *testing.T) {
	gr := schema.GroupResource{Group: "stable.example.com", Resource: "crontabs"}
	statusErr := func(code int32, reason metav1.StatusReason) error {
		return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: code, Reason: reason, Message: "x"}}
	}
	tests := []struct {
		name string
		err  error
		want fate
	}{
		{"success", nil, migrated},
		{"conflict: written since listed", apierrors.NewConflict(gr, "a", errors.New("changed")), skipped},
		{"not found: deleted since listed", apierrors.NewNotFound(gr, "a"), skipped},
		{"too many requests", apierrors.NewTooManyRequests("slow down", 1), transient},
		{"conversion webhook down: internal error", apierrors.NewInternalError(errors.New("conversion webhook for x failed: connection refused")), transient},
		{"service unavailable", apierrors.NewServiceUnavailable("restarting"), transient},
		{"server timeout", apierrors.NewServerTimeout(gr, "patch", 1), transient},
		{"gateway timeout", apierrors.NewTimeoutError("slow", 1), transient},
		{"502 without a reason", statusErr(502, ""), transient},
		{"unauthorized while credentials rotate", apierrors.NewUnauthorized("expired"), transient},
		{"connection refused", &url.Error{Op: "Patch", URL: "https://x", Err: &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}}, transient},
		{"connection reset", &url.Error{Op: "Patch", URL: "https://x", Err: syscall.ECONNRESET}, transient},
		{"unexpected EOF", &url.Error{Op: "Patch", URL: "https://x", Err: io.ErrUnexpectedEOF}, transient},
		{"client timeout", &url.Error{Op: "Patch", URL: "https://x", Err: context.DeadlineExceeded}, transient},
		{"admission denial (forbidden)", apierrors.NewForbidden(gr, "a", errors.New("denied by policy")), permanent},
		{"invalid object", apierrors.NewInvalid(schema.GroupKind{Group: gr.Group, Kind: "CronTab"}, "a", nil), permanent},
		{"bad request", apierrors.NewBadRequest("nope"), permanent},
		{"418 without a reason", statusErr(418, ""), permanent},
		{"method not allowed", apierrors.NewMethodNotSupported(gr, "patch"), unsupported},
		{"wrapped conflict", fmt.Errorf("patching: %w", apierrors.NewConflict(gr, "a", errors.New("x"))), skipped},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := classify(tt.err); got != tt.want {
				t.Errorf("classify(%v) = %s, want %s", tt.err, got, tt.want)
			}
		})
	}
}

func TestInconsistentContinueFromExpiredError(t *testing.T) {
	expired := &apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonExpired,
		ListMeta: metav1.ListMeta{Continue: "next-inconsistent"},
	}}
	if got := inconsistentContinue(expired); got != "next-inconsistent" {
		t.Errorf("inconsistentContinue = %q, want the token from the error", got)
	}
	if got := inconsistentContinue(errors.New("other")); got != "" {
		t.Errorf("inconsistentContinue(non-status) = %q, want empty (restart the list)", got)
	}
	if !apierrors.IsResourceExpired(expired) {
		t.Error("an expired continue token must be recognised")
	}
}

func TestMessageIsBounded(t *testing.T) {
	long := apierrors.NewForbidden(schema.GroupResource{Resource: "x"}, "a", errors.New(string(make([]byte, 2000))))
	if got := Message(long); len(got) > 300 {
		t.Errorf("Message returned %d bytes, want at most 300", len(got))
	}
}

// A list answered 404 means the resource is gone (its CRD was deleted):
// Stalled/Unsupported, not a transient error retried forever.
func TestPassErrorListNotFoundStalls(t *testing.T) {
	p := &migration{target: Target{Resource: schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}}}
	err := p.passError("listing", apierrors.NewNotFound(schema.GroupResource{Group: "example.com", Resource: "widgets"}, ""))
	var stalled *StalledError
	if !errors.As(err, &stalled) || !strings.Contains(stalled.Message, "no longer exists") {
		t.Fatalf("passError(404) = %#v, want Stalled/Unsupported saying the resource no longer exists", err)
	}
	err = p.passError("listing", apierrors.NewConflict(schema.GroupResource{Group: "example.com", Resource: "widgets"}, "", errors.New("x")))
	var transient *TransientError
	if !errors.As(err, &transient) {
		t.Fatalf("passError(409) = %#v, want transient", err)
	}
}

// TestReasonForFitsStatus: a reason longer than status.failedObjects holds,
// or not a CamelCase word (a webhook's whole sentence), becomes the reason of
// the answer's HTTP code.
func TestReasonForFitsStatus(t *testing.T) {
	sentence := metav1.StatusReason(strings.Repeat("the object was refused by policy ", 10))
	for _, tc := range []struct {
		code   int32
		reason metav1.StatusReason
		want   string
	}{
		{http.StatusForbidden, metav1.StatusReasonForbidden, "Forbidden"},
		{http.StatusUnprocessableEntity, sentence, "Invalid"},
		{http.StatusForbidden, sentence, "Forbidden"},
		{http.StatusBadRequest, "Denied by policy", "BadRequest"},
		{http.StatusConflict, metav1.StatusReason(strings.Repeat("A", 65)), "Conflict"},
		{418, sentence, "Failed"},
	} {
		err := &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: tc.code, Reason: tc.reason, Message: "m"}}
		if got := reasonFor(err); got != tc.want {
			t.Errorf("reasonFor(%d, %.20q...) = %q, want %q", tc.code, tc.reason, got, tc.want)
		}
	}
}

// TestMessageWithholdsValues: the values the API server's field errors
// quote are withheld; fields, details and other words are kept.
func TestMessageWithholdsValues(t *testing.T) {
	gk := schema.GroupKind{Group: "example.com", Kind: "Widget"}
	invalid := apierrors.NewInvalid(gk, "w-1", field.ErrorList{
		field.Invalid(field.NewPath("spec", "password"), "hunter2: with \"quotes\"", "must be at most 4 characters"),
		field.NotSupported(field.NewPath("spec", "mode"), "s3cr3t-mode", []string{"a", "b"}),
		field.Invalid(field.NewPath("spec", "config"), map[string]any{"token": "t0ken: x"}, "must be empty"),
		field.Invalid(field.NewPath("spec", "port"), int64(31337), "out of range"),
		field.Duplicate(field.NewPath("spec", "keys").Index(1), "dup-key"),
		field.Required(field.NewPath("spec", "name"), "a name is needed"),
		field.Invalid(field.NewPath("spec", "email"), "mail-secret", `spec.email in body must be of type email: "mail-secret"`),
		field.Invalid(field.NewPath("spec", "list"), []any{"list-secret", 1}, "must be empty"),
		field.Invalid(field.NewPath("spec", "gomap"), struct{ Token string }{"struct-secret"}, "must be empty"),
	})
	// Message cuts at 300 bytes; withholdValues is the whole of it.
	got := withholdValues(invalid.ErrStatus.Message)
	if len(Message(invalid)) > 300 {
		t.Errorf("Message returned %d bytes", len(Message(invalid)))
	}
	for _, secret := range []string{"hunter2", "s3cr3t", "t0ken", "31337", "dup-key", "mail-secret", "list-secret", "struct-secret"} {
		if strings.Contains(got, secret) {
			t.Errorf("Message kept the value %q: %s", secret, got)
		}
	}
	for _, kept := range []string{`Widget.example.com "w-1" is invalid`, "spec.password: Invalid value: (value withheld): must be at most 4 characters",
		"spec.mode: Unsupported value: (value withheld)", "spec.config: Invalid value: (value withheld): must be empty",
		"spec.port: Invalid value: (value withheld): out of range", "spec.name: Required value: a name is needed"} {
		if !strings.Contains(got, kept) {
			t.Errorf("Message lost %q: %s", kept, got)
		}
	}
	plain := apierrors.NewForbidden(schema.GroupResource{Resource: "widgets"}, "w-1", errors.New("denied by the test"))
	if got, want := Message(plain), plain.ErrStatus.Message; got != want {
		t.Errorf("Message(%q) = %q, want it unchanged", want, got)
	}
}
