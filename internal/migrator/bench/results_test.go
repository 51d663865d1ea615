package bench

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// results collects every strategy's figures during a run.
var results struct {
	sync.Mutex
	all []figures
}

// record keeps fig, replacing earlier figures of the same strategy, size
// and round (the testing package may run a benchmark once with b.N = 1
// before the real run).
func record(fig figures) {
	results.Lock()
	defer results.Unlock()
	results.all = slices.DeleteFunc(results.all, func(f figures) bool {
		return f.Objects == fig.Objects && f.Strategy == fig.Strategy && f.Round == fig.Round
	})
	results.all = append(results.all, fig)
}

// medians reduces the rounds of each strategy and size to the round with
// the median objects/s (the lower middle one of an even count), noting how
// many rounds there were and their range.
func medians(all []figures) []figures {
	groups := map[[2]string][]figures{}
	var keys [][2]string
	for _, f := range all {
		key := [2]string{strconv.Itoa(f.Objects), f.Strategy}
		if _, ok := groups[key]; !ok {
			keys = append(keys, key)
		}
		groups[key] = append(groups[key], f)
	}
	out := make([]figures, 0, len(keys))
	for _, key := range keys {
		rounds := groups[key]
		slices.SortFunc(rounds, func(a, b figures) int { return cmp.Compare(a.ObjectsPerSec, b.ObjectsPerSec) })
		median := rounds[(len(rounds)-1)/2]
		for _, r := range rounds {
			// A wait in any round is one too many where the budget
			// should never bind: the most of any round, not the median.
			median.SpaceWaits = max(median.SpaceWaits, r.SpaceWaits)
		}
		if len(rounds) > 1 {
			median.Rounds = len(rounds)
			median.MinObjectsPerSec, median.MaxObjectsPerSec = rounds[0].ObjectsPerSec, rounds[len(rounds)-1].ObjectsPerSec
		}
		out = append(out, median)
	}
	return out
}

// writeResults writes the run's figures into RESTOW_BENCH_OUT, if set:
// figures.json, results.md (the tables of docs/benchmarks.md), and the plots
// throughput.png (objects/s against concurrency), compare.png (restow, the
// manager and the best bare loop against the number of objects) and
// memory.png (peak memory against the number of objects).
func writeResults() error {
	dir := os.Getenv("RESTOW_BENCH_OUT")
	results.Lock()
	all := slices.Clone(results.all)
	results.Unlock()
	if dir == "" || len(all) == 0 {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	raw, err := json.MarshalIndent(all, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "figures.json"), append(raw, '\n'), 0o644); err != nil {
		return err
	}
	// figures.json keeps every round; the tables and plots show medians.
	rounds := roundsTable(all)
	all = medians(all)
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(tables(all)+rounds), 0o644); err != nil {
		return err
	}
	if err := plotThroughput(all, filepath.Join(dir, "throughput.png")); err != nil {
		return err
	}
	if err := plotCompare(all, filepath.Join(dir, "compare.png")); err != nil {
		return err
	}
	return plotMemory(all, filepath.Join(dir, "memory.png"))
}

// bareLoop reports whether strategy is one of the bare loops, of patches or
// of updates of listed objects.
func bareLoop(strategy string) bool {
	return strings.HasPrefix(strategy, "bare-patch-c") || strings.HasPrefix(strategy, "bare-update-c")
}

// bestBare is the fastest bare loop at objects, of either request kind at
// any worker count that ran, if any ran.
func bestBare(all []figures, objects int) (figures, bool) {
	var best figures
	for _, f := range all {
		if f.Objects == objects && bareLoop(f.Strategy) && f.ObjectsPerSec > best.ObjectsPerSec {
			best = f
		}
	}
	return best, best.Strategy != ""
}

