package bench

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/migrator"
)

// defaultsStrategies are the rows of BenchmarkDefaults: the manager as users
// run it, process start included, with its default flags and with the
// trigger of built-in resources off, beside the paced pass alone and the
// fastest bare loops of either request kind (64 and 128 workers, the fastest
// in every run of the sweep so far).
func defaultsStrategies() []strategy {
	loops := []int{64, 128}
	out := make([]strategy, 0, 3+2*len(loops))
	out = append(out,
		// The test harness turns the trigger of built-in resources off by
		// default (internal/operator); the manager's own default is on.
		strategy{name: "manager-defaults", operator: []string{"--auto-migrate-builtins=true"}, fromStart: true, interleave: true},
		strategy{name: "manager-builtins-off", operator: []string{"--auto-migrate-builtins=false"}, fromStart: true, interleave: true},
		// The paced pass alone, in this process, timed from its first
		// request to its last object (BenchmarkCompare's restow row).
		strategy{name: "restow", migrate: &migrator.Options{Prune: true, SettleWindow: time.Second}, interleave: true},
	)
	for _, c := range loops {
		out = append(out,
			strategy{name: fmt.Sprintf("bare-patch-c%d", c), series: "bare patch loop", concurrency: c, pass: barePatchLoop(c), interleave: true},
			strategy{name: fmt.Sprintf("bare-update-c%d", c), series: "bare update loop", concurrency: c, pass: bareUpdateLoop(c), interleave: true})
	}
	return out
}

// defaultsSizes are BenchmarkDefaults' object counts: RESTOW_BENCH_SIZES,
// by default 10,000 (interleavedRounds rounds) and 50,000 (one round).
func defaultsSizes(b *testing.B) []int {
	if os.Getenv("RESTOW_BENCH_SIZES") == "" {
		return []int{sweepObjects, scaleObjects}
	}
	return sizes(b)
}

// BenchmarkDefaults measures what the manager's defaults cost: the manager
// process started right after the storage switch (its start, leader
// election and every background job it starts by default in the timed
// part), with its default flags and with --auto-migrate-builtins=false,
// against the fastest bare loops, interleaved. Every manager run starts as
// a first start does: the StorageMigrations of built-in resources an
// earlier run made are deleted before it. It prints each row's median
// against the fastest loop's (make bench-defaults).
func BenchmarkDefaults(b *testing.B) {
	for _, n := range defaultsSizes(b) {
		b.Run(fmt.Sprintf("objects=%d", n), func(b *testing.B) {
			f := newCompareFixture(b, env, fmt.Sprintf("n%d.defaults.bench.restow.dev", n), n)
			rounds := 1
			if n <= sweepObjects {
				rounds = interleavedRounds
			}
			all := defaultsStrategies()
			for round := range rounds {
				k := round % len(all)
				for _, s := range slices.Concat(all[k:], all[:k]) {
					f.round = round
					f.runStrategy(b, n, s)
				}
			}
			fmt.Print(defaultsSummary(n))
		})
	}
}

// defaultsSummary renders the medians of BenchmarkDefaults' rows at n
// objects, each against the fastest loop's median.
func defaultsSummary(n int) string {
	results.Lock()
	var rows []figures
	for _, f := range results.all {
		if f.Objects == n && slices.ContainsFunc(defaultsStrategies(), func(s strategy) bool { return s.name == f.Strategy }) {
			rows = append(rows, f)
		}
	}
	results.Unlock()
	rows = medians(rows)
	best, ok := bestBare(rows, n)
	if !ok {
		return ""
	}
	var out strings.Builder
	fmt.Fprintf(&out, "\nBenchmarkDefaults, %s objects (medians; fastest loop %s):\n", thousands(n), best.Strategy)
	fmt.Fprintf(&out, "%-22s %9s %10s %8s %14s %16s %12s %12s %12s\n", "row", "seconds", "objects/s", "× loop", "API CPU ms/obj", "requests/object", "space waits", "space reads", "budget MiB")
	for _, f := range rows {
		fmt.Fprintf(&out, "%-22s %9.1f %10.0f %8.2f %14.2f %16.4f %12.1f %12.1f %12.0f\n", f.Strategy, f.PassSeconds, f.ObjectsPerSec, f.ObjectsPerSec/best.ObjectsPerSec, f.APIServerCPUMs, f.Requests, f.SpaceWaits, f.SpaceReadings, f.SpaceBudgetMiB)
	}
	return out.String()
}

// deleteBuiltInMigrations deletes the StorageMigrations the trigger of
// built-in resources made, so the next manager starts as on a cluster it
// never ran on.
func (f *compareFixture) deleteBuiltInMigrations(b *testing.B) {
	b.Helper()
	err := f.env.Client.DeleteAllOf(b.Context(), &migrationv1alpha1.StorageMigration{},
		client.MatchingLabels{migrationv1alpha1.BuiltInLabel: strconv.FormatBool(true)})
	if err != nil {
		b.Fatal(err)
	}
}
