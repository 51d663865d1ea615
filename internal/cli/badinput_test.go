package cli_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/klog/v2"

	"github.com/restow/restow/internal/cli"
	"github.com/restow/restow/internal/testenv"
)

// execute runs kubectl-restow with args and nothing else (no kubeconfig
// added), and returns what it printed and its exit code.
func execute(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = cli.Execute(t.Context(), args, genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	t.Logf("kubectl restow %s: exit %d\n%s%s", strings.Join(args, " "), code, out.String(), errOut.String())
	return out.String(), errOut.String(), code
}

// unreachableKubeconfig writes a kubeconfig whose API server does not
// answer: a command that reaches for it says "cannot reach the API server".
func unreachableKubeconfig(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["nowhere"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:1", InsecureSkipTLSVerify: true}
	cfg.AuthInfos["nobody"] = &clientcmdapi.AuthInfo{Token: "none"}
	cfg.Contexts["nowhere"] = &clientcmdapi.Context{Cluster: "nowhere", AuthInfo: "nobody"}
	cfg.CurrentContext = "nowhere"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// badTokenKubeconfig writes a kubeconfig for the test control plane whose
// user is a bearer token the API server does not know: every request is
// answered 401.
func badTokenKubeconfig(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(path); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for name := range cfg.AuthInfos {
		cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: "not-a-token-this-api-server-knows"}
	}
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// assertOneLine checks that a failed command exited 1, as docs/cli.md
// says of every error but a pass's outcome, printed nothing on stdout, and
// said why in exactly one line naming want.
func assertOneLine(t *testing.T, stdout, stderr string, code int, want string) {
	t.Helper()
	if code != 1 {
		t.Errorf("exit code %d, want 1", code)
	}
	if stdout != "" {
		t.Errorf("stdout %q, want nothing", stdout)
	}
	testenv.AssertOneErrorLine(t, stderr, want)
}

// TestBadFlagValues: every command given a flag value it does not take, a
// missing or empty argument, or a kubeconfig file that does not exist exits
// 1 with one line naming the flag and the value, before any request: the
// kubeconfig names an API server that does not answer, so a command that
// reached for it would say so instead.
func TestBadFlagValues(t *testing.T) {
	concurrency, pageSize := testenv.SpecSizeBounds(t)
	itoa := func(n int64) string { return strconv.FormatInt(n, 10) }
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"plan", "--assumed-rate=0"}, "--assumed-rate must be a positive number of objects per second, got 0"},
		{[]string{"plan", "--assumed-rate=-300"}, "--assumed-rate must be a positive number of objects per second, got -300"},
		{[]string{"plan", "--assumed-rate=NaN"}, "--assumed-rate must be a positive number of objects per second, got NaN"},
		{[]string{"plan", "--assumed-rate=+Inf"}, "--assumed-rate must be a positive number of objects per second, got +Inf"},
		{[]string{"plan", "--assumed-rate=fast"}, `--assumed-rate "fast" is not a number`},
		{[]string{"plan", "-o", "xml"}, `--output "xml" is not supported`},
		{[]string{"plan", "--fail-if-pending=maybe"}, `--fail-if-pending "maybe" is not true or false`},
		{[]string{"plan", "extra"}, `unknown command "extra"`},
		{[]string{"plan", "--no-such-flag"}, "unknown flag: --no-such-flag"},
		{[]string{"no-such-command"}, `unknown command "no-such-command"`},

		{[]string{"migrate"}, "migrate takes one RESOURCE|CRD argument, got 0"},
		{[]string{"migrate", "a", "b"}, "migrate takes one RESOURCE|CRD argument, got 2"},
		{[]string{"migrate", ""}, "RESOURCE|CRD is empty"},
		{[]string{"migrate", "crontabs", "--timeout=-1s"}, "--timeout must be 0 (no limit) or positive, got -1s"},
		{[]string{"migrate", "crontabs", "--timeout=1h30"}, `--timeout "1h30" is not a duration`},
		{[]string{"migrate", "crontabs", "--wait", "--operator-timeout=0"}, "--operator-timeout must be a positive duration, got 0s"},
		{[]string{"migrate", "crontabs", "--wait", "--operator-timeout=-5s"}, "--operator-timeout must be a positive duration, got -5s"},

		{[]string{"run"}, "run takes one RESOURCE|CRD argument, got 0"},
		{[]string{"run", " "}, "RESOURCE|CRD is empty"},
		{[]string{"run", "crontabs", "--concurrency=0"}, "--concurrency must be between 1 and 1024, got 0"},
		{[]string{"run", "crontabs", "--concurrency=-3"}, "--concurrency must be between 1 and 1024, got -3"},
		{[]string{"run", "crontabs", "--concurrency=" + itoa(concurrency[0]-1)}, "--concurrency must be between " + itoa(concurrency[0]) + " and " + itoa(concurrency[1])},
		{[]string{"run", "crontabs", "--concurrency=" + itoa(concurrency[1]+1)}, "--concurrency must be between " + itoa(concurrency[0]) + " and " + itoa(concurrency[1])},
		{[]string{"run", "crontabs", "--concurrency=many"}, `--concurrency "many" is not a whole number`},
		{[]string{"run", "crontabs", "--page-size=0"}, "--page-size must be between 1 and 10000, got 0"},
		{[]string{"run", "crontabs", "--page-size=-5"}, "--page-size must be between 1 and 10000, got -5"},
		{[]string{"run", "crontabs", "--page-size=" + itoa(pageSize[0]-1)}, "--page-size must be between " + itoa(pageSize[0]) + " and " + itoa(pageSize[1])},
		{[]string{"run", "crontabs", "--page-size=" + itoa(pageSize[1]+1)}, "--page-size must be between " + itoa(pageSize[0]) + " and " + itoa(pageSize[1])},
		{[]string{"run", "crontabs", "--settle-window=0s"}, "--settle-window must be a positive duration, got 0s"},
		{[]string{"run", "crontabs", "--settle-window=-2m"}, "--settle-window must be a positive duration, got -2m0s"},
		{[]string{"run", "crontabs", "--settle-window=120"}, `--settle-window "120" is not a duration: a number with a unit`},
		{[]string{"run", "crontabs", "--apiserver-lag-bound=0"}, "--apiserver-lag-bound must be a positive duration, got 0s"},
		{[]string{"run", "crontabs", "--apiserver-lag-limit=1m", "--apiserver-lag-bound=2m"}, "--apiserver-lag-limit must be at least --apiserver-lag-bound (2m0s), got 1m0s"},
		{[]string{"run", "crontabs", "--apiservers=[fd00::1]"}, `--apiservers: "[fd00::1]" is not host:port`},
		{[]string{"run", "crontabs", "--timeout=-1m"}, "--timeout must be 0 (no limit) or positive, got -1m0s"},
		{[]string{"run", "crontabs", "--dry-run=perhaps"}, `--dry-run "perhaps" is not true or false`},
		{[]string{"run", "crontabs", "-n", "team-a", "-A"}, "--namespace and --all-namespaces cannot be used together"},
		{[]string{"run", "crontabs", "--etcd-quota=lots"}, `--etcd-quota "lots" is not a size, such as 2Gi or 512Mi`},
		{[]string{"run", "crontabs", "--etcd-quota=8Mi"}, "--etcd-quota must be at least 36.0 MiB, got 8Mi"},
		{[]string{"run", "crontabs", "--etcd-write-budget=-1"}, `--etcd-write-budget "-1" is not a size, such as 2Gi or 512Mi`},
		{[]string{"run", "crontabs", "--etcd-key=/k.pem"}, "--etcd-cacert, --etcd-cert and --etcd-key go with --etcd-endpoints"},

		{[]string{"status", "-o", "xml"}, `--output "xml" is not supported`},
		{[]string{"status", ""}, "NAME is empty"},
		{[]string{"status", "a", "b"}, "status takes at most one NAME, got 2"},
		{[]string{"status", "--watch=often"}, `--watch "often" is not true or false`},

		{[]string{"verify"}, "verify needs a RESOURCE (such as crontabs.stable.example.com or secrets) or --all"},
		{[]string{"verify", "secrets", "--all"}, "verify takes RESOURCE arguments or --all, not both"},
		{[]string{"verify", "secrets", ""}, "a RESOURCE argument is empty"},
		{[]string{"verify", "secrets", "--etcd-cert", "client.crt"}, "--etcd-cert and --etcd-key go together"},
		{[]string{"verify", "secrets", "--etcd-endpoints", ""}, "--etcd-endpoints is empty"},
		{[]string{"verify", "secrets", "--names=-1"}, "--names must be 0 (none) or more, got -1"},
		{[]string{"verify", "secrets", "--rate=-5"}, "--rate must be 0 (no limit) or a positive number of objects per second, got -5"},
		{[]string{"verify", "secrets", "--rate=NaN"}, "--rate must be 0 (no limit) or a positive number of objects per second, got NaN"},
		{[]string{"verify", "secrets", "--page-size=0"}, "--page-size must be between 1 and 10000, got 0"},
		{[]string{"verify", "secrets", "--etcd-dial-timeout=0"}, "--etcd-dial-timeout must be a positive duration, got 0s"},
		{[]string{"verify", "secrets", "-o", "xml"}, `--output "xml" is not supported`},

		{[]string{"version", "-o", "yaml"}, `--output "yaml": want json`},
		{[]string{"version", "extra"}, `unknown command "extra"`},

		{[]string{"plan", "--request-timeout=-1s"}, "--request-timeout must be 0 (no limit) or positive, got -1s"},
		{[]string{"plan", "--request-timeout=soon"}, `--request-timeout "soon" is not a duration`},
	}
	kubeconfig := unreachableKubeconfig(t)
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			stdout, stderr, code := execute(t, append([]string{"--kubeconfig", kubeconfig}, tt.args...)...)
			assertOneLine(t, stdout, stderr, code, tt.want)
		})
	}

	missing := filepath.Join(t.TempDir(), "no-such-kubeconfig")
	for _, args := range [][]string{{"plan"}, {"migrate", "crontabs"}, {"run", "crontabs"}, {"status"}} {
		t.Run("missing kubeconfig "+args[0], func(t *testing.T) {
			stdout, stderr, code := execute(t, append([]string{"--kubeconfig", missing}, args...)...)
			assertOneLine(t, stdout, stderr, code, `--kubeconfig "`+missing+`": no such file`)
		})
	}
	// The bounds themselves are taken, and the command goes on to the API
	// server, which does not answer.
	for _, args := range [][]string{
		{"run", "crontabs", "--concurrency=" + itoa(concurrency[1]), "--page-size=" + itoa(pageSize[1]), "--timeout=0"},
		{"run", "crontabs", "--concurrency=" + itoa(concurrency[0]), "--page-size=" + itoa(pageSize[0])},
		{"plan", "--request-timeout=5"},
	} {
		t.Run("in bounds "+strings.Join(args, " "), func(t *testing.T) {
			stdout, stderr, code := execute(t, append([]string{"--kubeconfig", kubeconfig}, args...)...)
			assertOneLine(t, stdout, stderr, code, "cannot reach the API server at https://127.0.0.1:1")
		})
	}
}

