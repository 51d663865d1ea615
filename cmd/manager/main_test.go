package main

import (
	"bytes"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/restow/restow/internal/doccheck"
	"github.com/restow/restow/internal/testenv"
)

// TestFlagTable: the flag table of docs/operations.md names every flag of
// the manager, no other, with the defaults the manager uses.
func TestFlagTable(t *testing.T) {
	var o options
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	o.bindFlags(fs)
	documented, err := doccheck.FlagTable("../../docs/operations.md", "## Flags")
	if err != nil {
		t.Fatal(err)
	}
	var defined []doccheck.Flag
	fs.VisitAll(func(f *flag.Flag) { defined = append(defined, doccheck.Flag{Name: f.Name, Default: f.DefValue}) })
	for _, p := range doccheck.Compare("docs/operations.md", documented, defined) {
		t.Error(p)
	}
}

// manager runs the manager's main path with args and returns what it
// printed and its exit code.
func manager(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = execute(args, &out, &errOut)
	t.Logf("manager %s: exit %d\n%s%s", strings.Join(args, " "), code, out.String(), errOut.String())
	return out.String(), errOut.String(), code
}

// assertOneLine checks that the manager said why it stopped in exactly one
// line naming want, with the documented exit code.
func assertOneLine(t *testing.T, stderr string, code, wantCode int, want string) {
	t.Helper()
	if code != wantCode {
		t.Errorf("exit code %d, want %d", code, wantCode)
	}
	testenv.AssertOneErrorLine(t, stderr, want)
}

