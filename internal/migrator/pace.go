package migrator

import (
	"context"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// The pace of a pass: how many rewrites it has in flight at once.
//
// No fixed number is right for both a 2-core test control plane and a large
// production one, so a pass finds the pace the API server can take, below
// the upper bound Options.Concurrency, the way TCP Vegas finds a link's
// capacity. It measures the latency of its patches over short windows and
// keeps the lowest window latency it has seen as the API server's latency
// without load. By Little's law, the requests in flight beyond those the API
// server is working on wait in a queue (its CPU, APF's queues, etcd):
//
//	queued = limit × (1 − lowest latency / latency now)
//
// The pass grows its limit while the queue is short, so throughput still
// grows with it, and shrinks it when the queue grows long: then more
// requests add only latency, for the pass and for every other client of the
// API server. Other clients' load shows as rising latency too, so the pass
// yields to them. A 429 halves the limit at once, and no new request starts
// before its Retry-After has passed; a timeout or a 5xx that means overload
// halves it too.

const (
	// initialPace is where a pass starts; it doubles every window while
	// the queue stays short (slow start).
	initialPace = 2
	// paceWindow is the shortest window over which latency is measured.
	paceWindow = 100 * time.Millisecond
	// paceWindowSamples is the fewest patches per window, per request in
	// flight, so one slow request does not decide a window.
	paceWindowSamples = 2
)

// queueBounds are Vegas's alpha and beta for limit: grow below alpha
// requests queued, shrink above beta. They grow with log10(limit), as in
// Netflix's concurrency-limits, so a large limit tolerates a longer queue.
func queueBounds(limit int) (alpha, beta float64) {
	l := max(1, math.Log10(float64(limit)))
	return 3 * l, 6 * l
}

// pacer limits the patches a pass has in flight and adapts the limit. A
// fixed pacer keeps it at the upper bound.
type pacer struct {
	max      int
	fixed    bool
	throttle *Throttle
	now      func() time.Time

	mu       sync.Mutex
	changed  *sync.Cond
	limit    int
	inFlight int
	slow     bool // slow start: doubling
	// lowest is the lowest window mean latency seen: the API server's
	// latency without load.
	lowest time.Duration
	// throttles is the throttle count already acted on.
	throttles int64
	window    paceSample
}

// paceSample is one window's measurement.
type paceSample struct {
	start      time.Time
	n          int
	total      time.Duration
	full       bool // the limit was reached, so the window measured it
	overloaded bool
}

func newPacer(ctx context.Context, upper int, fixed bool, throttle *Throttle) *pacer {
	p := &pacer{max: upper, fixed: fixed, throttle: throttle, now: time.Now, limit: min(upper, initialPace), slow: true}
	if fixed {
		p.limit = upper
	}
	p.changed = sync.NewCond(&p.mu)
	p.window.start = p.now()
	if throttle != nil {
		p.throttles = throttle.count()
	}
	context.AfterFunc(ctx, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.changed.Broadcast()
	})
	return p
}

// acquire waits for a free slot under the limit, then past any Retry-After
// the API server asked for, also one that came while it waited for the slot.
func (p *pacer) acquire(ctx context.Context) error {
	p.mu.Lock()
	for p.inFlight >= p.limit {
		if err := ctx.Err(); err != nil {
			p.mu.Unlock()
			return err
		}
		p.changed.Wait()
	}
	p.inFlight++
	if p.inFlight >= p.limit {
		p.window.full = true
	}
	p.mu.Unlock()
	if p.throttle != nil {
		if err := sleepUntil(ctx, p.throttle.until()); err != nil {
			p.cancel()
			return err
		}
	}
	return nil
}

// cancel frees a slot that was not used.
func (p *pacer) cancel() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inFlight--
	p.changed.Signal()
}

// release frees the slot of a request that began at start and ended with err.
func (p *pacer) release(start time.Time, err error) {
	now := p.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inFlight--
	switch {
	case err == nil:
		p.window.n++
		p.window.total += now.Sub(start)
	case overloaded(err):
		p.window.overloaded = true
	}
	switch {
	case p.fixed:
	case p.window.overloaded, p.throttled():
		// Overload ends the window at once: no more successes may come.
		p.adjust(now)
	case now.Sub(p.window.start) >= paceWindow && p.window.n >= paceWindowSamples*p.limit:
		p.adjust(now)
	}
	p.changed.Signal()
}

// throttled reports whether the API server answered 429 since the pacer last looked.
func (p *pacer) throttled() bool {
	return !p.fixed && p.throttle != nil && p.throttle.count() != p.throttles
}

// adjust ends the window and sets the limit from it.
func (p *pacer) adjust(now time.Time) {
	w := p.window
	p.window = paceSample{start: now}
	before := p.limit
	switch {
	case p.throttled() || w.overloaded:
		if p.throttle != nil {
			p.throttles = p.throttle.count()
		}
		p.limit, p.slow = max(1, p.limit/2), false
	case w.n == 0:
		return
	default:
		latency := w.total / time.Duration(w.n)
		if p.lowest == 0 || latency < p.lowest {
			p.lowest = latency
		}
		queued := float64(p.limit) * (1 - float64(p.lowest)/float64(latency))
		alpha, beta := queueBounds(p.limit)
		step := max(1, int(math.Log10(float64(p.limit))))
		switch {
		case queued > beta:
			p.limit, p.slow = max(1, p.limit-step), false
		case !w.full:
			// The pass did not reach its limit (a slow list, a short
			// page): the window says nothing about a higher one.
		case p.slow:
			p.limit *= 2
		case queued < alpha:
			p.limit += step
		}
	}
	p.limit = min(p.limit, p.max)
	if p.limit > before {
		p.changed.Broadcast()
	}
}

// current is the limit now.
func (p *pacer) current() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.limit
}

// overloaded reports whether err says the API server is overloaded: a 429
// that client-go's own retries did not absorb, a server timeout, or a 503.
func overloaded(err error) bool {
	return apierrors.IsTooManyRequests(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsServiceUnavailable(err)
}

// Throttle sees the API server's 429 answers to a Migrator's requests, even
// those client-go retries by itself after their Retry-After, so every pass
// slows down as soon as one request is throttled. NewForConfig installs it.
type Throttle struct {
	mu     sync.Mutex
	n      int64
	notTil time.Time
}

// Wrap returns a transport that reports 429 answers to t. Use it as a
// rest.Config's WrapTransport.
func (t *Throttle) Wrap(rt http.RoundTripper) http.RoundTripper {
	return throttleTransport{rt: rt, t: t}
}

type throttleTransport struct {
	rt http.RoundTripper
	t  *Throttle
}

func (tt throttleTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := tt.rt.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusTooManyRequests {
		// client-go reads the same header the same way: whole seconds.
		seconds, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		tt.t.note(time.Duration(max(seconds, 0)) * time.Second)
	}
	return resp, err
}

func (t *Throttle) note(retryAfter time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n++
	if until := time.Now().Add(retryAfter); until.After(t.notTil) {
		t.notTil = until
	}
}

func (t *Throttle) count() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

// until is when the last Retry-After the API server sent ends.
func (t *Throttle) until() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.notTil
}
