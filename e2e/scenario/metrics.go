//go:build e2e

package scenario

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/discovery"

	"github.com/restow/restow/internal/testenv"
)

// What the suite reads of the API server's own metrics: the requests it
// answered for a resource, and the encryption configuration it loaded.

// APIRequests counts, by verb, the requests for group's resource (no
// subresource) that the API server has answered (apiserver_request_total).
func APIRequests(t *testing.T, e *testenv.Env, group, resource string) map[string]float64 {
	t.Helper()
	raw, _ := readMetrics(t, e)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, m := range families["apiserver_request_total"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["resource"] == resource && labels["group"] == group && labels["subresource"] == "" {
			out[labels["verb"]] += m.GetCounter().GetValue()
		}
	}
	return out
}

// readMetrics reads the API server's /metrics once, and says how long it took.
func readMetrics(t *testing.T, e *testenv.Env) ([]byte, time.Duration) {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	raw, err := dc.RESTClient().Get().AbsPath("/metrics").DoRaw(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return raw, time.Since(start)
}

// ConfigHash is the hash kube-apiserver reports of an encryption
// configuration file.
func ConfigHash(t *testing.T, path string) string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("sha256:%x", sha256.Sum256(raw))
}

// WaitReloaded reads the API server's /metrics every half second until it
// reports the encryption configuration of hash, and returns when, with
// the size of one read of /metrics and how long it took.
func WaitReloaded(t *testing.T, e *testenv.Env, hash string) (reloaded time.Time, size int, took time.Duration) {
	t.Helper()
	want := []byte(`hash="` + hash + `"`)
	testenv.WaitProgress(t, "the API server's reload of "+hash, 2*time.Minute, func(context.Context) (bool, string, error) {
		var raw []byte
		raw, took = readMetrics(t, e)
		size = len(raw)
		return bytes.Contains(raw, want), "not yet", nil
	})
	return time.Now(), size, took
}
