package main

import (
	"encoding/json"
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// targetClients is the concurrency the targets are judged at.
const targetClients = 32

// target is one performance target: a mode's figure against the baseline's
// at targetClients.
type target struct {
	name  string
	mode  string
	p99   bool    // compare p99 latency (at most want × baseline); else throughput (at least want × baseline)
	want  float64 // the ratio
	got   float64
	known bool // both figures were measured
}

func (t target) met() bool {
	if t.p99 {
		return t.got <= t.want
	}
	return t.got >= t.want
}

type report struct {
	when    time.Time
	results []result
	targets []target
}

func newReport(results []result, opts options) *report {
	r := &report{when: time.Now().UTC(), results: results}
	find := func(mode string) (result, bool) {
		for _, x := range results {
			if x.Mode == mode && x.Clients == targetClients {
				return x, true
			}
		}
		return result{}, false
	}
	base, haveBase := find(modeBaseline)
	for _, t := range []target{
		{name: "first requests: throughput ≥ 0.8 × baseline", mode: modeFirst, want: 0.8},
		{name: "first requests: p99 ≤ 1.5 × baseline p99", mode: modeFirst, p99: true, want: 1.5},
		{name: "replays: throughput ≥ 1.5 × baseline", mode: modeReplay, want: 1.5},
		{name: "replays from Redis: throughput ≥ 2.5 × baseline", mode: modeReplayRedis, want: 2.5},
	} {
		if m, ok := find(t.mode); ok && haveBase {
			t.known = true
			if t.p99 {
				t.got = m.P99Ms / base.P99Ms
			} else {
				t.got = m.RPS / base.RPS
			}
		}
		r.targets = append(r.targets, t)
	}
	return r
}

// printRatios prints each target's ratio and returns how many were missed
// (a target that could not be measured counts as missed).
func (r *report) printRatios(w io.Writer) int {
	missed := 0
	fmt.Fprintf(w, "targets at %d clients, against the baseline of the same run:\n", targetClients)
	for _, t := range r.targets {
		verdict := "met"
		switch {
		case !t.known:
			verdict, missed = "NOT MEASURED", missed+1
		case !t.met():
			verdict, missed = "MISSED", missed+1
		}
		fmt.Fprintf(w, "  %-50s %5.2f  %s\n", t.name, t.got, verdict)
	}
	return missed
}

func (r *report) write(opts options) error {
	for _, p := range []string{opts.markdown, opts.json, opts.chart} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
	}
	raw, err := json.MarshalIndent(map[string]any{"measured_at": r.when, "duration_seconds": opts.duration.Seconds(), "results": r.results}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(opts.json, append(raw, '\n'), 0o644); err != nil {
		return err
	}
	if err := r.drawChart(opts.chart); err != nil {
		return err
	}
	return os.WriteFile(opts.markdown, []byte(r.markdown(opts)), 0o644)
}

func (r *report) markdown(opts options) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Benchmarks\n\nWritten by `make bench` (`cmd/bench`) on %s: %d CPUs, %s, PostgreSQL and Redis on loopback, the service in the same process as the load generator. Each figure is a closed loop of that many clients for %s; all modes were measured side by side in one run, interleaved per concurrency. Ratios, not absolute numbers, are what carry over to other machines.\n\n",
		r.when.Format("2006-01-02 15:04 UTC"), runtime.NumCPU(), runtime.Version(), opts.duration)
	b.WriteString("Modes: **baseline** is `POST /orders` on the same handler with the idempotency middleware left out (the same order INSERT, nothing else); **first** sends a new Idempotency-Key each time; **replay** repeats one key per client; **+redis** puts the Redis fast path in front.\n\n")
	fmt.Fprintf(&b, "## Targets (at %d clients)\n\n| Target | Ratio | |\n| --- | --- | --- |\n", targetClients)
	for _, t := range r.targets {
		verdict := "met"
		if !t.known {
			verdict = "not measured"
		} else if !t.met() {
			verdict = "**missed**"
		}
		fmt.Fprintf(&b, "| %s | %.2f | %s |\n", t.name, t.got, verdict)
	}
	b.WriteString("\n## Throughput and latency\n\n| Mode | Clients | Requests/s | p50 ms | p99 ms |\n| --- | ---: | ---: | ---: | ---: |\n")
	for _, x := range r.results {
		fmt.Fprintf(&b, "| %s | %d | %.0f | %.2f | %.2f |\n", x.Mode, x.Clients, x.RPS, x.P50Ms, x.P99Ms)
	}
	rel, _ := filepath.Rel(filepath.Dir(opts.markdown), opts.chart)
	fmt.Fprintf(&b, "\n![Throughput and p99 per mode](%s)\n\nThe raw numbers are in `%s`.\n", filepath.ToSlash(rel), filepath.Base(opts.json))
	return b.String()
}

var modeColors = map[string]color.Color{
	modeBaseline:    color.RGBA{0x55, 0x55, 0x55, 0xff},
	modeFirst:       color.RGBA{0x56, 0xa6, 0x4b, 0xff},
	modeReplay:      color.RGBA{0x32, 0x74, 0xd9, 0xff},
	modeReplayDB:    color.RGBA{0x8e, 0x5b, 0xc9, 0xff},
	modeFirstRedis:  color.RGBA{0xe0, 0xb4, 0x00, 0xff},
	modeReplayRedis: color.RGBA{0xe0, 0x2f, 0x44, 0xff},
}

// drawChart draws throughput and p99 against clients, one line per mode.
func (r *report) drawChart(path string) error {
	panels := []struct {
		title, y string
		value    func(result) float64
	}{
		{"Throughput", "requests/s", func(x result) float64 { return x.RPS }},
		{"p99 latency", "ms", func(x result) float64 { return x.P99Ms }},
	}
	img := vgimg.New(vg.Points(1100), vg.Points(420))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: len(panels), PadX: vg.Points(20), PadTop: vg.Points(10), PadBottom: vg.Points(10), PadLeft: vg.Points(10), PadRight: vg.Points(10)}
	for i, panel := range panels {
		p := plot.New()
		p.Title.Text = panel.title
		p.X.Label.Text = "clients"
		p.Y.Label.Text = panel.y
		p.Legend.Top = true
		for _, mode := range []string{modeBaseline, modeFirst, modeReplay, modeReplayDB, modeFirstRedis, modeReplayRedis} {
			var xys plotter.XYs
			for _, x := range r.results {
				if x.Mode == mode {
					xys = append(xys, plotter.XY{X: float64(x.Clients), Y: panel.value(x)})
				}
			}
			if len(xys) == 0 {
				continue
			}
			line, points, err := plotter.NewLinePoints(xys)
			if err != nil {
				return err
			}
			line.Color, points.Color = modeColors[mode], modeColors[mode]
			p.Add(line, points)
			p.Legend.Add(mode, line)
		}
		p.Draw(tiles.At(dc, i, 0))
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		return err
	}
	return f.Close()
}
