package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
)

// ConvertFunc converts obj in place to toVersion (the version alone, such as
// "v1"); the webhook sets apiVersion afterwards.
type ConvertFunc func(obj *unstructured.Unstructured, toVersion string) error

// ConversionWebhook is a CRD conversion webhook served over TLS on loopback,
// with a certificate generated for the test. It can be made to fail, as a
// webhook that is down or broken would.
type ConversionWebhook struct {
	mu       sync.Mutex
	server   *httptest.Server
	handler  http.Handler
	tls      *tls.Config
	url      string
	caBundle []byte
	failing  atomic.Bool
	// refused names the objects whose conversion fails.
	refused sync.Map
	// Conversions counts the objects converted.
	Conversions atomic.Int64
}

// StartConversionWebhook serves convert until the test ends.
func StartConversionWebhook(t testing.TB, convert ConvertFunc) *ConversionWebhook {
	t.Helper()
	w := &ConversionWebhook{}
	w.handler = http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		w.serve(rw, req, convert)
	})
	w.server, w.tls, w.caBundle = startTLS(t, w.handler)
	w.url = w.server.URL
	t.Cleanup(w.Stop)
	return w
}

// startTLS serves handler over TLS on loopback, with a certificate made for
// the test, until the test ends; it returns the server, its TLS
// configuration and the CA bundle that trusts it.
func startTLS(t testing.TB, handler http.Handler) (*httptest.Server, *tls.Config, []byte) {
	t.Helper()
	certPEM, keyPEM, err := selfSignedLoopbackCert()
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	config := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	server := httptest.NewUnstartedServer(handler)
	server.TLS = config
	server.StartTLS()
	t.Cleanup(server.Close)
	return server, config, certPEM
}

// Stop closes the webhook's listener: the API server's calls are then
// refused, as when a webhook's pods are gone.
func (w *ConversionWebhook) Stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.server != nil {
		w.server.Close()
		w.server = nil
	}
}

// Restart serves again on the same address after Stop.
func (w *ConversionWebhook) Restart() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.server != nil {
		return nil
	}
	l, err := net.Listen("tcp", strings.TrimPrefix(w.url, "https://"))
	if err != nil {
		return fmt.Errorf("listening again on %s: %w", w.url, err)
	}
	w.server = &httptest.Server{Listener: l, Config: &http.Server{Handler: w.handler, ReadHeaderTimeout: 10 * time.Second}, TLS: w.tls}
	w.server.StartTLS()
	return nil
}

// SetFailing makes the webhook answer 500 (true) or convert again (false).
func (w *ConversionWebhook) SetFailing(failing bool) { w.failing.Store(failing) }

// Refuse makes every conversion of the named objects fail (refuse) or
// succeed again, as a webhook with a bug for some objects would: the API
// server then fails every request that must convert them, lists included.
func (w *ConversionWebhook) Refuse(refuse bool, names ...string) {
	for _, name := range names {
		if refuse {
			w.refused.Store(name, true)
		} else {
			w.refused.Delete(name)
		}
	}
}

// Conversion is the CRD's spec.conversion that calls this webhook.
func (w *ConversionWebhook) Conversion() *apiextensionsv1.CustomResourceConversion {
	return &apiextensionsv1.CustomResourceConversion{
		Strategy: apiextensionsv1.WebhookConverter,
		Webhook: &apiextensionsv1.WebhookConversion{
			ClientConfig:             &apiextensionsv1.WebhookClientConfig{URL: ptr.To(w.url + "/convert"), CABundle: w.caBundle},
			ConversionReviewVersions: []string{"v1"},
		},
	}
}

func (w *ConversionWebhook) serve(rw http.ResponseWriter, req *http.Request, convert ConvertFunc) {
	if w.failing.Load() {
		http.Error(rw, "conversion webhook failing on purpose", http.StatusInternalServerError)
		return
	}
	var review apiextensionsv1.ConversionReview
	if err := json.NewDecoder(req.Body).Decode(&review); err != nil || review.Request == nil {
		http.Error(rw, fmt.Sprintf("bad ConversionReview: %v", err), http.StatusBadRequest)
		return
	}
	response := &apiextensionsv1.ConversionResponse{UID: review.Request.UID, Result: metav1.Status{Status: metav1.StatusSuccess}}
	for _, raw := range review.Request.Objects {
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(raw.Raw); err != nil {
			response.Result = metav1.Status{Status: metav1.StatusFailure, Message: err.Error()}
			break
		}
		gv := obj.GroupVersionKind().GroupVersion()
		if _, refused := w.refused.Load(obj.GetName()); refused && gv.String() != review.Request.DesiredAPIVersion {
			response.Result = metav1.Status{Status: metav1.StatusFailure, Message: "this webhook cannot convert " + obj.GetName()}
			break
		}
		if gv.String() != review.Request.DesiredAPIVersion {
			to := review.Request.DesiredAPIVersion[len(gv.Group)+1:]
			if err := convert(obj, to); err != nil {
				response.Result = metav1.Status{Status: metav1.StatusFailure, Message: err.Error()}
				break
			}
			obj.SetAPIVersion(review.Request.DesiredAPIVersion)
			w.Conversions.Add(1)
		}
		response.ConvertedObjects = append(response.ConvertedObjects, runtime.RawExtension{Object: obj})
	}
	if response.Result.Status != metav1.StatusSuccess {
		response.ConvertedObjects = nil
	}
	review.Request, review.Response = nil, response
	rw.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(rw).Encode(&review)
}

// selfSignedLoopbackCert makes a certificate for 127.0.0.1 that is its own CA.
func selfSignedLoopbackCert() (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	template := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "restow test conversion webhook"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}