// tables renders, per size, the comparison (each row's ratio to the best
// bare loop at that size), then the finish of the whole migrations and the
// steady writer's latency, in the order strategies() lists the strategies.
func tables(all []figures) string {
	order := map[string]int{}
	for i, s := range slices.Concat(strategies(), defaultsStrategies()) {
		order[s.name] = i
	}
	// The HA rows ran on a control plane of their own: a table apart.
	var ha []figures
	all = slices.DeleteFunc(all, func(f figures) bool {
		if slices.ContainsFunc(haStrategies(), func(s strategy) bool { return s.name == f.Strategy }) {
			ha = append(ha, f)
			return true
		}
		return false
	})
	slices.SortFunc(all, func(a, b figures) int {
		return cmp.Or(cmp.Compare(a.Objects, b.Objects), cmp.Compare(order[a.Strategy], order[b.Strategy]))
	})
	var out strings.Builder
	for i, f := range all {
		if f.Writer != nil {
			continue
		}
		if i == 0 || all[i-1].Objects != f.Objects {
			fmt.Fprintf(&out, "\n### %s objects\n\n", thousands(f.Objects))
			if best, ok := bestBare(all, f.Objects); ok {
				fmt.Fprintf(&out, "Best bare loop: %s, %s objects/s.\n\n", best.Strategy, thousands(int(best.ObjectsPerSec+0.5)))
			}
			out.WriteString("| strategy | objects/s | rounds: range | × best bare loop | pass s | requests/object | API server CPU ms/object | peak memory | status writes/pass | mean pace |\n")
			out.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
		}
		ratio, memory, writes, pace, spread := "–", fmt.Sprintf("%.1f MiB heap growth", f.PeakHeapGrowthMiB), "–", "–", "1"
		if f.Rounds > 1 {
			spread = fmt.Sprintf("median of %d: %s–%s", f.Rounds, thousands(int(f.MinObjectsPerSec+0.5)), thousands(int(f.MaxObjectsPerSec+0.5)))
		}
		if best, ok := bestBare(all, f.Objects); ok {
			ratio = fmt.Sprintf("%.2f", f.ObjectsPerSec/best.ObjectsPerSec)
		}
		if f.PeakRSSMiB > 0 {
			memory = fmt.Sprintf("%.1f MiB manager RSS", f.PeakRSSMiB)
			writes = fmt.Sprintf("%.0f", f.StatusWrites)
		}
		if f.MeanConcurrency > 0 {
			pace = fmt.Sprintf("%.1f", f.MeanConcurrency)
		}
		fmt.Fprintf(&out, "| %s | %s | %s | %s | %.1f | %.4f | %.2f | %s | %s | %s |\n",
			f.Strategy, thousands(int(f.ObjectsPerSec+0.5)), spread, ratio, f.PassSeconds, f.Requests, f.APIServerCPUMs, memory, writes, pace)
	}

	var finish, writer []figures
	for _, f := range all {
		if f.PassRequests > 0 {
			finish = append(finish, f)
		}
		if f.Writer != nil {
			writer = append(writer, f)
		}
	}
	if len(finish) > 0 {
		out.WriteString("\n### The finish: the re-check after the settle window\n\n")
		out.WriteString("| strategy | objects | pass requests | written by others in the window | re-checked | re-check requests | × pass requests | pass end to prune, s |\n")
		out.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- |\n")
		for _, f := range finish {
			fmt.Fprintf(&out, "| %s | %s | %s | %.0f | %.0f | %.0f | %.4f | %.1f |\n",
				f.Strategy, thousands(f.Objects), thousands(int(f.PassRequests)), f.OthersWrote, f.Rechecked, f.RecheckRequests, f.RecheckRequests/f.PassRequests, f.FinishSeconds)
		}
	}
	if len(ha) > 0 {
		out.WriteString("\n### Three API servers on addresses of their own: what waiting for every one costs\n\n")
		out.WriteString("The manager process, storage switch to prune, on three kube-apiservers on one etcd, each on an address of its own behind a balancer (API server CPU of all three).\n\n")
		out.WriteString("| strategy | objects | objects/s | rounds: range | switch to prune, s | requests/object | API server CPU ms/object | peak memory | status writes/pass |\n")
		out.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
		for _, f := range ha {
			spread := "1"
			if f.Rounds > 1 {
				spread = fmt.Sprintf("median of %d: %s–%s", f.Rounds, thousands(int(f.MinObjectsPerSec+0.5)), thousands(int(f.MaxObjectsPerSec+0.5)))
			}
			fmt.Fprintf(&out, "| %s | %s | %s | %s | %.1f | %.4f | %.2f | %.1f MiB manager RSS | %.0f |\n",
				f.Strategy, thousands(f.Objects), thousands(int(f.ObjectsPerSec+0.5)), spread, f.PassSeconds, f.Requests, f.APIServerCPUMs, f.PeakRSSMiB, f.StatusWrites)
		}
	}
	if len(writer) > 0 {
		out.WriteString("\n### Yield: a steady writer's latency (50 writes/s) alone and during the pass\n\n")
		out.WriteString("| pass, as restow's service account | objects | objects/s | mean pace | writer p50 alone, ms | p99 alone | p50 during | p99 during | p99 during / alone | writes alone, during |\n")
		out.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
		for _, f := range writer {
			w := f.Writer
			pace := "–"
			if f.MeanConcurrency > 0 {
				pace = fmt.Sprintf("%.1f", f.MeanConcurrency)
			}
			fmt.Fprintf(&out, "| %s | %s | %s | %s | %.1f | %.1f | %.1f | %.1f | %.2f | %d, %d |\n",
				f.Strategy, thousands(f.Objects), thousands(int(f.ObjectsPerSec+0.5)), pace, w.AloneP50Ms, w.AloneP99Ms, w.DuringP50Ms, w.DuringP99Ms, w.DuringP99Ms/w.AloneP99Ms, w.AloneWrites, w.DuringWrites)
		}
	}
	return strings.TrimPrefix(out.String(), "\n")
}

