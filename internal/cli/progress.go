package cli

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// lineInterval is how often a progress line is printed where the output is
// not a terminal (CI logs).
const lineInterval = 5 * time.Second

// minRateElapsed is how long a pass must have run before a rate is printed:
// over a shorter time the rate measures the clock, not the pass.
const minRateElapsed = 2 * time.Second

// progress shows how far a pass got: a live bar on a terminal, a plain line
// every lineInterval elsewhere.
type progress struct {
	out   io.Writer
	what  string
	bar   *progressbar.ProgressBar
	start time.Time
	// lastLine is when the last plain line was printed.
	lastLine        time.Time
	done, total     int64
	printedFinished bool
}

// newProgress starts showing progress of what, over total objects (-1 when
// not known yet).
func newProgress(out io.Writer, what string, total int64) *progress {
	p := &progress{out: out, what: what, start: time.Now(), total: total}
	if isTerminal(out) {
		p.bar = progressbar.NewOptions64(total,
			progressbar.OptionSetWriter(out),
			progressbar.OptionSetDescription(what),
			progressbar.OptionSetWidth(30),
			progressbar.OptionShowCount(),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionShowElapsedTimeOnFinish(),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(out) }),
		)
		return p
	}
	fmt.Fprintf(out, "%s: %s\n", what, countOf(0, total))
	p.lastLine = p.start
	return p
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// set reports done objects of an estimated total (-1: unchanged).
func (p *progress) set(done, total int64) {
	p.done = done
	if total >= 0 && total != p.total {
		p.total = max(total, done)
		if p.bar != nil {
			p.bar.ChangeMax64(p.total)
		}
	}
	if p.bar != nil {
		_ = p.bar.Set64(done)
		return
	}
	if now := time.Now(); now.Sub(p.lastLine) >= lineInterval {
		p.lastLine = now
		p.printLine(now)
	}
}

// finish shows the final count.
func (p *progress) finish() {
	if p.printedFinished {
		return
	}
	p.printedFinished = true
	if p.bar != nil {
		_ = p.bar.Finish()
		return
	}
	p.printLine(time.Now())
}

func (p *progress) printLine(now time.Time) {
	elapsed := now.Sub(p.start)
	line := fmt.Sprintf("%s: %s after %s", p.what, countOf(p.done, p.total), elapsed.Round(time.Second))
	if secs := elapsed.Seconds(); elapsed >= minRateElapsed && p.done > 0 {
		rate := float64(p.done) / secs
		line += fmt.Sprintf(", %.0f objects/s", rate)
		if p.total > p.done {
			line += ", ETA " + time.Duration(float64(p.total-p.done)/rate*float64(time.Second)).Round(time.Second).String()
		}
	}
	fmt.Fprintln(p.out, line)
}

func countOf(done, total int64) string {
	if total < 0 {
		return fmt.Sprintf("%d objects", done)
	}
	pct := 100.0
	if total > 0 {
		pct = 100 * float64(done) / float64(total)
	}
	return fmt.Sprintf("%d/%d objects (%.0f%%)", done, total, pct)
}
