package hatest

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/restow/restow/internal/cli"
	"github.com/restow/restow/internal/testenv"
)

// stalledThroughPlugin runs `kubectl restow run` for fx's resource, as a
// user would, against the first API server (which has switched) while the
// last lags past tc.LagLimit: the plugin must exit 2 (cli.ExitPending),
// saying APIServerLagging, the lag limit and the lagging server, with
// nothing written or pruned (read from etcd).
func stalledThroughPlugin(t *testing.T, ha *testenv.Env, tc LagCase, fx testenv.Fixture, observer *testenv.PruneObserver, n int) {
	t.Helper()
	kubeconfig := kubeconfigFor(t, ha.ServerConfig(0))
	args := []string{"run", fx.CRDName(), "--kubeconfig", kubeconfig,
		"--apiserver-lag-bound", tc.LagBound.String(), "--apiserver-lag-limit", tc.LagLimit.String(), "--settle-window", "5s"}
	var out, errOut bytes.Buffer
	code := cli.Execute(t.Context(), args, genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	t.Logf("kubectl restow %s: exit %d\n%s%s", strings.Join(args, " "), code, out.String(), errOut.String())
	if code != cli.ExitPending {
		t.Errorf("kubectl restow run exited %d, want %d (an API server still at the old version after --apiserver-lag-limit)", code, cli.ExitPending)
	}
	for _, want := range append([]string{"error: APIServerLagging: ", "--apiserver-lag-limit", "nothing was rewritten or pruned"}, tc.Says...) {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("kubectl restow run said nothing with %q on stderr", want)
		}
	}
	observer.AssertNoEarlyPrune(t, false)
	fx.AssertStored(t, map[string]int{"v1beta1": n})
	fx.AssertStoredVersions(t, "v1beta1", "v1")
}

// kubeconfigFor writes a kubeconfig file that holds cfg's server and
// credentials.
func kubeconfigFor(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	kubeconfig := clientcmdapi.NewConfig()
	kubeconfig.Clusters["server"] = &clientcmdapi.Cluster{
		Server:                   cfg.Host,
		CertificateAuthority:     cfg.CAFile,
		CertificateAuthorityData: cfg.CAData,
		TLSServerName:            cfg.ServerName,
	}
	kubeconfig.AuthInfos["admin"] = &clientcmdapi.AuthInfo{
		ClientCertificate:     cfg.CertFile,
		ClientCertificateData: cfg.CertData,
		ClientKey:             cfg.KeyFile,
		ClientKeyData:         cfg.KeyData,
		Token:                 cfg.BearerToken,
	}
	kubeconfig.Contexts["server"] = &clientcmdapi.Context{Cluster: "server", AuthInfo: "admin"}
	kubeconfig.CurrentContext = "server"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kubeconfig, path); err != nil {
		t.Fatal(err)
	}
	return path
}
