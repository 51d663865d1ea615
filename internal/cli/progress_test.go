package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestProgressPrintsNoRateForShortPasses: a pass shorter than
// minRateElapsed gets its count and time but no rate (a 12 ms pass once
// printed "129608 objects/s"); a longer one gets its rate and ETA.
func TestProgressPrintsNoRateForShortPasses(t *testing.T) {
	tests := []struct {
		elapsed time.Duration
		done    int64
		want    string
		rate    bool
	}{
		{12 * time.Millisecond, 1555, "1555/1555 objects (100%) after 0s", false},
		{1900 * time.Millisecond, 1555, "1555/1555 objects (100%) after 2s", false},
		{5 * time.Second, 1000, "1000/3000 objects (33%) after 5s, 200 objects/s, ETA 10s", true},
	}
	for _, tt := range tests {
		var out bytes.Buffer
		p := newProgress(&out, "Rewriting widgets to v1", 1555)
		p.start = time.Now().Add(-tt.elapsed)
		if tt.rate {
			p.total = 3000
		}
		p.done = tt.done
		p.finish()
		last := strings.TrimSpace(out.String()[strings.LastIndex(strings.TrimSpace(out.String()), "\n")+1:])
		if !strings.HasSuffix(last, tt.want) || strings.Contains(last, "objects/s") != tt.rate {
			t.Errorf("after %v: %q, want it to end %q (a rate: %v)", tt.elapsed, last, tt.want, tt.rate)
		}
	}
}
