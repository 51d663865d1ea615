package bench

import (
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/restow/restow/internal/testenv"
)

// haRounds is how often each HA strategy runs, interleaved.
const haRounds = 3

// haStrategies are the manager as users run it on a control plane of
// several API servers on addresses of their own: with the default lag bound
// (it counts three servers, reads each one's discovery at its address and
// starts once all show the switch, waiting 30 s only for a server it cannot
// reach), and with a bound of one second, the wait it makes on one API
// server. The difference is what knowing costs; requests per object must
// not differ.
func haStrategies() []strategy {
	return []strategy{
		{name: "operator-ha", operator: []string{}},
		{name: "operator-ha-bound1s", operator: []string{"--apiserver-lag-bound=1s"}},
	}
}

// haObjects is the object count of BenchmarkSeveralAPIServers:
// RESTOW_BENCH_HA_OBJECTS, by default 10,000.
func haObjects(b *testing.B) int {
	n := sweepObjects
	if s := os.Getenv("RESTOW_BENCH_HA_OBJECTS"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 1 {
			b.Fatalf("RESTOW_BENCH_HA_OBJECTS: %q is not a positive number", s)
		}
	}
	return n
}

// BenchmarkSeveralAPIServers measures what waiting for every API server
// costs: the manager process timed from the storage switch to its prune,
// on a control plane of three kube-apiservers on one etcd, each on an
// address of its own published in default/kubernetes's EndpointSlices,
// behind a round-robin balancer (GOAWAY moving connections, as in the HA
// tests), haRounds interleaved rounds of each haStrategies row. Its rows
// join make bench's results.
func BenchmarkSeveralAPIServers(b *testing.B) {
	ha := testenv.Start(b, testenv.Options{
		CRDDirectoryPaths: []string{"../../../config/crd/bases"},
		APIServers:        3,
		OwnAddresses:      true,
		APIServerArgs:     map[string]string{"goaway-chance": "0.02"},
	})
	n := haObjects(b)
	b.Run(fmt.Sprintf("objects=%d", n), func(b *testing.B) {
		f := newCompareFixture(b, ha, fmt.Sprintf("n%d.ha.bench.restow.dev", n), n)
		for round := range haRounds {
			all := haStrategies()
			k := round % len(all)
			for _, s := range append(all[k:], all[:k]...) {
				f.round = round
				f.runStrategy(b, n, s)
			}
		}
	})
}
