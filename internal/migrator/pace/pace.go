// Package pace sets how many rewrites a pass has in flight at once, and sees
// the API server's 429 answers (Throttle).
package pace

import (
	"context"
	"math"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// The pace of a pass: how many rewrites it has in flight at once.
//
// No fixed number is right for both a 2-core test control plane and a large
// production one, so a pass finds its pace below the upper bound (the
// migrator's Options.Concurrency). The goal is throughput: on the API
// servers measured (docs/benchmarks.md) objects per second and the API server's CPU per
// object both keep improving as more requests are in flight, long after
// latency has started to grow, so a pace that stops where latency starts to
// rise (TCP Vegas's knee) leaves a tenth to a quarter of the speed unused.
// The gain per added request is too small to measure within a pass on a
// noisy host (a few percent per doubling), so the pass does not climb a
// throughput curve; it grows its pace while its requests stay well within
// the API server's latency objective and backs off when they do not:
//
//   - Slow start: from initialPace, the limit doubles every window.
//   - A window whose 99th percentile latency is above latencyTarget (the
//     Kubernetes SLO for mutating single-object calls: 1 s) cuts the limit
//     by a quarter: the API server, or the pass's own Priority and Fairness
//     level queueing it, is saturated, and other clients' requests wait as
//     long as the pass's do.
//   - Between half the target and the target the limit holds; below half,
//     it grows by an eighth.
//   - A 429 halves the limit at once, and no new request starts before its
//     Retry-After has passed; a timeout or a 5xx that means overload halves
//     it too.
//   - A request that began before the last cut was sent at the higher limit:
//     the cut already answered its latency or its overload, so it does not
//     count in the windows after it (as TCP cuts once per round trip). Else
//     the requests still in flight at the higher limit cut it again and
//     again. 429s are the exception: Throttle cannot tell when a rejected
//     request was sent, and a 429 is the API server saying outright that it
//     is overloaded, so every new one halves the limit again.
//
// Priority and Fairness divides the API server between clients: restow's
// shipped level seats some of the pass's requests and queues the rest, so
// other clients keep their seats however many the pass sends; the latency
// objective bounds what they wait for the CPU the pass's seats use.

const (
	// initialPace is where a pass starts; it doubles every window while
	// latency stays low (slow start).
	initialPace = 16
	// paceWindow is the shortest window over which latency is measured.
	paceWindow = 100 * time.Millisecond
	// paceWindowSamples is the fewest rewrites per window, per request in
	// flight, so one slow request does not decide a window.
	paceWindowSamples = 2
	// latencyTarget is the 99th percentile latency of its rewrites above
	// which a pass slows down: Kubernetes's API call latency SLO for
	// mutating calls on single objects. Below half of it, the pass may
	// speed up.
	latencyTarget = time.Second
)

// Pacer limits the rewrites a pass has in flight and adapts the limit. A
// fixed pacer keeps it at the upper bound.
type Pacer struct {
	max      int
	fixed    bool
	throttle *Throttle
	now      func() time.Time

	mu       sync.Mutex
	changed  *sync.Cond
	limit    int
	inFlight int
	slow     bool // slow start: doubling
	// throttles is the throttle count already acted on.
	throttles int64
	window    paceSample
	// cut is when the limit was last lowered. A request that began before
	// it was sent at the higher limit: its latency or overload is the one
	// the cut answered, so it does not count in the windows after it.
	cut time.Time
}

// paceSample is one window's measurement.
type paceSample struct {
	start      time.Time
	latencies  []time.Duration
	full       bool // the limit was reached, so the window measured it
	overloaded bool
}

// New returns the pacer of one pass, at most upper in flight (always upper
// when fixed), slowed by throttle's 429s when set; ctx's end wakes every
// Acquire.
func New(ctx context.Context, upper int, fixed bool, throttle *Throttle) *Pacer {
	p := &Pacer{max: upper, fixed: fixed, throttle: throttle, now: time.Now, limit: min(upper, initialPace), slow: true}
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

// Acquire waits for a free slot under the limit, then past any Retry-After
// the API server asked for, also one that came while it waited for the slot.
func (p *Pacer) Acquire(ctx context.Context) error {
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
		if err := p.throttle.wait(ctx); err != nil {
			p.Cancel()
			return err
		}
	}
	return nil
}

// Cancel frees a slot that was not used.
func (p *Pacer) Cancel() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inFlight--
	p.changed.Signal()
}

// Release frees the slot of a request that began at start (by Now) and ended
// with err.
func (p *Pacer) Release(start time.Time, err error) {
	now := p.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inFlight--
	switch {
	case start.Before(p.cut):
	case err == nil:
		p.window.latencies = append(p.window.latencies, now.Sub(start))
	case Overloaded(err):
		p.window.overloaded = true
	}
	switch {
	case p.fixed:
		p.window.latencies = p.window.latencies[:0]
	case p.window.overloaded, p.throttled():
		// Overload ends the window at once: no more successes may come.
		p.adjust(now)
	case now.Sub(p.window.start) >= paceWindow && len(p.window.latencies) >= paceWindowSamples*p.limit:
		p.adjust(now)
	}
	p.changed.Signal()
}

// throttled reports whether the API server answered 429 since the pacer last looked.
func (p *Pacer) throttled() bool {
	return !p.fixed && p.throttle != nil && p.throttle.count() != p.throttles
}

// adjust ends the window and sets the limit from it.
func (p *Pacer) adjust(now time.Time) {
	w := p.window
	p.window = paceSample{start: now, latencies: w.latencies[:0]}
	before := p.limit
	switch {
	case p.throttled() || w.overloaded:
		if p.throttle != nil {
			p.throttles = p.throttle.count()
		}
		p.limit, p.slow = max(1, p.limit/2), false
	case len(w.latencies) == 0:
		return
	default:
		p99 := percentile(w.latencies, 0.99)
		switch {
		case p99 > latencyTarget:
			p.limit, p.slow = max(1, p.limit*3/4), false
		case !w.full:
			// The pass did not reach its limit (a slow list, a short
			// page): the window says nothing about a higher one.
		case p99 > latencyTarget/2:
			p.slow = false
		case p.slow:
			p.limit *= 2
		default:
			p.limit += max(1, p.limit/8)
		}
	}
	p.limit = min(p.limit, p.max)
	if p.limit < before {
		p.cut = now
	}
	if p.limit > before {
		p.changed.Broadcast()
	}
}

// percentile is the nearest-rank q-th quantile of latencies, which it sorts.
func percentile(latencies []time.Duration, q float64) time.Duration {
	slices.Sort(latencies)
	rank := int(math.Ceil(q*float64(len(latencies)))) - 1
	return latencies[max(0, rank)]
}

// Now is the pacer's clock: a request's start for Release.
func (p *Pacer) Now() time.Time { return p.now() }

// Limit is how many requests may be in flight now.
func (p *Pacer) Limit() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.limit
}

// Overloaded reports whether err says the API server is overloaded: a 429
// that client-go's own retries did not absorb, a server timeout, or a 503.
func Overloaded(err error) bool {
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

// wait waits until the last Retry-After the API server sent has passed, or
// until ctx ends.
func (t *Throttle) wait(ctx context.Context) error { return SleepUntil(ctx, t.until()) }

// SleepUntil waits until t, or until ctx ends: the one timed wait of a pass
// (a Retry-After, the wait for every API server, the settle window).
func SleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
