package pace

import (
	"container/heap"
	"context"
	"slices"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// simulatedServer answers every request in base latency while at most
// capacity are in flight; beyond, the rest queue and latency grows in
// proportion, as on a CPU-bound API server.
type simulatedServer struct {
	base     time.Duration
	capacity int
}

func (s simulatedServer) latency(inFlight int) time.Duration {
	return s.base * time.Duration(max(inFlight, s.capacity)) / time.Duration(s.capacity)
}

// run drives p against s for rounds rounds on a fake clock: each round fills
// every slot, then the requests end together. It returns the limit after
// each round.
func run(t *testing.T, p *Pacer, s func() simulatedServer, rounds int) []int {
	t.Helper()
	clock := p.now()
	p.now = func() time.Time { return clock }
	p.window.start = clock
	limits := make([]int, 0, rounds)
	for range rounds {
		n := p.Limit()
		for range n {
			if err := p.Acquire(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		start := clock
		clock = clock.Add(s().latency(n))
		for range n {
			p.Release(start, nil)
		}
		limits = append(limits, p.Limit())
	}
	return limits
}

// flow drives p against s on a fake clock as a pass does: a request starts
// whenever the limit has room, takes the latency its server gives it at the
// number in flight when it starts, and its slot is reused when it ends. It
// runs until requests more requests have ended and returns the limit after
// each one.
func flow(t *testing.T, p *Pacer, s func() simulatedServer, requests int) []int {
	t.Helper()
	clock := p.now()
	p.now = func() time.Time { return clock }
	p.window.start = clock
	var ends endings
	limits := make([]int, 0, requests)
	for len(limits) < requests {
		for p.inFlight < p.limit {
			if err := p.Acquire(t.Context()); err != nil {
				t.Fatal(err)
			}
			heap.Push(&ends, request{start: clock, end: clock.Add(s().latency(p.inFlight))})
		}
		r := heap.Pop(&ends).(request)
		clock = r.end
		p.Release(r.start, nil)
		limits = append(limits, p.Limit())
	}
	// Leave nothing in flight for the next call.
	for ends.Len() > 0 {
		r := heap.Pop(&ends).(request)
		clock = r.end
		p.Release(r.start, nil)
	}
	return limits
}

type request struct{ start, end time.Time }

// endings is a min-heap of requests by their end.
type endings []request

func (e endings) Len() int           { return len(e) }
func (e endings) Less(i, j int) bool { return e[i].end.Before(e[j].end) }
func (e endings) Swap(i, j int)      { e[i], e[j] = e[j], e[i] }
func (e *endings) Push(x any)        { *e = append(*e, x.(request)) }
func (e *endings) Pop() any          { old := *e; r := old[len(old)-1]; *e = old[:len(old)-1]; return r }

// A cut answers the latency of the requests already in flight at the
// higher limit: they do not cut it again when they end. Here the API server
// slows down at the bound so that 256 in flight take 1.2 s (above the
// objective) and 192 take 0.9 s (within it): one cut, to 192, is right;
// counting the requests sent at 256 in the window after it cuts it again,
// to 144.
// upperBound is the upper bound of a pass's pace by default
// (migrator.DefaultConcurrency, which this package may not import).
const upperBound = 256

func TestPacerCutsOncePerLoad(t *testing.T) {
	p := New(t.Context(), upperBound, false, nil)
	server := simulatedServer{base: 5 * time.Millisecond, capacity: 64}
	flow(t, p, func() simulatedServer { return server }, 5000)
	if l := p.Limit(); l != upperBound {
		t.Fatalf("limit %d on the fast server, want the bound %d", l, upperBound)
	}
	server.base = 300 * time.Millisecond
	limits := flow(t, p, func() simulatedServer { return server }, 5000)
	if low := slices.Min(limits); low < upperBound*3/4 {
		t.Errorf("limit cut to %d, want one cut to %d", low, upperBound*3/4)
	}
	if l := limits[len(limits)-1]; server.latency(l) > latencyTarget {
		t.Errorf("limit %d at the end: latency %v, want at most %v", l, server.latency(l), latencyTarget)
	}
}

// The pace grows while the API server answers well within the latency
// objective and settles where its answers take between half of it and all
// of it: here, every request in flight beyond 4 adds 25 ms.
func TestPacerKeepsLatencyWithinTheTarget(t *testing.T) {
	p := New(t.Context(), upperBound, false, nil)
	server := simulatedServer{base: 100 * time.Millisecond, capacity: 4}
	limits := run(t, p, func() simulatedServer { return server }, 2000)
	for _, l := range limits[1000:] {
		if latency := server.latency(l); latency < latencyTarget/2 || latency > latencyTarget {
			t.Fatalf("limit %d after settling (history %v): latency %v, want %v to %v", l, limits[990:1010], latency, latencyTarget/2, latencyTarget)
		}
	}
}

// On an API server that does not slow down, the pace reaches the upper
// bound and stays there.
func TestPacerReachesTheBound(t *testing.T) {
	p := New(t.Context(), upperBound, false, nil)
	limits := run(t, p, func() simulatedServer { return simulatedServer{base: 5 * time.Millisecond, capacity: 1000} }, 500)
	if l := limits[len(limits)-1]; l != upperBound {
		t.Errorf("limit %d, want the bound %d", l, upperBound)
	}
	for _, l := range limits {
		if l > upperBound {
			t.Fatalf("limit %d above the bound %d", l, upperBound)
		}
	}
}

// When other clients load the API server so that the pass's requests take
// longer than the latency objective (30 times longer at the same pace), the
// pass slows down until they are back within it.
func TestPacerYields(t *testing.T) {
	p := New(t.Context(), upperBound, false, nil)
	base := 5 * time.Millisecond
	server := func() simulatedServer { return simulatedServer{base: base, capacity: 16} }
	before := run(t, p, server, 1000)
	base = 150 * time.Millisecond
	after := run(t, p, server, 1000)
	b, a := before[len(before)-1], after[len(after)-1]
	if a > b/2 {
		t.Errorf("limit %d before others' load, %d with it; want it at least halved", b, a)
	}
	if latency := server().latency(a); latency > latencyTarget {
		t.Errorf("latency %v at the limit %d others' load left, want at most %v", latency, a, latencyTarget)
	}
}

// An overload answer (here a 503) to a request sent at the higher limit does
// not cut the limit again after the cut it caused; one to a request sent
// after the cut does.
func TestPacerOverloadCutsOnce(t *testing.T) {
	p := New(t.Context(), 64, false, nil)
	run(t, p, func() simulatedServer { return simulatedServer{base: 5 * time.Millisecond, capacity: 1000} }, 200)
	if l := p.Limit(); l != 64 {
		t.Fatalf("limit %d on the fast server, want the bound 64", l)
	}
	clock := p.now()
	p.now = func() time.Time { return clock }
	sent := clock
	for range 64 {
		if err := p.Acquire(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	unavailable := apierrors.NewServiceUnavailable("overloaded")
	clock = clock.Add(10 * time.Millisecond)
	p.Release(sent, unavailable)
	if l := p.Limit(); l != 32 {
		t.Fatalf("limit %d after a 503, want 32", l)
	}
	clock = clock.Add(10 * time.Millisecond)
	p.Release(sent, unavailable)
	if l := p.Limit(); l != 32 {
		t.Errorf("limit %d after a second 503 to a request sent before the cut, want it kept at 32", l)
	}
	for range 62 {
		p.Release(sent, nil)
	}
	if err := p.Acquire(t.Context()); err != nil {
		t.Fatal(err)
	}
	after := clock
	clock = clock.Add(10 * time.Millisecond)
	p.Release(after, unavailable)
	if l := p.Limit(); l != 16 {
		t.Errorf("limit %d after a 503 to a request sent after the cut, want 16", l)
	}
}

// A 429 halves the pace at once, and no request starts before its
// Retry-After has passed.
func TestPacerHonoursRetryAfter(t *testing.T) {
	throttle := &Throttle{}
	p := New(t.Context(), 64, false, throttle)
	run(t, p, func() simulatedServer { return simulatedServer{base: 5 * time.Millisecond, capacity: 1000} }, 200)
	if l := p.Limit(); l != 64 {
		t.Fatalf("limit %d before the 429, want the bound 64", l)
	}
	if err := p.Acquire(t.Context()); err != nil {
		t.Fatal(err)
	}
	throttle.note(time.Second)
	p.Release(p.now(), nil)
	if l := p.Limit(); l != 32 {
		t.Errorf("limit %d after one 429, want 32", l)
	}
	// acquire waits out the Retry-After in real time.
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if err := p.Acquire(ctx); err == nil {
		t.Error("a request started within the Retry-After")
	}
}

// A fixed pace keeps the bound, whatever the latency.
func TestPacerFixed(t *testing.T) {
	p := New(t.Context(), 16, true, &Throttle{})
	limits := run(t, p, func() simulatedServer { return simulatedServer{base: 5 * time.Millisecond, capacity: 2} }, 200)
	for _, l := range limits {
		if l != 16 {
			t.Fatalf("fixed limit moved to %d", l)
		}
	}
}