// roundsTable renders, at each size whose strategies ran in interleaved
// rounds, every round of them: objects/s and API server CPU per object, and
// each paced row's ratio to the faster bare loop of the same round. The
// tables above compare medians; this shows how far the rounds, which ran
// minutes apart on a shared host, moved together.
func roundsTable(all []figures) string {
	var names []string
	for _, s := range slices.Concat(strategies(), defaultsStrategies()) {
		if s.interleave && !slices.Contains(names, s.name) {
			names = append(names, s.name)
		}
	}
	bySize := map[int]map[int]map[string]figures{}
	for _, f := range all {
		if !slices.Contains(names, f.Strategy) {
			continue
		}
		if bySize[f.Objects] == nil {
			bySize[f.Objects] = map[int]map[string]figures{}
		}
		if bySize[f.Objects][f.Round] == nil {
			bySize[f.Objects][f.Round] = map[string]figures{}
		}
		bySize[f.Objects][f.Round][f.Strategy] = f
	}
	var out strings.Builder
	for _, n := range slices.Sorted(maps.Keys(bySize)) {
		rounds := bySize[n]
		if len(rounds) < 2 {
			continue
		}
		fmt.Fprintf(&out, "\n### Round by round, %s objects\n\n", thousands(n))
		out.WriteString("objects/s (API server CPU ms/object); the ratio of restow and of the manager is to the faster of the interleaved bare loops in the same round.\n\n| round |")
		for _, name := range names {
			fmt.Fprintf(&out, " %s |", name)
		}
		var paced []string
		for _, name := range names {
			if !bareLoop(name) {
				paced = append(paced, name)
				fmt.Fprintf(&out, " %s × bare |", name)
			}
		}
		out.WriteString("\n|" + strings.Repeat(" --- |", 1+len(names)+len(paced)) + "\n")
		for _, r := range slices.Sorted(maps.Keys(rounds)) {
			row := rounds[r]
			var bare float64
			for name, f := range row {
				if bareLoop(name) {
					bare = max(bare, f.ObjectsPerSec)
				}
			}
			fmt.Fprintf(&out, "| %d |", r+1)
			for _, name := range names {
				if f, ok := row[name]; ok {
					fmt.Fprintf(&out, " %s (%.2f) |", thousands(int(f.ObjectsPerSec+0.5)), f.APIServerCPUMs)
				} else {
					out.WriteString(" – |")
				}
			}
			for _, name := range paced {
				if f, ok := row[name]; ok && bare > 0 {
					fmt.Fprintf(&out, " %.2f |", f.ObjectsPerSec/bare)
				} else {
					out.WriteString(" – |")
				}
			}
			out.WriteString("\n")
		}
	}
	return out.String()
}

