package migrator

import (
	"slices"
	"strings"
	"testing"
	"time"
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

// TestUnseen: restow knows it reaches every API server only when every
// signal was read and one source alone lists as many addresses as the
// largest count.
func TestUnseen(t *testing.T) {
	read := []apiServerSignal{{source: "leases", count: 3}, {source: "addresses", count: 3}}
	unknown := []apiServerSignal{{source: "leases", unknown: "could not be read"}, {source: "addresses", count: 3}}
	for _, tc := range []struct {
		name                          string
		signals                       []apiServerSignal
		servers, endpointHosts, named int
		seen                          bool
	}{
		{"every server in the EndpointSlices", read, 3, 3, 0, true},
		{"every server named", read, 3, 1, 3, true},
		{"one server without an address", read, 3, 2, 0, false},
		{"a balancer's address and two named: not one source", read, 3, 1, 2, false},
		{"a signal that could not be read", unknown, 3, 3, 0, false},
		{"no count", nil, 0, 2, 0, false},
	} {
		if got := unseen(tc.signals, tc.servers, tc.endpointHosts, tc.named); (got == "") != tc.seen {
			t.Errorf("%s: %q, want seen %v", tc.name, got, tc.seen)
		}
	}
}

// TestSwitchState: a server seen at another version stays late until it
// shows the target again, also while it cannot be read; one seen switched
// stays so while it cannot be read, not once it shows another version, and
// its switch then counts from when it shows the target again.
func TestSwitchState(t *testing.T) {
	st := &switchState{switched: map[string]bool{}, lagging: map[string]time.Time{}}
	t0 := time.Now()
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	read := func(s int, seen ...serverSwitch) (int, int) {
		late, unreachable := st.note(seen, "v1", at(s))
		return len(late), len(unreachable)
	}
	a, b := "a:1", "b:1"
	if late, _ := read(0, serverSwitch{address: a, stores: "v1"}, serverSwitch{address: b, stores: "v1beta1"}); late != 1 {
		t.Fatalf("b at v1beta1: %d late, want 1", late)
	}
	if late, unreachable := read(1, serverSwitch{address: a, err: "refused"}, serverSwitch{address: b, err: "timeout"}); late != 1 || unreachable != 0 {
		t.Errorf("a restarting, b unreadable after lagging: %d late, %d unreachable; want b late, a still switched", late, unreachable)
	}
	if late, unreachable := read(2, serverSwitch{address: a, stores: "v1"}, serverSwitch{address: b, stores: "v1"}); late != 0 || unreachable != 0 || !st.lastSwitch.Equal(at(2)) {
		t.Errorf("both at v1: %d late, %d unreachable, last switch %s; want none and the switch at 2s", late, unreachable, st.lastSwitch.Sub(t0))
	}
	if late, _ := read(3, serverSwitch{address: a, stores: "v1beta1"}, serverSwitch{address: b, stores: "v1"}); late != 1 {
		t.Errorf("a back at v1beta1: %d late, want 1", late)
	}
	read(4, serverSwitch{address: a, stores: "v1"}, serverSwitch{address: b, stores: "v1"})
	if !st.lastSwitch.Equal(at(4)) {
		t.Errorf("last switch %s after a flipped back, want 4s", st.lastSwitch.Sub(t0))
	}
	if _, unreachable := read(5, serverSwitch{address: "c:1", err: "refused"}); unreachable != 1 {
		t.Errorf("a server never read: %d unreachable, want 1", unreachable)
	}
}

// TestCountMemory: a count of API servers that drops (a server restarting
// takes its Lease and address away for a while) is held up by the larger
// count seen within the window; after it, or when the count grows, the
// new count stands alone.
func TestCountMemory(t *testing.T) {
	var c countMemory
	if s := c.note(2); s.count != 0 {
		t.Errorf("first count: remembered %+v, want nothing", s)
	}
	if s := c.note(1); s.count != 2 || !strings.Contains(s.String(), "API servers counted within the last 1h0m0s: 2") {
		t.Errorf("a drop to 1: remembered %q, want 2", s)
	}
	servers, _ := countAPIServers([]apiServerSignal{{source: "leases", count: 1}, {source: "addresses", count: 1}, c.note(1)})
	if servers != 2 {
		t.Errorf("one Lease and one address after two were counted: %d servers, want 2", servers)
	}
	c.at = time.Now().Add(-countMemoryWindow - time.Second)
	if s := c.note(1); s.count != 0 {
		t.Errorf("after the window: remembered %+v, want nothing", s)
	}
}
