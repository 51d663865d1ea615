package testenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// probeAnnotation marks the requests AdmissionWebhook.Register sends to see
// that the API server calls the webhook; they are allowed at once.
const probeAnnotation = "restow.dev/webhook-probe"

// AdmissionFunc decides one admission request. Object and OldObject hold the
// object after and before the request. It may block, as a slow webhook does.
type AdmissionFunc func(req *admissionv1.AdmissionRequest, object, oldObject *unstructured.Unstructured) *admissionv1.AdmissionResponse

// AdmissionWebhook is a validating admission webhook served over TLS on
// loopback, with a certificate made for the test.
type AdmissionWebhook struct {
	url      string
	caBundle []byte
	probes   atomic.Int64
}

// StartAdmissionWebhook serves decide until the test ends.
func StartAdmissionWebhook(t testing.TB, decide AdmissionFunc) *AdmissionWebhook {
	t.Helper()
	w := &AdmissionWebhook{}
	server, _, caBundle := startTLS(t, http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		var review admissionv1.AdmissionReview
		if err := json.NewDecoder(req.Body).Decode(&review); err != nil || review.Request == nil {
			http.Error(rw, fmt.Sprintf("bad AdmissionReview: %v", err), http.StatusBadRequest)
			return
		}
		object, oldObject := &unstructured.Unstructured{}, &unstructured.Unstructured{}
		_ = object.UnmarshalJSON(review.Request.Object.Raw)
		if review.Request.OldObject.Raw != nil {
			_ = oldObject.UnmarshalJSON(review.Request.OldObject.Raw)
		}
		var response *admissionv1.AdmissionResponse
		if object.GetAnnotations()[probeAnnotation] != oldObject.GetAnnotations()[probeAnnotation] {
			w.probes.Add(1)
			response = &admissionv1.AdmissionResponse{Allowed: true}
		} else {
			response = decide(review.Request, object, oldObject)
		}
		response.UID = review.Request.UID
		review.Request, review.Response = nil, response
		rw.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(rw).Encode(&review)
	}))
	w.url, w.caBundle = server.URL, caBundle
	return w
}

// Register makes the API server call the webhook for every update of
// resource (plural, in group) to objects labelled with selector, with
// failurePolicy Fail, until the test ends. It returns once a probe update of
// probe (an object the selector matches) has reached the webhook.
func (w *AdmissionWebhook) Register(t testing.TB, e *Env, group, resource string, selector map[string]string, probe client.Object) {
	t.Helper()
	ctx := t.Context()
	name := resource + "." + group
	if group == "" {
		name = resource + ".core"
	}
	config := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "hold-" + name},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    "hold." + name,
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: ptr.To(w.url + "/validate"), CABundle: w.caBundle},
			AdmissionReviewVersions: []string{"v1"},
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			TimeoutSeconds:          ptr.To[int32](20),
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: selector},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{group}, APIVersions: []string{"*"}, Resources: []string{resource, resource + "/status"}},
			}},
		}},
	}
	if err := e.Client.Create(ctx, config); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Client.Delete(context.Background(), config) })
	before := w.probes.Load()
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, probeAnnotation, strconv.FormatInt(time.Now().UnixNano(), 10))
		if err := e.Client.Patch(ctx, probe, client.RawPatch(types.MergePatchType, patch)); err != nil {
			return false, err
		}
		return w.probes.Load() > before, nil
	})
	if err != nil {
		t.Fatal(errors.Join(errors.New("the API server never called the admission webhook"), err))
	}
}
