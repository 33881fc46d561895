package main

import (
	"encoding/json"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// The chart: 1280×1280 pixels at 96 dpi, so that its text stays legible
// when the README or GitHub's Markdown view scales it to about 880 pixels:
// four panels in two rows over a key as wide as the chart.
const (
	chartWidth  = vg.Length(960)
	chartHeight = vg.Length(960)
	chartDPI    = 96
	// keyHeight is the strip under the panels that the key fills.
	keyHeight = vg.Length(205)
)

// series is a mode as a chart draws it and its key explains it.
type series struct {
	mode, meaning string
	color         color.Color
}

// chartModes are the series in the order the key lists them, each with what
// the chart says it is: a reader of the picture alone must know what
// "replay-db" measured.
var chartModes = []series{
	{modeBaseline, "the same POST /orders without the idempotency layer (the order INSERT alone)", rgb(0x55, 0x55, 0x55)},
	{modeBare, "POST /orders written by hand: net/http and one pgx INSERT, no auth, validation, metrics or logging", rgb(0x9a, 0x63, 0x24)},
	{modeFirst, "first request with a new Idempotency-Key", rgb(0x56, 0xa6, 0x4b)},
	{modeReplay, "the same request again, answered from the in-process record cache", rgb(0x32, 0x74, 0xd9)},
	{modeReplayDB, "a replay answered by PostgreSQL (a replica that has not cached the key)", rgb(0x8e, 0x5b, 0xc9)},
	{modeFirstRedis, "first request, with the Redis fast path", rgb(0xe0, 0xb4, 0x00)},
	{modeReplayRedis, "a replay answered by Redis (a replica that has not cached the key)", rgb(0xe0, 0x2f, 0x44)},
}

// ratioTarget is a target drawn on a ratio panel: a mode's throughput over
// the panel's, wanted at each client count as judge wants it, one dashed
// line for each run of client counts with the same target.
type ratioTarget struct {
	label string
	want  func(clients int) float64
	color color.Color
}

// ratioTargets are drawn on the panel of ratios to the baseline.
var ratioTargets = []ratioTarget{
	{"first", firstTarget, rgb(0x56, 0xa6, 0x4b)},
	{"replays", func(int) float64 { return replayTarget }, rgb(0x32, 0x74, 0xd9)},
}

// bareTargets are drawn on the panel of ratios to bare.
var bareTargets = []ratioTarget{
	{"first", bareTarget, rgb(0x56, 0xa6, 0x4b)},
}

// bareRatioModes are the series of the panel of ratios to bare: the modes
// that create an order. Replays create none, so their ratio to an INSERT
// says nothing the ratio to the baseline does not, and would stretch the
// axis over the ratios this panel is for.
var bareRatioModes = []string{modeBare, modeBaseline, modeFirst, modeFirstRedis}

func rgb(r, g, b uint8) color.Color { return color.RGBA{R: r, G: g, B: b, A: 0xff} }

var targetDashes = []vg.Length{vg.Points(6), vg.Points(4)}

// drawChart draws throughput, p99 latency and the throughput ratios to the
// baseline and to bare against clients, one line per mode, and a key that
// explains the modes and the targets, into a PNG at path.
func (r *report) drawChart(path string, rounds int, duration time.Duration) error {
	clients := r.clientCounts()
	if len(clients) == 0 {
		return fmt.Errorf("chart: no results to draw")
	}
	throughput := r.panel("Throughput", "requests/s", clients, func(x result) float64 { return x.RPS })
	throughput.Y.Min, throughput.Y.Max = 0, throughput.Y.Max*1.05
	throughput.Y.Tick.Marker = plot.TickerFunc(linearTicks)
	latency := r.panel("p99 latency", "ms (log scale)", clients, func(x result) float64 { return x.P99Ms })
	logAxis(&latency.Y, "")
	latency.Y.Min, latency.Y.Max = latency.Y.Min/1.3, latency.Y.Max*1.3
	overBaseline, err := r.ratioPanel("Throughput ÷ baseline, with the targets", modeBaseline, nil, ratioTargets, clients)
	if err != nil {
		return err
	}
	overBare, err := r.ratioPanel("Throughput ÷ bare, with the target", modeBare, bareRatioModes, bareTargets, clients)
	if err != nil {
		return err
	}

	img := vgimg.NewWith(vgimg.UseWH(chartWidth, chartHeight), vgimg.UseDPI(chartDPI))
	dc := draw.New(img)
	header := fmt.Sprintf("Oncekey load benchmark (make bench, %s): POST /orders on PostgreSQL, closed-loop clients; medians of %d rounds of %s each.",
		r.when.Format("2006-01-02"), rounds, duration)
	dc.FillText(textStyle(14, draw.XLeft, draw.YTop), vg.Point{X: 12, Y: chartHeight - 8}, header)
	plots := [][]*plot.Plot{{throughput, latency}, {overBaseline, overBare}}
	tiles := draw.Tiles{Rows: 2, Cols: 2, PadTop: 30, PadBottom: 6, PadLeft: 6, PadRight: 12, PadX: 24, PadY: 16}
	canvases := plot.Align(plots, tiles, draw.Crop(dc, 0, 0, keyHeight, 0))
	for i, row := range plots {
		for j, p := range row {
			if p != nil {
				p.Draw(canvases[i][j])
			}
		}
	}
	for j, missing := range []string{
		"No ratio to the baseline: the baseline was not measured.",
		"No ratio to bare: bare was not measured.",
	} {
		if plots[1][j] == nil {
			c := canvases[1][j]
			c.FillText(textStyle(13, draw.XCenter, draw.YCenter), c.Center(), missing)
		}
	}
	drawKey(draw.Crop(dc, 0, 0, 0, keyHeight-chartHeight))
	return writePNG(path, img)
}

// clientCounts are the concurrencies measured, in order.
func (r *report) clientCounts() []int {
	var cs []int
	for _, x := range r.results {
		if !slices.Contains(cs, x.Clients) {
			cs = append(cs, x.Clients)
		}
	}
	slices.Sort(cs)
	return cs
}

// panel is a plot of one figure of the medians against clients, on a log
// axis whose ticks are the client counts measured (1, 8, 32 and 64 would
// crowd the left edge of a linear one).
func (r *report) panel(title, yLabel string, clients []int, value func(result) float64) *plot.Plot {
	p := newPlot(title, yLabel, clients)
	for _, m := range chartModes {
		var xys plotter.XYs
		for _, x := range r.results {
			if x.Mode == m.mode {
				xys = append(xys, plotter.XY{X: float64(x.Clients), Y: value(x)})
			}
		}
		addSeries(p, xys, m.color)
	}
	return p
}

// ratioPanel plots the throughput of modes (nil: every mode of the chart)
// over over's (the median of the per-round ratios, as the targets are
// judged) with targets; nil when over was not measured.
func (r *report) ratioPanel(title, over string, modes []string, targets []ratioTarget, clients []int) (*plot.Plot, error) {
	p := newPlot(title, "ratio (log scale)", clients)
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, m := range chartModes {
		if modes != nil && !slices.Contains(modes, m.mode) {
			continue
		}
		var xys plotter.XYs
		for _, c := range clients {
			if got, ok := ratioOver(r.all, over, m.mode, c, false); ok {
				xys = append(xys, plotter.XY{X: float64(c), Y: got})
				lo, hi = min(lo, got), max(hi, got)
			}
		}
		addSeries(p, xys, m.color)
	}
	if math.IsInf(lo, 0) {
		return nil, nil // over was not measured (make bench -modes first)
	}
	var labels plotter.XYLabels
	var labelStyles []text.Style
	last := float64(clients[len(clients)-1])
	type targetLine struct {
		label string
		want  float64
		color color.Color
		at    []float64 // the client counts it applies to
	}
	var lines []targetLine
	for _, t := range targets {
		for i, c := range clients {
			want := t.want(c)
			if i == 0 || want != lines[len(lines)-1].want {
				lines = append(lines, targetLine{label: fmt.Sprintf("%s ≥ %g×", t.label, want), want: want, color: t.color})
			}
			lines[len(lines)-1].at = append(lines[len(lines)-1].at, float64(c))
		}
	}
	for _, t := range lines {
		at := t.at
		// A dash a little wider than the client counts it applies to, so
		// that a target at one client count is still a line.
		from, to := at[0]/1.25, at[len(at)-1]*1.25
		line, err := plotter.NewLine(plotter.XYs{{X: from, Y: t.want}, {X: to, Y: t.want}})
		if err != nil {
			return nil, err
		}
		line.Color, line.Width, line.Dashes = t.color, vg.Points(1.5), targetDashes
		p.Add(line)
		// A label goes in the margin right of the last client count, where
		// no series runs, or else above the line's left end, left of where
		// the series start.
		sty := textStyle(12, draw.XLeft, draw.YBottom)
		at0 := plotter.XY{X: from, Y: t.want}
		if at[len(at)-1] == last {
			sty.YAlign = draw.YCenter
			at0 = plotter.XY{X: to, Y: t.want}
		}
		sty.Color = t.color
		labels.XYs = append(labels.XYs, at0)
		labels.Labels = append(labels.Labels, t.label)
		labelStyles = append(labelStyles, sty)
		lo, hi = min(lo, t.want), max(hi, t.want)
	}
	logAxis(&p.Y, "×")
	p.Y.Min, p.Y.Max = lo/1.3, hi*1.3
	p.X.Max = last * 2.4 // the margin for the labels
	if len(labels.XYs) > 0 {
		l, err := plotter.NewLabels(labels)
		if err != nil {
			return nil, err
		}
		copy(l.TextStyle, labelStyles)
		l.Offset = vg.Point{X: 3, Y: 2}
		p.Add(l)
	}
	return p, nil
}

func newPlot(title, yLabel string, clients []int) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = 15
	p.Title.Padding = 6
	p.X.Label.Text = "clients (log scale)"
	p.Y.Label.Text = yLabel
	p.X.Scale = plot.LogScale{}
	p.X.Min, p.X.Max = float64(clients[0])/1.6, float64(clients[len(clients)-1])*1.25
	var ticks plot.ConstantTicks
	for _, c := range clients {
		ticks = append(ticks, plot.Tick{Value: float64(c), Label: strconv.Itoa(c)})
	}
	p.X.Tick.Marker = ticks
	for _, a := range []*plot.Axis{&p.X, &p.Y} {
		a.Label.TextStyle.Font.Size = 13
		a.Tick.Label.Font.Size = 12
	}
	p.Add(plotter.NewGrid())
	return p
}

