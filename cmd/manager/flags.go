package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/restow/restow/internal/logging"
	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/migrator/quota"
)

// maxPasses bounds --max-concurrent-passes: each pass may hold pages of
// metadata and its own pace of requests.
const maxPasses = 64

// The bounds of --concurrency and --page-size: those of a StorageMigration's
// spec.concurrency and spec.pageSize, which they stand in for
// (TestSizeBoundsMatchTheAPI).
const (
	maxConcurrency = 1024
	maxPageSize    = 10000
)

// leaderElectionJitter is client-go's leaderelection.JitterFactor: the
// renew deadline must exceed the retry period times it.
const leaderElectionJitter = 1.2

// usageError is a flag, or a flag's value, that the manager does not take:
// exit code 2.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Errorf(format, args...)}
}

// checkedValue wraps a flag's value to say, when the flag package cannot
// parse it, which flag it was and what the flag takes.
type checkedValue struct {
	flag.Value
	name   string
	failed *error
}

func (v *checkedValue) Set(s string) error {
	err := v.Value.Set(s)
	if err != nil {
		*v.failed = usagef("--%s %q is not %s", v.name, s, takes(v.Value))
	}
	return err
}

func (v *checkedValue) IsBoolFlag() bool {
	b, ok := v.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

func (v *checkedValue) String() string {
	if v == nil || v.Value == nil {
		return ""
	}
	return v.Value.String()
}

// takes says what a flag's value must look like, from its type.
func takes(v flag.Value) string {
	getter, ok := v.(flag.Getter)
	if !ok {
		return "valid"
	}
	switch getter.Get().(type) {
	case time.Duration:
		return "a duration: a number with a unit, such as 30s, 5m or 1h30m"
	case int, int64:
		return "a whole number"
	case float64:
		return "a number"
	case bool:
		return "true or false"
	case quota.Bytes:
		return "a size, such as 2Gi or 512Mi"
	}
	return "valid"
}

// parse reads the flags. For -h or --help it prints them on stdout and
// returns no options and no error.
func parse(args []string, stdout io.Writer) (*options, error) {
	opts := &options{}
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	opts.bindFlags(fs)
	// The flag package prints the error and every flag's usage: one line
	// is enough, and it is execute's.
	fs.SetOutput(io.Discard)
	var badValue error
	fs.VisitAll(func(f *flag.Flag) { f.Value = &checkedValue{Value: f.Value, name: f.Name, failed: &badValue} })
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.VisitAll(func(f *flag.Flag) { f.Value = f.Value.(*checkedValue).Value })
		fs.SetOutput(stdout)
		fmt.Fprintln(stdout, "Usage of the restow manager (docs/operations.md, Flags):")
		fs.PrintDefaults()
		return nil, nil
	case badValue != nil:
		return nil, badValue
	case err != nil:
		msg := err.Error()
		if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
			msg = "unknown flag: --" + name
		} else if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
			msg = "--" + name + " needs a value"
		}
		return nil, &usageError{errors.New(msg)}
	case fs.NArg() > 0:
		return nil, usagef("unexpected argument %q: the manager takes flags only", fs.Arg(0))
	}
	return opts, nil
}

// validate checks the values of the flags, before the manager reaches the
// API server, and returns the parsed --auto-migrate-selector.
func (o *options) validate() (labels.Selector, error) {
	checks := slices.Concat(o.passChecks(), o.clientChecks(), o.triggerChecks(), o.serveChecks(), o.etcd.checks())
	for _, check := range checks {
		if err := check(); err != nil {
			return nil, err
		}
	}
	selector, err := labels.Parse(o.autoMigrateSelector)
	if err != nil {
		return nil, usagef("--auto-migrate-selector %q is not a label selector: %v", o.autoMigrateSelector, err)
	}
	return selector, nil
}

// passChecks check the flags of a pass: its pace, its waits, its retries.
func (o *options) passChecks() []func() error {
	return []func() error{
		func() error { return between("concurrency", int64(o.concurrency), maxConcurrency) },
		func() error { return between("page-size", o.pageSize, maxPageSize) },
		func() error { return between("max-concurrent-passes", int64(o.maxPasses), maxPasses) },
		func() error { return between("max-concurrent-builtin-passes", int64(o.maxBuiltInPasses), maxPasses) },
		func() error { return positive("status-interval", o.statusInterval, "") },
		func() error {
			return positive("settle-window", o.settleWindow, " (at least twice the API server's --request-timeout)")
		},
		func() error { return positive("apiserver-lag-bound", o.lagBound, "") },
		func() error {
			if o.lagLimit < o.lagBound {
				return usagef("--apiserver-lag-limit must be at least --apiserver-lag-bound (%s), got %s", o.lagBound, o.lagLimit)
			}
			return nil
		},
		func() error {
			if _, err := migrator.ParseAPIServerAddresses(o.apiServers); err != nil {
				return usagef("--apiservers: %v", err)
			}
			return nil
		},
		func() error { return positive("stalled-retry-base", o.stalledRetryBase, "") },
		func() error {
			if o.stalledRetryMax < o.stalledRetryBase {
				return usagef("--stalled-retry-max must be at least --stalled-retry-base (%s), got %s", o.stalledRetryBase, o.stalledRetryMax)
			}
			return nil
		},
	}
}

