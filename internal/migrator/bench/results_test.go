package bench

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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

// record keeps fig, replacing earlier figures of the same strategy and size
// (the testing package runs a benchmark once with b.N = 1 before the real run).
func record(fig figures) {
	results.Lock()
	defer results.Unlock()
	results.all = slices.DeleteFunc(results.all, func(f figures) bool {
		return f.Objects == fig.Objects && f.Strategy == fig.Strategy
	})
	results.all = append(results.all, fig)
}

// writeResults writes the run's figures into RESTOW_BENCH_OUT, if set:
// figures.json, results.md (the tables of docs/benchmarks.md), and the plots
// throughput.png (objects/s against concurrency) and memory.png (peak memory
// against the number of objects).
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
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(tables(all)), 0o644); err != nil {
		return err
	}
	if err := plotThroughput(all, filepath.Join(dir, "throughput.png")); err != nil {
		return err
	}
	return plotMemory(all, filepath.Join(dir, "memory.png"))
}

// tables renders one Markdown table per size, in the order strategies()
// lists the strategies, with each row's ratio to the bare loop at 16 workers.
func tables(all []figures) string {
	order := map[string]int{}
	for i, s := range strategies() {
		order[s.name] = i
	}
	slices.SortFunc(all, func(a, b figures) int {
		return cmp.Or(cmp.Compare(a.Objects, b.Objects), cmp.Compare(order[a.Strategy], order[b.Strategy]))
	})
	var out strings.Builder
	for i, f := range all {
		if i == 0 || all[i-1].Objects != f.Objects {
			fmt.Fprintf(&out, "\n### %s objects\n\n", thousands(f.Objects))
			out.WriteString("| strategy | objects/s | × bare-patch-c16 | requests/object | API server CPU ms/object | peak memory | status writes/pass |\n")
			out.WriteString("| --- | --- | --- | --- | --- | --- | --- |\n")
		}
		bare := 0.0
		for _, g := range all {
			if g.Objects == f.Objects && g.Strategy == "bare-patch-c16" {
				bare = g.ObjectsPerSec
			}
		}
		ratio, memory, writes := "–", fmt.Sprintf("%.1f MiB heap growth", f.PeakHeapGrowthMiB), "–"
		if bare > 0 {
			ratio = fmt.Sprintf("%.2f", f.ObjectsPerSec/bare)
		}
		if f.PeakRSSMiB > 0 {
			memory = fmt.Sprintf("%.1f MiB manager RSS", f.PeakRSSMiB)
			writes = fmt.Sprintf("%.0f", f.StatusWrites)
		}
		fmt.Fprintf(&out, "| %s | %s | %s | %.4f | %.2f | %s | %s |\n",
			f.Strategy, thousands(int(f.ObjectsPerSec+0.5)), ratio, f.Requests, f.APIServerCPUMs, memory, writes)
	}
	return strings.TrimPrefix(out.String(), "\n")
}

func thousands(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// plotThroughput draws objects/s against concurrency at sweepObjects, one
// line per series.
func plotThroughput(all []figures, path string) error {
	series := map[string]plotter.XYs{}
	var names []string
	for _, f := range all {
		if f.Objects != sweepObjects || f.Series == "" {
			continue
		}
		if _, ok := series[f.Series]; !ok {
			names = append(names, f.Series)
		}
		series[f.Series] = append(series[f.Series], plotter.XY{X: float64(f.Concurrency), Y: f.ObjectsPerSec})
	}
	if len(names) == 0 {
		return nil
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Rewrite throughput, %s objects of ~1 KiB", thousands(sweepObjects))
	p.X.Label.Text = "concurrent requests (workers)"
	p.Y.Label.Text = "objects/s"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.ConstantTicks(ticks(1, 4, 8, 16, 32, 64))
	p.Y.Min = 0
	p.Legend.Top = true
	p.Legend.Left = true
	var lines []any
	for _, name := range names {
		points := series[name]
		slices.SortFunc(points, func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
		lines = append(lines, name, points)
	}
	if err := plotutil.AddLinePoints(p, lines...); err != nil {
		return err
	}
	return p.Save(7*vg.Inch, 4.5*vg.Inch, path)
}

// plotMemory draws peak memory against the number of objects: the manager
// process's peak resident set, and the heap growth of restow's default pass
// in the benchmark process.
func plotMemory(all []figures, path string) error {
	var rss, heap plotter.XYs
	sizes := make([]float64, 0, len(all))
	for _, f := range all {
		switch f.Strategy {
		case "operator":
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
	p := plot.New()
	p.Title.Text = "Peak memory of a pass against the number of objects"
	p.X.Label.Text = "objects"
	p.Y.Label.Text = "MiB"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.ConstantTicks(ticks(sizes...))
	p.Y.Min = 0
	p.Legend.Top = true
	p.Legend.Left = true
	var lines []any
	for _, s := range []struct {
		name   string
		points plotter.XYs
	}{{"manager process, peak RSS", rss}, {"restow pass, peak heap growth", heap}} {
		if len(s.points) > 0 {
			slices.SortFunc(s.points, func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
			lines = append(lines, s.name, s.points)
		}
	}
	if err := plotutil.AddLinePoints(p, lines...); err != nil {
		return err
	}
	return p.Save(7*vg.Inch, 4.5*vg.Inch, path)
}

func ticks[T int | float64](values ...T) []plot.Tick {
	out := make([]plot.Tick, 0, len(values))
	for _, v := range values {
		out = append(out, plot.Tick{Value: float64(v), Label: thousands(int(v))})
	}
	return out
}
