package migrator

import (
	"slices"
	"strings"
	"testing"
)

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

// TestParseAPIServerAddresses: --apiservers takes host:port, IPv6 in
// brackets, each once; anything else is refused with the entry named.
func TestParseAPIServerAddresses(t *testing.T) {
	got, err := ParseAPIServerAddresses(" 10.0.0.11:6443,[fd00::12]:6443,,apiserver-3.example:443,10.0.0.11:6443 ")
	if want := []string{"10.0.0.11:6443", "[fd00::12]:6443", "apiserver-3.example:443"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("got %q, %v; want %q", got, err, want)
	}
	if got, err := ParseAPIServerAddresses(""); err != nil || got != nil {
		t.Errorf("empty: got %q, %v; want none", got, err)
	}
	for _, bad := range []string{"10.0.0.11", ":6443", "10.0.0.11:http", "10.0.0.11:70000", "fd00::12:6443"} {
		if _, err := ParseAPIServerAddresses(bad); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("%q: got %v, want an error naming it", bad, err)
		}
	}
}

// TestUncounted: restow can see every server only with at least as many
// addresses as servers counted, and a count.
func TestUncounted(t *testing.T) {
	for _, tc := range []struct {
		servers   int
		addresses []string
		blind     bool
	}{
		{2, []string{"a:1", "b:1"}, false},
		{2, []string{"a:1", "b:1", "c:1"}, false},
		{3, []string{"a:1", "b:1"}, true},
		{0, []string{"a:1", "b:1"}, true},
		{2, nil, true},
	} {
		got := uncounted(Target{APIServers: tc.servers, APIServerAddresses: tc.addresses, APIServerSignals: "signals"})
		if (len(got) > 0) != tc.blind {
			t.Errorf("%d servers at %v: %q, want blind %v", tc.servers, tc.addresses, got, tc.blind)
		}
	}
}