// clientChecks check the flags of the manager's client and its leader
// election.
func (o *options) clientChecks() []func() error {
	return []func() error{
		func() error {
			if !(o.qps > 0) || math.IsInf(o.qps, 0) {
				return usagef("--kube-api-qps must be a positive number of requests per second, got %v", o.qps)
			}
			return nil
		},
		func() error { return between("kube-api-burst", int64(o.burst), math.MaxInt32) },
		func() error { return positive("leader-election-lease-duration", o.leaseDuration, "") },
		func() error { return positive("leader-election-renew-deadline", o.renewDeadline, "") },
		func() error { return positive("leader-election-retry-period", o.retryPeriod, "") },
		func() error {
			if o.renewDeadline >= o.leaseDuration {
				return usagef("--leader-election-renew-deadline (%s) must be shorter than --leader-election-lease-duration (%s)", o.renewDeadline, o.leaseDuration)
			}
			return nil
		},
		func() error {
			if o.renewDeadline <= time.Duration(leaderElectionJitter*float64(o.retryPeriod)) {
				return usagef("--leader-election-renew-deadline (%s) must be longer than 1.2 times --leader-election-retry-period (%s)", o.renewDeadline, o.retryPeriod)
			}
			return nil
		},
		func() error {
			if ns := o.leaderElectNamespace; ns != "" {
				if len(validation.IsDNS1123Label(ns)) > 0 {
					return usagef("--leader-election-namespace %q is not a namespace name: lowercase letters, digits and '-', at most 63", ns)
				}
			}
			return nil
		},
	}
}

// triggerChecks check the flags of the automatic triggers: built-in
// resources and re-encryption.
func (o *options) triggerChecks() []func() error {
	return []func() error{
		func() error { return positive("builtin-discovery-interval", o.builtInInterval, "") },
		func() error { return positive("reencrypt-check-interval", o.encryptionCheck, "") },
		func() error {
			for _, p := range splitList(o.builtInExclude) {
				if _, err := path.Match(p, ""); err != nil {
					return usagef("--auto-migrate-builtins-exclude: %q is not a pattern: %v", p, err)
				}
			}
			return nil
		},
		func() error {
			for _, r := range splitList(o.reEncrypt) {
				gr := schema.ParseGroupResource(r)
				bad := len(validation.IsDNS1123Label(gr.Resource)) > 0 || gr.Group != "" && len(validation.IsDNS1123Subdomain(gr.Group)) > 0
				if bad {
					return usagef(`--reencrypt-resources: %q is not a resource.group name ("secrets", "configmaps", "deployments.apps")`, r)
				}
			}
			return nil
		},
	}
}

// serveChecks check what the manager serves and logs.
func (o *options) serveChecks() []func() error {
	return []func() error{
		func() error { return address("metrics-bind-address", o.metricsAddr, false) },
		func() error { return address("health-probe-bind-address", o.probeAddr, true) },
		func() error { return address("pprof-bind-address", o.pprofAddr, true) },
		func() error {
			if _, err := logging.NewWithSink(o.logging, zapcore.AddSync(io.Discard)); err != nil {
				return &usageError{err}
			}
			return nil
		},
	}
}

// between checks that a count flag is at least 1 and at most most.
func between(name string, v, most int64) error {
	if v < 1 || v > most {
		if most == math.MaxInt32 {
			return usagef("--%s must be at least 1, got %d", name, v)
		}
		return usagef("--%s must be between 1 and %d, got %d", name, most, v)
	}
	return nil
}

func positive(name string, d time.Duration, why string) error {
	if d <= 0 {
		return usagef("--%s must be a positive duration%s, got %s", name, why, d)
	}
	return nil
}

// address checks a listening address: host:port or :port, or "0" to turn
// the endpoint off (and "" too, where controller-runtime takes it so).
func address(name, addr string, emptyIsOff bool) error {
	if addr == "0" || (addr == "" && emptyIsOff) {
		return nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		var n int
		if n, err = strconv.Atoi(port); err == nil && (n < 0 || n > 65535) {
			err = errors.New("port out of range")
		}
	}
	if err != nil {
		return usagef("--%s %q is not an address: want host:port or :port (such as :8443), or 0 to turn it off", name, addr)
	}
	return nil
}

// reEncryptResources are the resources --reencrypt-resources names.
func reEncryptResources(value string) []schema.GroupResource {
	names := splitList(value)
	out := make([]schema.GroupResource, 0, len(names))
	for _, r := range names {
		out = append(out, schema.ParseGroupResource(r))
	}
	return out
}

// splitList splits a comma-separated flag value, dropping blanks.
func splitList(value string) []string {
	var items []string
	for _, item := range strings.Split(value, ",") {
		if item = strings.TrimSpace(item); item != "" {
			items = append(items, item)
		}
	}
	return items
}

// whatItDoes says in one sentence what the manager migrates by itself with
// these flags: its Starting manager log line, as "What installing restow does" says
// it in the docs.
func (o *options) whatItDoes() string {
	var parts []string
	if o.autoMigrate {
		crds := "every CRD whose status.storedVersions lists more than its storage version"
		if o.autoMigrateSelector != "" {
			crds += " and whose labels match " + strconv.Quote(o.autoMigrateSelector)
		}
		parts = append(parts, "rewrites "+crds+" at that version and prunes the others")
	}
	if o.autoMigrateBuiltIns {
		parts = append(parts, "records each built-in resource's storage version and re-stores its objects once a control-plane upgrade moves it")
	}
	if names := splitList(o.reEncrypt); len(names) > 0 {
		parts = append(parts, "re-encrypts "+strings.Join(names, ", ")+" after every encryption key rotation that every API server has loaded")
	}
	if len(parts) == 0 {
		return "Migrates only the StorageMigrations users create (--auto-migrate=false, --auto-migrate-builtins=false)"
	}
	return "By itself, restow " + strings.Join(parts, "; ")
}
