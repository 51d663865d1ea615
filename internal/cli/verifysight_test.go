package cli_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/restow/restow/internal/cli"
	"github.com/restow/restow/internal/testenv"
)

// TestVerifyAllDiscoverySight: verify --all reads only what discovery
// lists, so a group version whose discovery fails is a group it did not
// read. Through a server that serves only the legacy per-group discovery
// (a proxy in front of the API server), a CRD's group version answering
// 503 fails the run, naming it (exit 7); an aggregated API server that
// does not answer (an APIService whose Service is gone, as a dead
// metrics-server's) is left out and named, by the APIService list there
// and by the aggregator's own "stale" through aggregated discovery.
func TestVerifyAllDiscoverySight(t *testing.T) {
	fx := testenv.Fixture{Env: env, Group: "sight.restow.dev", Kind: "Widget", Plural: "widgets", Namespaced: true}
	fx.Install(t, "v1")
	fx.CreateObjects(t, "v1", 2, plain, "sight")
	const deadGroup = "metrics.sight.restow.dev"
	deadAggregatedAPI(t, deadGroup)

	legacy := legacyDiscoveryKubeconfig(t, "/apis/"+fx.Group+"/v1")
	stdout, stderr, code := restowWith(t.Context(), t, legacy, "verify", "--all", "--etcd-endpoints", env.EtcdURL())
	if code != cli.ExitUnaccounted || !strings.Contains(stderr, "discovery failed for "+fx.Group+"/v1 (HTTP 503") ||
		!strings.Contains(stderr, "which no aggregated API server serves") || strings.Contains(stdout, "every object matches") {
		t.Errorf("legacy discovery, %s/v1 answering 503: exit %d, want %d naming it:\n%s%s", fx.Group, code, cli.ExitUnaccounted, stdout, stderr)
	}

	legacy = legacyDiscoveryKubeconfig(t)
	stdout, stderr, code = restowWith(t.Context(), t, legacy, "verify", "--all", "--etcd-endpoints", env.EtcdURL())
	if code != 0 || !strings.Contains(stdout, deadGroup+"/v1beta1: left out: served by an aggregated API server (an APIService) whose discovery failed (HTTP 503") {
		t.Errorf("legacy discovery, the aggregated API answering 503: exit %d, want 0 with it left out:\n%s%s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, fx.CRDName()+": 2 objects in etcd") {
		t.Errorf("legacy discovery: verify --all did not read %s:\n%s", fx.CRDName(), stdout)
	}

	stdout, stderr, code = verifyOn(t, env, "--all")
	if code != 0 || !strings.Contains(stdout, deadGroup+"/v1beta1: left out: served by an aggregated API server whose discovery is stale") {
		t.Errorf("aggregated discovery, the APIService stale: exit %d, want 0 with it left out:\n%s%s", code, stdout, stderr)
	}
}

// deadAggregatedAPI registers group/v1beta1 as served by an APIService
// whose Service does not exist, and waits until aggregated discovery marks
// it stale. No Service means no address: the aggregator answers 503 for it
// without sending anything anywhere.
func deadAggregatedAPI(t *testing.T, group string) {
	t.Helper()
	apiService := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
		"metadata": map[string]any{"name": "v1beta1." + group},
		"spec": map[string]any{
			"group": group, "version": "v1beta1", "groupPriorityMinimum": int64(100), "versionPriority": int64(100),
			"insecureSkipTLSVerify": true,
			"service":               map[string]any{"namespace": "restow-no-such-namespace", "name": "dead-metrics-server", "port": int64(443)},
		},
	}}
	if err := env.Client.Create(t.Context(), apiService); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), apiService) })
	disco := discovery.NewDiscoveryClientForConfigOrDie(env.Config)
	gv := schema.GroupVersion{Group: group, Version: "v1beta1"}
	testenv.WaitProgress(t, "aggregated discovery to mark "+gv.String()+" stale", 30*time.Second, func(context.Context) (bool, string, error) {
		_, err := disco.ServerPreferredResources()
		var failed *discovery.ErrGroupDiscoveryFailed
		if errors.As(err, &failed) {
			var stale discovery.StaleGroupVersionError
			return errors.As(failed.Groups[gv], &stale), fmt.Sprint(err), nil
		}
		return false, fmt.Sprint(err), nil
	})
}