// klogOutput sends klog's lines, which client-go writes on the process's
// stderr, to a buffer for the rest of the test.
func klogOutput(t *testing.T) *testenv.LockedBuffer {
	t.Helper()
	buf := &testenv.LockedBuffer{}
	klog.LogToStderr(false)
	klog.SetOutput(buf)
	t.Cleanup(func() {
		klog.SetOutput(os.Stderr)
		klog.LogToStderr(true)
	})
	return buf
}

// TestNoAccessAndUnknownResource, against the test control plane: an
// unknown resource, a kubeconfig whose credentials the API server refuses
// (401) and one whose user may do nothing (403) end every command with exit
// 1 and one line saying so, and nothing else on stderr (client-go's klog
// lines included).
func TestNoAccessAndUnknownResource(t *testing.T) {
	klogged := klogOutput(t)
	admin := filepath.Join(t.TempDir(), "admin")
	if err := env.WriteKubeconfig(admin); err != nil {
		t.Fatal(err)
	}
	nobody := filepath.Join(t.TempDir(), "nobody")
	if err := env.WriteKubeconfigAs(nobody, "restow-test-nobody"); err != nil {
		t.Fatal(err)
	}
	badToken := badTokenKubeconfig(t)
	const crd = "storagemigrations.migration.restow.dev"

	tests := []struct {
		name       string
		kubeconfig string
		args       []string
		want       string
	}{
		{"unknown resource migrate", admin, []string{"migrate", "nosuchthings"}, `the server doesn't have a resource "nosuchthings"`},
		{"unknown resource migrate --wait", admin, []string{"migrate", "nosuchthings.example.com", "--wait"}, `the server doesn't have a resource "nosuchthings.example.com"`},
		{"unknown resource run", admin, []string{"run", "nosuchthings"}, `the server doesn't have a resource "nosuchthings"`},
		{"unknown resource run --dry-run", admin, []string{"run", "nosuchthings.example.com", "--dry-run"}, `the server doesn't have a resource "nosuchthings.example.com"`},
		{"unknown StorageMigration", admin, []string{"status", "nosuchmigration"}, `"nosuchmigration" not found`},
		{"unknown context", admin, []string{"plan", "--context", "nosuchcontext"}, `context "nosuchcontext" does not exist`},

		{"401 plan", badToken, []string{"plan"}, "refused the kubeconfig's credentials (401 Unauthorized)"},
		{"401 migrate", badToken, []string{"migrate", crd, "--wait"}, "refused the kubeconfig's credentials (401 Unauthorized)"},
		{"401 run", badToken, []string{"run", crd}, "refused the kubeconfig's credentials (401 Unauthorized)"},
		{"401 status", badToken, []string{"status"}, "refused the kubeconfig's credentials (401 Unauthorized)"},
		{"401 status --watch", badToken, []string{"status", "--watch"}, "refused the kubeconfig's credentials (401 Unauthorized)"},

		{"403 plan", nobody, []string{"plan"}, `User "restow-test-nobody" cannot list resource "customresourcedefinitions"`},
		{"403 migrate", nobody, []string{"migrate", crd, "--wait"}, `User "restow-test-nobody" cannot list resource "storagemigrations"`},
		{"403 run", nobody, []string{"run", crd}, `error: customresourcedefinitions.apiextensions.k8s.io "` + crd + `" is forbidden: User "restow-test-nobody" cannot get resource "customresourcedefinitions"`},
		{"403 run --dry-run", nobody, []string{"run", "configmaps", "--dry-run"}, `error: customresourcedefinitions.apiextensions.k8s.io "configmaps" is forbidden: User "restow-test-nobody" cannot get resource "customresourcedefinitions"`},
		{"403 status", nobody, []string{"status"}, `User "restow-test-nobody" cannot list resource "storagemigrations"`},
		{"403 status NAME", nobody, []string{"status", "nosuchmigration"}, `User "restow-test-nobody" cannot get resource "storagemigrations"`},
		{"403 status --watch", nobody, []string{"status", "--watch"}, `User "restow-test-nobody" cannot list resource "storagemigrations"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(klogged.String())
			args := append([]string{"--kubeconfig", tt.kubeconfig, "--cache-dir", filepath.Join(t.TempDir(), "cache")}, tt.args...)
			stdout, stderr, code := execute(t, args...)
			assertOneLine(t, stdout, stderr, code, tt.want)
			if logged := klogged.String()[before:]; logged != "" {
				t.Errorf("client-go logged on stderr too:\n%s", logged)
			}
		})
	}
}