func addSeries(p *plot.Plot, xys plotter.XYs, c color.Color) {
	if len(xys) == 0 {
		return
	}
	line, points, err := plotter.NewLinePoints(xys)
	if err != nil {
		return // NewLinePoints fails only on NaN or Inf, which a median of finite figures is not
	}
	line.Color, line.Width = c, vg.Points(2)
	points.Color, points.Shape, points.Radius = c, draw.CircleGlyph{}, vg.Points(2.5)
	p.Add(line, points)
}

// linearTicks are about five major ticks at a round step (1, 2 or 5 times
// a power of ten), labelled as integers.
func linearTicks(lo, hi float64) []plot.Tick {
	rough := (hi - lo) / 5
	mag := math.Pow(10, math.Floor(math.Log10(rough)))
	step := 10 * mag
	for _, f := range []float64{1, 2, 5} {
		if f*mag >= rough {
			step = f * mag
			break
		}
	}
	step = max(step, 1)
	var ts []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi; v += step {
		ts = append(ts, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', 0, 64)})
		if half := v + step/2; half <= hi {
			ts = append(ts, plot.Tick{Value: half})
		}
	}
	return ts
}

// logAxis puts a on a log scale whose labelled ticks are 1, 2, 3 and 5
// times a power of ten (suffixed with unit), the rest unlabelled minor
// ticks. Values under 1 are labelled too: most ratios to bare are, and a
// panel of them read off unlabelled ticks alone would say nothing.
func logAxis(a *plot.Axis, unit string) {
	a.Scale = plot.LogScale{}
	a.Tick.Marker = plot.TickerFunc(func(lo, hi float64) []plot.Tick {
		var ts []plot.Tick
		for decade := math.Pow(10, math.Floor(math.Log10(lo))); decade <= hi; decade *= 10 {
			for i := 1; i < 10; i++ {
				v := decade * float64(i)
				if v < lo || v > hi {
					continue
				}
				t := plot.Tick{Value: v}
				if i == 1 || i == 2 || i == 3 || i == 5 {
					// As many decimals as the decade needs: 0.1 × 3 is
					// 0.30000000000000004 in full.
					t.Label = strconv.FormatFloat(v, 'f', max(0, -int(math.Floor(math.Log10(decade)))), 64) + unit
				}
				ts = append(ts, t)
			}
		}
		return ts
	})
}

func textStyle(size vg.Length, x text.XAlignment, y text.YAlignment) text.Style {
	return text.Style{
		Color:   color.Black,
		Font:    font.From(plot.DefaultFont, size),
		XAlign:  x,
		YAlign:  y,
		Handler: plot.DefaultTextHandler,
	}
}

// drawKey explains the series and the target lines in the strip under the
// panels, so that no legend covers a panel's data: the series in the left
// column, the targets and how to read the ratios in the right.
func drawKey(c draw.Canvas) {
	name := textStyle(13, draw.XLeft, draw.YTop)
	body := textStyle(12, draw.XLeft, draw.YTop)
	swatch, indent := vg.Length(26), vg.Length(34)
	lineHeight := body.Height("Xg") + 2
	top := c.Max.Y - 6
	// The series' meanings are the longer texts: theirs is the wider column.
	left := c.Min.X + 12
	split := c.Min.X + (c.Max.X-c.Min.X)*0.54
	right := split + 18
	targetsWidth := c.Max.X - 8 - right - indent

	c.FillText(name, vg.Point{X: left, Y: top}, "Series")
	drawSeriesKey(c, chartModes, name, body, left, top-lineHeight-6, split-left, 3)

	c.FillText(name, vg.Point{X: right, Y: top}, "Targets (dashed, on the ratio panels)")
	y := top - lineHeight - 6
	steps := func(want func(int) float64) string {
		return fmt.Sprintf("≥ %g × below %d clients, ≥ %g × from %d", want(1), targetClients, want(targetClients), targetClients)
	}
	for _, t := range []struct {
		text  string
		color color.Color
	}{
		{"first ÷ baseline (left): " + steps(firstTarget), ratioTargets[0].color},
		{fmt.Sprintf("replay ÷ baseline (left; from the record cache, as serve is wired): ≥ %.0f × at every client count; replay-db and replay+redis are not held to this line", float64(replayTarget)), ratioTargets[1].color},
		{"first ÷ bare (right): " + steps(bareTarget), bareTargets[0].color},
	} {
		mid := y - body.Height("X")/2
		c.StrokeLine2(draw.LineStyle{Color: t.color, Width: vg.Points(1.5), Dashes: targetDashes}, right, mid, right+swatch, mid)
		for _, l := range wrap(body, t.text, targetsWidth, targetsWidth) {
			c.FillText(body, vg.Point{X: right + indent, Y: y}, l)
			y -= lineHeight
		}
		y -= 3
	}
	y -= 6
	noteWidth := c.Max.X - 8 - right
	for _, l := range wrap(body, "Ratio: the median over the rounds of a mode's requests/s over the baseline's (left) or bare's (right) in the same round. "+
		"baseline ÷ bare is what the service costs around the INSERT, first ÷ baseline what the idempotency protocol costs, first ÷ bare both.", noteWidth, noteWidth) {
		c.FillText(body, vg.Point{X: right, Y: y}, l)
		y -= lineHeight
	}
}

// drawSeriesKey lists modes from y down, each with its swatch, its name in
// its color and its meaning wrapped to width beside the name, gap apart.
func drawSeriesKey(c draw.Canvas, modes []series, name, body text.Style, left, y, width, gap vg.Length) {
	swatch, indent := vg.Length(26), vg.Length(34)
	lineHeight := body.Height("Xg") + 2
	width -= indent
	for _, m := range modes {
		mid := y - name.Height("X")/2
		c.StrokeLine2(draw.LineStyle{Color: m.color, Width: vg.Points(2)}, left, mid, left+swatch, mid)
		c.DrawGlyph(draw.GlyphStyle{Color: m.color, Radius: vg.Points(2.5), Shape: draw.CircleGlyph{}}, vg.Point{X: left + swatch/2, Y: mid})
		colored := name
		colored.Color = m.color
		c.FillText(colored, vg.Point{X: left + indent, Y: y}, m.mode)
		nameWidth := name.Width(m.mode + " ")
		for i, l := range wrap(body, "= "+m.meaning, width-nameWidth, width) {
			x := left + indent
			if i == 0 {
				x += nameWidth
			}
			c.FillText(body, vg.Point{X: x, Y: y - 1}, l)
			y -= lineHeight
		}
		y -= gap
	}
}

// wrap breaks s into lines no wider than first (the first line) and rest.
func wrap(sty text.Style, s string, first, rest vg.Length) []string {
	var lines []string
	var cur string
	limit := first
	for _, w := range strings.Fields(s) {
		next := w
		if cur != "" {
			next = cur + " " + w
		}
		if cur != "" && sty.Width(next) > limit {
			lines, cur, limit = append(lines, cur), w, rest
			continue
		}
		cur = next
	}
	return append(lines, cur)
}

// chartFromJSON redraws the chart from a report's JSON (docs/benchmarks.json)
// without measuring anything: `make docs/images` re-renders it this way.
func chartFromJSON(jsonPath, chartPath string) error {
	raw, err := os.ReadFile(jsonPath)
	if err != nil {
		return err
	}
	var saved struct {
		MeasuredAt      time.Time    `json:"measured_at"`
		DurationSeconds float64      `json:"duration_seconds"`
		Rounds          int          `json:"rounds"`
		Results         []result     `json:"results"`
		Medians         []result     `json:"medians"`
		Proxy           *proxyResult `json:"proxy"`
	}
	if err := json.Unmarshal(raw, &saved); err != nil {
		return fmt.Errorf("%s: %w", jsonPath, err)
	}
	if err := os.MkdirAll(filepath.Dir(chartPath), 0o755); err != nil {
		return err
	}
	r := &report{when: saved.MeasuredAt, all: saved.Results, results: saved.Medians}
	if err := r.drawChart(chartPath, saved.Rounds, time.Duration(saved.DurationSeconds*float64(time.Second))); err != nil {
		return err
	}
	return drawGatewayChart(gatewayChartPath(chartPath), saved.Proxy, saved.MeasuredAt.Format("2006-01-02"))
}