// legacyDiscoveryKubeconfig writes a kubeconfig for a proxy in front of the
// package's API server that serves only the legacy per-group discovery, as
// older servers and some proxies do: it asks the API server for the legacy
// document whatever the client accepts, and answers 503 at each path in
// broken. It listens on loopback for the test's length.
func legacyDiscoveryKubeconfig(t *testing.T, broken ...string) string {
	t.Helper()
	transport, err := rest.TransportFor(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	target, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	proxy := &httputil.ReverseProxy{
		Transport: transport,
		Rewrite: func(r *httputil.ProxyRequest) {
			r.Out.URL.Scheme, r.Out.URL.Host = target.Scheme, target.Host
			if strings.Contains(r.In.Header.Get("Accept"), "as=APIGroupDiscoveryList") {
				r.Out.Header.Set("Accept", "application/json")
			}
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			t.Logf("the legacy discovery proxy: %s %s: %v", r.Method, r.URL, err)
			w.WriteHeader(http.StatusBadGateway)
		},
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, path := range broken {
			if r.URL.Path == path {
				http.Error(w, "the service is unavailable", http.StatusServiceUnavailable)
				return
			}
		}
		proxy.ServeHTTP(w, r)
	})
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	server := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = server.Serve(listener) }()
	t.Cleanup(func() { _ = server.Close() })
	config := clientcmdapi.NewConfig()
	config.Clusters["legacy"] = &clientcmdapi.Cluster{Server: "http://" + listener.Addr().String()}
	config.AuthInfos["legacy"] = &clientcmdapi.AuthInfo{}
	config.Contexts["legacy"] = &clientcmdapi.Context{Cluster: "legacy", AuthInfo: "legacy"}
	config.CurrentContext = "legacy"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*config, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestVerifySharedEtcd: two clusters in one etcd under different
// --etcd-prefix values, the other one larger and holding objects of the same
// names (copied, as a cluster restored from the same backup would). verify
// pointed at the other prefix finds more keys than the API lists, the same
// first object's name: unaccounted (exit 7), and with --etcd-shared too,
// since the first object the API lists is not there at its own revision.
// Pointed at the API server's own prefix, --etcd-shared passes.
func TestVerifySharedEtcd(t *testing.T) {
	fx := testenv.Fixture{Env: env, Group: "shared.restow.dev", Kind: "Widget", Plural: "widgets", Namespaced: true}
	fx.Install(t, "v1")
	fx.CreateObjects(t, "v1", 3, plain, "shared")
	kv := etcdKV(t, env)
	own := "/registry/" + fx.Group + "/widgets/"
	resp, err := kv.Get(t.Context(), own, clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 3 {
		t.Fatalf("reading the 3 widgets in etcd: %v, %d keys", err, len(resp.Kvs))
	}
	other := "/other-cluster/" + fx.Group + "/widgets/"
	for _, item := range resp.Kvs {
		if _, err := kv.Put(t.Context(), other+strings.TrimPrefix(string(item.Key), own), string(item.Value)); err != nil {
			t.Fatal(err)
		}
	}
	// The other cluster has two more, after them in key order.
	for _, name := range []string{"zz-1", "zz-2"} {
		if _, err := kv.Put(t.Context(), other+"shared/"+name, string(resp.Kvs[0].Value)); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _, _ = kv.Delete(context.Background(), other, clientv3.WithPrefix()) })

	stdout, stderr, code := verifyOn(t, env, fx.CRDName(), "--etcd-prefix", "/other-cluster", "--expect-version", "v1")
	if code != cli.ExitUnaccounted || !strings.Contains(stdout, "unaccounted: etcd holds 5 keys under "+other+" at revision ") ||
		!strings.Contains(stdout, "but the API lists 3 objects at that revision: these keys are not all this API server's") || strings.Contains(stdout, "every object matches") {
		t.Errorf("the larger cluster's prefix: exit %d, want %d:\n%s%s", code, cli.ExitUnaccounted, stdout, stderr)
	}
	stdout, stderr, code = verifyOn(t, env, fx.CRDName(), "--etcd-prefix", "/other-cluster", "--etcd-shared", "--expect-version", "v1")
	if code != cli.ExitUnaccounted || !strings.Contains(stdout, "unaccounted: the first object the API lists at revision ") ||
		!strings.Contains(stdout, "but etcd's key "+other+"shared/") || strings.Contains(stdout, "every object matches") {
		t.Errorf("the larger cluster's prefix, --etcd-shared: exit %d, want %d:\n%s%s", code, cli.ExitUnaccounted, stdout, stderr)
	}
	stdout, stderr, code = verifyOn(t, env, fx.CRDName(), "--etcd-shared", "--expect-version", "v1")
	if code != 0 || !strings.Contains(stdout, "every object matches") {
		t.Errorf("the API server's own prefix, --etcd-shared: exit %d, want 0:\n%s%s", code, stdout, stderr)
	}
}
