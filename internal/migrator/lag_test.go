package migrator

import "testing"

// TestCountAPIServers: the largest count any signal shows; one only when
// every signal that says anything says one; unknown when a signal could
// not be read and none shows several.
func TestCountAPIServers(t *testing.T) {
	leases := func(n int) apiServerSignal { return apiServerSignal{source: "leases", count: n} }
	addresses := func(n int) apiServerSignal { return apiServerSignal{source: "addresses", count: n, detail: "..."} }
	unreadable := apiServerSignal{source: "addresses", unknown: "forbidden"}
	noLeases := apiServerSignal{source: "leases", unknown: "none"}
	silent := apiServerSignal{source: "addresses", silent: true}
	for _, tc := range []struct {
		name    string
		signals []apiServerSignal
		want    int
		unknown bool
	}{
		{"every signal says one", []apiServerSignal{leases(1), addresses(1)}, 1, false},
		{"servers sharing a host name: one Lease, two addresses", []apiServerSignal{leases(1), addresses(2)}, 2, false},
		{"one address behind a load balancer, three Leases", []apiServerSignal{leases(3), addresses(1)}, 3, false},
		{"no address published: the Leases alone", []apiServerSignal{leases(1), silent}, 1, false},
		{"addresses unreadable, one Lease", []apiServerSignal{leases(1), unreadable}, 0, true},
		{"addresses unreadable, three Leases", []apiServerSignal{leases(3), unreadable}, 3, false},
		{"no Lease, one address", []apiServerSignal{noLeases, addresses(1)}, 0, true},
		{"no Lease, no address", []apiServerSignal{noLeases, silent}, 0, true},
		{"nothing listed at all", []apiServerSignal{silent}, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, unknown := countAPIServers(tc.signals)
			if got != tc.want || (unknown != "") != tc.unknown {
				t.Errorf("countAPIServers = %d (unknown %q), want %d (unknown: %v)", got, unknown, tc.want, tc.unknown)
			}
		})
	}
}