// TestBadFlags: every flag given a value the manager does not take, an
// unknown flag or an argument ends the manager with exit 2 and one line on
// stderr naming the flag, before it reads the kubeconfig: each run names a
// kubeconfig file that does not exist, which the manager would report
// instead had it got that far.
func TestBadFlags(t *testing.T) {
	concurrency, pageSize := testenv.SpecSizeBounds(t)
	if concurrency != [2]int64{1, maxConcurrency} || pageSize != [2]int64{1, maxPageSize} {
		t.Errorf("spec.concurrency is %v and spec.pageSize %v in the CRD; --concurrency takes 1 to %d and --page-size 1 to %d", concurrency, pageSize, maxConcurrency, maxPageSize)
	}
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--no-such-flag"}, "unknown flag: --no-such-flag"},
		{[]string{"--page-size"}, "--page-size needs a value"},
		{[]string{"serve"}, `unexpected argument "serve": the manager takes flags only`},
		{[]string{"--concurrency=8", "16"}, `unexpected argument "16"`},

		{[]string{"--concurrency=0"}, "--concurrency must be between 1 and 1024, got 0"},
		{[]string{"--concurrency=-8"}, "--concurrency must be between 1 and 1024, got -8"},
		{[]string{"--concurrency=1025"}, "--concurrency must be between 1 and 1024, got 1025"},
		{[]string{"--concurrency=lots"}, `--concurrency "lots" is not a whole number`},
		{[]string{"--max-concurrent-passes=0"}, "--max-concurrent-passes must be between 1 and 64, got 0"},
		{[]string{"--max-concurrent-passes=65"}, "--max-concurrent-passes must be between 1 and 64, got 65"},
		{[]string{"--page-size=0"}, "--page-size must be between 1 and 10000, got 0"},
		{[]string{"--page-size=-5"}, "--page-size must be between 1 and 10000, got -5"},
		{[]string{"--page-size=10001"}, "--page-size must be between 1 and 10000, got 10001"},
		{[]string{"--page-size=1e3"}, `--page-size "1e3" is not a whole number`},
		{[]string{"--kube-api-qps=0"}, "--kube-api-qps must be a positive number of requests per second, got 0"},
		{[]string{"--kube-api-qps=-1"}, "--kube-api-qps must be a positive number of requests per second, got -1"},
		{[]string{"--kube-api-qps=NaN"}, "--kube-api-qps must be a positive number of requests per second, got NaN"},
		{[]string{"--kube-api-qps=Inf"}, "--kube-api-qps must be a positive number of requests per second, got +Inf"},
		{[]string{"--kube-api-qps=fast"}, `--kube-api-qps "fast" is not a number`},
		{[]string{"--kube-api-burst=0"}, "--kube-api-burst must be at least 1, got 0"},
		{[]string{"--kube-api-burst=-1"}, "--kube-api-burst must be at least 1, got -1"},

		{[]string{"--status-interval=0s"}, "--status-interval must be a positive duration, got 0s"},
		{[]string{"--status-interval=-5s"}, "--status-interval must be a positive duration, got -5s"},
		{[]string{"--status-interval=5"}, `--status-interval "5" is not a duration: a number with a unit, such as 30s, 5m or 1h30m`},
		{[]string{"--settle-window=0"}, "--settle-window must be a positive duration (at least twice the API server's --request-timeout), got 0s"},
		{[]string{"--settle-window=-2m"}, "--settle-window must be a positive duration (at least twice the API server's --request-timeout), got -2m0s"},
		{[]string{"--settle-window=2 minutes"}, `--settle-window "2 minutes" is not a duration`},
		{[]string{"--apiserver-lag-bound=0s"}, "--apiserver-lag-bound must be a positive duration, got 0s"},
		{[]string{"--apiserver-lag-bound=30"}, `--apiserver-lag-bound "30" is not a duration`},
		{[]string{"--apiserver-lag-limit=10s"}, "--apiserver-lag-limit must be at least --apiserver-lag-bound (30s), got 10s"},
		{[]string{"--apiservers=10.0.0.11"}, `--apiservers: "10.0.0.11" is not host:port: address 10.0.0.11: missing port in address`},
		{[]string{"--apiservers=10.0.0.11:0"}, `--apiservers: "10.0.0.11:0" is not host:port with a port from 1 to 65535`},
		{[]string{"--stalled-retry-base=0s"}, "--stalled-retry-base must be a positive duration, got 0s"},
		{[]string{"--stalled-retry-base=-1s"}, "--stalled-retry-base must be a positive duration, got -1s"},
		{[]string{"--stalled-retry-max=10s"}, "--stalled-retry-max must be at least --stalled-retry-base (30s), got 10s"},
		{[]string{"--stalled-retry-base=1h"}, "--stalled-retry-max must be at least --stalled-retry-base (1h0m0s), got 30m0s"},
		{[]string{"--stalled-retry-max=later"}, `--stalled-retry-max "later" is not a duration`},

		{[]string{"--etcd-quota=lots"}, `--etcd-quota "lots" is not a size, such as 2Gi or 512Mi`},
		{[]string{"--etcd-quota=-1Gi"}, `--etcd-quota "-1Gi" is not a size, such as 2Gi or 512Mi`},
		{[]string{"--etcd-quota=16Mi"}, "--etcd-quota must be at least 36.0 MiB, got 16Mi"},
		{[]string{"--etcd-write-budget=some"}, `--etcd-write-budget "some" is not a size, such as 2Gi or 512Mi`},
		{[]string{"--etcd-cert=/c.pem"}, "--etcd-cacert, --etcd-cert and --etcd-key go with --etcd-endpoints"},
		{[]string{"--etcd-endpoints=https://127.0.0.1:2379", "--etcd-key=/k.pem"}, "--etcd-cert and --etcd-key go together"},
		{[]string{"--etcd-compaction-bound=0s"}, "--etcd-compaction-bound must be a positive duration, got 0s"},

		{[]string{"--leader-elect=sometimes"}, `--leader-elect "sometimes" is not true or false`},
		{[]string{"--leader-election-lease-duration=0"}, "--leader-election-lease-duration must be a positive duration, got 0s"},
		{[]string{"--leader-election-renew-deadline=-1s"}, "--leader-election-renew-deadline must be a positive duration, got -1s"},
		{[]string{"--leader-election-retry-period=0s"}, "--leader-election-retry-period must be a positive duration, got 0s"},
		{[]string{"--leader-election-renew-deadline=60s"}, "--leader-election-renew-deadline (1m0s) must be shorter than --leader-election-lease-duration (1m0s)"},
		{[]string{"--leader-election-lease-duration=30s"}, "--leader-election-renew-deadline (40s) must be shorter than --leader-election-lease-duration (30s)"},
		{[]string{"--leader-election-retry-period=35s"}, "--leader-election-renew-deadline (40s) must be longer than 1.2 times --leader-election-retry-period (35s)"},
		{[]string{"--leader-election-lease-duration=1m", "--leader-election-renew-deadline=6s"}, "--leader-election-renew-deadline (6s) must be longer than 1.2 times --leader-election-retry-period (5s)"},
		{[]string{"--leader-election-lease-duration=1min"}, `--leader-election-lease-duration "1min" is not a duration`},
		{[]string{"--leader-election-namespace=Restow_System"}, `--leader-election-namespace "Restow_System" is not a namespace name`},

		{[]string{"--auto-migrate-selector=app in (shop"}, `--auto-migrate-selector "app in (shop" is not a label selector`},
		{[]string{"--auto-migrate-selector=app==shop==x"}, `--auto-migrate-selector "app==shop==x" is not a label selector`},
		{[]string{"--auto-migrate=perhaps"}, `--auto-migrate "perhaps" is not true or false`},

		{[]string{"--metrics-bind-address=8443"}, `--metrics-bind-address "8443" is not an address`},
		{[]string{"--metrics-bind-address="}, `--metrics-bind-address "" is not an address`},
		{[]string{"--health-probe-bind-address=:99999"}, `--health-probe-bind-address ":99999" is not an address`},
		{[]string{"--pprof-bind-address=localhost"}, `--pprof-bind-address "localhost" is not an address`},
		{[]string{"--metrics-secure=yes please"}, `--metrics-secure "yes please" is not true or false`},
		{[]string{"--log-level=loud"}, `invalid --log-level "loud"`},
		{[]string{"--log-level=-1"}, `invalid --log-level "-1"`},
		{[]string{"--log-encoding=xml"}, `invalid --log-encoding "xml"`},
	}
	missing := filepath.Join(t.TempDir(), "no-such-kubeconfig")
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			stdout, stderr, code := manager(t, append([]string{"--kubeconfig=" + missing}, tt.args...)...)
			assertOneLine(t, stderr, code, exitUsage, tt.want)
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
		})
	}

	// The defaults, the bounds themselves and the ways to turn an endpoint
	// off are taken: the manager goes on to the kubeconfig.
	for _, args := range [][]string{
		nil,
		{"--concurrency=1", "--page-size=1"},
		{"--concurrency=1024", "--page-size=10000"},
		{"--leader-elect=false", "--metrics-bind-address=0", "--health-probe-bind-address=", "--pprof-bind-address=0"},
		{"--leader-election-lease-duration=15s", "--leader-election-renew-deadline=10s", "--leader-election-retry-period=2s"},
		{"--stalled-retry-base=1s", "--stalled-retry-max=1s", "--status-interval=1s", "--settle-window=1s", "--apiserver-lag-bound=1s"},
		{"--auto-migrate-selector=app.kubernetes.io/part-of=shop", "--leader-election-namespace=restow-system", "--log-level=4", "--log-encoding=console"},
	} {
		t.Run("taken "+strings.Join(args, " "), func(t *testing.T) {
			_, stderr, code := manager(t, append([]string{"--kubeconfig=" + missing}, args...)...)
			assertOneLine(t, stderr, code, exitUsage, `--kubeconfig "`+missing+`": no such file`)
		})
	}

	garbage := filepath.Join(t.TempDir(), "garbage")
	if err := os.WriteFile(garbage, []byte("not a kubeconfig"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, stderr, code := manager(t, "--kubeconfig="+garbage)
	assertOneLine(t, stderr, code, exitUsage, `--kubeconfig "`+garbage+`" is not a usable kubeconfig`)
}

// TestHelpAndVersion: --help prints the flags on stdout and exits 0, as
// --version prints the version.
func TestHelpAndVersion(t *testing.T) {
	for _, help := range []string{"-h", "--help"} {
		stdout, stderr, code := manager(t, help)
		if code != 0 || stderr != "" || !strings.Contains(stdout, "-page-size int") || !strings.Contains(stdout, "(default 500)") {
			t.Errorf("manager %s: exit %d, stderr %q; want 0 and the flags on stdout", help, code, stderr)
		}
	}
	stdout, stderr, code := manager(t, "--version")
	if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "restow manager ") {
		t.Errorf("manager --version: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// TestWhatItDoes: the manager's Starting manager log line says what it migrates by
// itself with the flags it was given, as the docs' "What installing restow
// does" says it for the defaults.
func TestWhatItDoes(t *testing.T) {
	for _, tc := range []struct {
		args         []string
		want, absent []string
	}{
		{nil, []string{"every CRD whose status.storedVersions", "built-in resource"}, []string{"re-encrypts", "only the StorageMigrations"}},
		{[]string{"--auto-migrate=false"}, []string{"built-in resource"}, []string{"every CRD", "only the StorageMigrations"}},
		{[]string{"--auto-migrate-selector=app=shop", "--auto-migrate-builtins=false", "--reencrypt-resources=secrets"},
			[]string{`labels match "app=shop"`, "re-encrypts secrets"}, []string{"built-in resource"}},
		{[]string{"--auto-migrate=false", "--auto-migrate-builtins=false"}, []string{"only the StorageMigrations users create"}, []string{"every CRD", "built-in"}},
	} {
		opts, err := parse(tc.args, io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		got := opts.whatItDoes()
		if tc.args == nil {
			raw, err := os.ReadFile("../../docs/install.md")
			if err != nil {
				t.Fatal(err)
			}
			if quoted := `"migrates":"` + got + `"`; !strings.Contains(strings.Join(strings.Fields(string(raw)), " "), quoted) {
				t.Errorf("docs/install.md does not quote the default install's log line %s", quoted)
			}
		}
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%v: %q lacks %q", tc.args, got, w)
			}
		}
		for _, a := range tc.absent {
			if strings.Contains(got, a) {
				t.Errorf("%v: %q says %q", tc.args, got, a)
			}
		}
	}
}

// TestNoAccess, against a control plane of its own: a kubeconfig whose
// credentials the API server refuses (401), and one whose user has no RBAC
// (403), end the manager at once with exit 1 and one line, instead of
// leader election retrying for ever; nothing is logged before it.
func TestNoAccess(t *testing.T) {
	env := testenv.Start(t, testenv.Options{})
	dir := t.TempDir()
	nobody := filepath.Join(dir, "nobody")
	if err := env.WriteKubeconfigAs(nobody, "restow-test-nobody"); err != nil {
		t.Fatal(err)
	}
	badToken := filepath.Join(dir, "bad-token")
	if err := env.WriteKubeconfig(badToken); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.LoadFromFile(badToken)
	if err != nil {
		t.Fatal(err)
	}
	for name := range cfg.AuthInfos {
		cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: "not-a-token-this-api-server-knows"}
	}
	if err := clientcmd.WriteToFile(*cfg, badToken); err != nil {
		t.Fatal(err)
	}

	for _, tt := range []struct {
		name, kubeconfig, want string
	}{
		{"401", badToken, "refused the manager's credentials (401 Unauthorized)"},
		{"403", nobody, `does not let the manager list customresourcedefinitions (403 Forbidden: customresourcedefinitions.apiextensions.k8s.io is forbidden: User "restow-test-nobody" cannot list resource`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// A manager that got past the check would run until killed.
			done := make(chan struct{})
			var stderr string
			var code int
			go func() {
				defer close(done)
				_, stderr, code = manager(t, "--kubeconfig="+tt.kubeconfig, "--leader-election-namespace=default", "--metrics-bind-address=0", "--health-probe-bind-address=0")
			}()
			select {
			case <-done:
			case <-time.After(time.Minute):
				t.Fatal("the manager did not stop within a minute")
			}
			assertOneLine(t, stderr, code, exitError, tt.want)
		})
	}
}