func thousands(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// plotThroughput draws objects/s against concurrency at sweepObjects, one
// line per series, and restow's paced pass at its mean pace.
func plotThroughput(all []figures, path string) error {
	series := map[string]plotter.XYs{}
	var names []string
	add := func(name string, xy plotter.XY) {
		if _, ok := series[name]; !ok {
			names = append(names, name)
		}
		series[name] = append(series[name], xy)
	}
	for _, f := range all {
		switch {
		case f.Objects != sweepObjects:
		case f.Strategy == "restow" && f.MeanConcurrency > 0:
			add("restow, paced (at its mean pace)", plotter.XY{X: f.MeanConcurrency, Y: f.ObjectsPerSec})
		case f.Series != "":
			add(f.Series, plotter.XY{X: float64(f.Concurrency), Y: f.ObjectsPerSec})
		}
	}
	if len(names) == 0 {
		return nil
	}
	p := newPlot(fmt.Sprintf("Rewrite throughput against workers, %s objects of ~1 KiB", thousands(sweepObjects)),
		"concurrent requests (workers)", "objects/s", ticks(1, 4, 8, 16, 32, 64, 128, 256), false)
	lines := make([]line, 0, len(names))
	for _, name := range names {
		lines = append(lines, line{name, series[name]})
	}
	return savePlot(p, path, lines)
}

// line is one named series of a plot.
type line struct {
	name   string
	points plotter.XYs
}

// newPlot starts a plot with a logarithmic x axis at xTicks and a y axis
// from 0, its legend on the left, at the top or (where the lines run high)
// at the bottom.
func newPlot(title, xLabel, yLabel string, xTicks []plot.Tick, legendTop bool) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xLabel
	p.Y.Label.Text = yLabel
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.ConstantTicks(xTicks)
	p.Y.Min = 0
	p.Legend.Top = legendTop
	p.Legend.Left = true
	return p
}

// savePlot draws each line that has points, in order of x, and writes the plot to path.
func savePlot(p *plot.Plot, path string, lines []line) error {
	var args []any
	for _, l := range lines {
		if len(l.points) > 0 {
			slices.SortFunc(l.points, func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
			args = append(args, l.name, l.points)
		}
	}
	if err := plotutil.AddLinePoints(p, args...); err != nil {
		return err
	}
	return p.Save(7*vg.Inch, 4.5*vg.Inch, path)
}

// plotCompare draws objects/s against the number of objects for restow's
// paced pass, the manager as users run it (storage switch to prune) and the
// best bare loop at each size.
func plotCompare(all []figures, path string) error {
	var pass, manager, bare plotter.XYs
	var sizes []float64
	for _, f := range all {
		switch f.Strategy {
		case "restow":
			pass = append(pass, plotter.XY{X: float64(f.Objects), Y: f.ObjectsPerSec})
		case "operator":
			manager = append(manager, plotter.XY{X: float64(f.Objects), Y: f.ObjectsPerSec})
		default:
			continue
		}
		if best, ok := bestBare(all, f.Objects); ok && !slices.Contains(sizes, float64(f.Objects)) {
			sizes = append(sizes, float64(f.Objects))
			bare = append(bare, plotter.XY{X: float64(f.Objects), Y: best.ObjectsPerSec})
		}
	}
	if len(pass)+len(manager) == 0 {
		return nil
	}
	slices.Sort(sizes)
	p := newPlot("restow against the best bare loop of each size", "objects", "objects/s", ticks(sizes...), false)
	return savePlot(p, path, []line{
		{"restow pass, paced (first request to last object)", pass},
		{"manager process (storage switch to prune)", manager},
		{"best bare loop (patch or update, any worker count run)", bare},
	})
}

// plotMemory draws peak memory against the number of objects: the manager
// process's peak resident set, and the heap growth of restow's default pass
// in the benchmark process.
func plotMemory(all []figures, path string) error {
	var rss, heap plotter.XYs
	sizes := make([]float64, 0, len(all))
	for _, f := range all {
		switch f.Strategy {
		case "operator", "operator-scale":
			rss = append(rss, plotter.XY{X: float64(f.Objects), Y: f.PeakRSSMiB})
		case "restow":
			heap = append(heap, plotter.XY{X: float64(f.Objects), Y: f.PeakHeapGrowthMiB})
		default:
			continue
		}
		sizes = append(sizes, float64(f.Objects))
	}
	if len(rss)+len(heap) == 0 {
		return nil
	}
	p := newPlot("Peak memory of a pass against the number of objects", "objects", "MiB", ticks(sizes...), true)
	return savePlot(p, path, []line{{"manager process, peak RSS", rss}, {"restow pass, peak heap growth", heap}})
}

func ticks[T int | float64](values ...T) []plot.Tick {
	out := make([]plot.Tick, 0, len(values))
	for _, v := range values {
		out = append(out, plot.Tick{Value: float64(v), Label: thousands(int(v))})
	}
	return out
}
