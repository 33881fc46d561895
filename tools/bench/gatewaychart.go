package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// The gateway's chart is a picture of its own beside the service's: the
// proxy phase measures other modes, at other client counts, against
// another baseline (the plain proxy), and the service's chart has no
// room left for them in its key. Two panels over a key, as wide as the
// service's chart and half as tall.
const (
	gatewayChartHeight = vg.Length(560)
	gatewayKeyHeight   = vg.Length(150)
)

// gatewayChartModes are the proxy phase's series as the key lists them: an
// upstream that writes (solid colors) and one that does nothing (lighter).
var gatewayChartModes = []series{
	{modePlainProxyDB, "a plain httputil.ReverseProxy in front of the upstream that INSERTs each order (the baseline of the +db modes)", rgb(0x55, 0x55, 0x55)},
	{modeFirstGatewayDB, "oncekey proxy on PostgreSQL, a new key each time, in front of that upstream: what the targets judge", rgb(0x56, 0xa6, 0x4b)},
	{modeReplayGatewayDB, "the same key again: the gateway answers from its record cache", rgb(0x32, 0x74, 0xd9)},
	{modePlainProxy, "a plain proxy in front of an upstream that does nothing (the baseline of the modes without +db)", rgb(0xaa, 0xaa, 0xaa)},
	{modeFirstGateway, "first requests through the gateway in front of that upstream, for the record", rgb(0xa8, 0xd8, 0x9e)},
	{modeReplayGateway, "replays through the gateway in front of that upstream", rgb(0x9c, 0xc0, 0xf0)},
}

// gatewayTarget is one of the proxy phase's throughput targets: mode's
// throughput over the plain proxy's in front of the same upstream, at
// clients.
type gatewayTarget struct {
	name    string
	mode    string
	clients int
	want    float64
}

// gatewayTargets are judged on the upstream that writes each order (#61);
// in front of one that does nothing the gateway is measured without a
// target.
var gatewayTargets = []gatewayTarget{
	{"gateway first requests, upstream writing: throughput ≥ %.2f × a plain reverse proxy", modeFirstGatewayDB, 1, 0.5},
	{"gateway first requests, upstream writing: throughput ≥ %.2f × a plain reverse proxy", modeFirstGatewayDB, targetClients, 0.65},
	{"gateway replays, upstream writing: throughput ≥ %.0f × a plain reverse proxy", modeReplayGatewayDB, targetClients, 2},
}

// drawGatewayChart draws the proxy phase into a PNG at path: every mode's
// throughput, and the gateway's over the plain proxy's with the targets,
// against clients; p nil (the phase was left out) draws a chart that says
// so, so that the picture the report links to never shows an older run.
func drawGatewayChart(path string, p *proxyResult, when string) error {
	img := vgimg.NewWith(vgimg.UseWH(chartWidth, gatewayChartHeight), vgimg.UseDPI(chartDPI))
	dc := draw.New(img)
	header := fmt.Sprintf("The gateway (make bench, %s): oncekey proxy against a plain reverse proxy in front of the same upstream; medians of the rounds.", when)
	dc.FillText(textStyle(14, draw.XLeft, draw.YTop), vg.Point{X: 12, Y: gatewayChartHeight - 8}, header)
	var clients []int
	if p != nil {
		for _, x := range p.Results {
			if !slices.Contains(clients, x.Clients) {
				clients = append(clients, x.Clients)
			}
		}
	}
	if len(clients) == 0 {
		dc.FillText(textStyle(13, draw.XCenter, draw.YCenter), dc.Center(), "The proxy phase was not measured in this run (make bench -proxy=false).")
		return writePNG(path, img)
	}
	slices.Sort(clients)
	throughput := newPlot("Throughput", "requests/s (log scale)", clients)
	ratios := newPlot("Throughput ÷ the plain proxy's, with the targets", "ratio (log scale)", clients)
	lo, hi := math.Inf(1), math.Inf(-1)
	tlo, thi := math.Inf(1), math.Inf(-1)
	for _, m := range gatewayChartModes {
		var rps, over plotter.XYs
		for _, c := range clients {
			var xs []float64
			for _, x := range p.Results {
				if x.Mode == m.mode && x.Clients == c {
					xs = append(xs, x.RPS)
				}
			}
			if len(xs) > 0 {
				v := median(xs)
				rps = append(rps, plotter.XY{X: float64(c), Y: v})
				tlo, thi = min(tlo, v), max(thi, v)
			}
			if proxyBase(m.mode) == m.mode {
				continue
			}
			if got, ok := ratioOver(p.Results, proxyBase(m.mode), m.mode, c, false); ok {
				over = append(over, plotter.XY{X: float64(c), Y: got})
				lo, hi = min(lo, got), max(hi, got)
			}
		}
		addSeries(throughput, rps, m.color)
		addSeries(ratios, over, m.color)
	}
	for _, t := range gatewayTargets {
		c := gatewayModeColor(t.mode)
		from, to := float64(t.clients)/1.25, float64(t.clients)*1.25
		line, err := plotter.NewLine(plotter.XYs{{X: from, Y: t.want}, {X: to, Y: t.want}})
		if err != nil {
			return err
		}
		line.Color, line.Width, line.Dashes = c, vg.Points(1.5), targetDashes
		ratios.Add(line)
		lo, hi = min(lo, t.want), max(hi, t.want)
	}
	if !math.IsInf(tlo, 0) {
		logAxis(&throughput.Y, "")
		throughput.Y.Min, throughput.Y.Max = tlo/1.3, thi*1.3
	}
	if !math.IsInf(lo, 0) {
		logAxis(&ratios.Y, "×")
		ratios.Y.Min, ratios.Y.Max = lo/1.3, hi*1.3
	}
	plots := [][]*plot.Plot{{throughput, ratios}}
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadTop: 30, PadBottom: 6, PadLeft: 6, PadRight: 12, PadX: 24}
	canvases := plot.Align(plots, tiles, draw.Crop(dc, 0, 0, gatewayKeyHeight, 0))
	throughput.Draw(canvases[0][0])
	ratios.Draw(canvases[0][1])
	drawGatewayKey(draw.Crop(dc, 0, 0, 0, gatewayKeyHeight-gatewayChartHeight))
	return writePNG(path, img)
}

// gatewayModeColor is mode's color in the gateway's chart.
func gatewayModeColor(mode string) color.Color {
	for _, m := range gatewayChartModes {
		if m.mode == mode {
			return m.color
		}
	}
	return color.Black
}

// drawGatewayKey explains the series (left) and the targets (right) under
// the panels.
func drawGatewayKey(c draw.Canvas) {
	name := textStyle(12, draw.XLeft, draw.YTop)
	body := textStyle(11, draw.XLeft, draw.YTop)
	swatch, indent := vg.Length(26), vg.Length(34)
	lineHeight := body.Height("Xg") + 1
	top := c.Max.Y - 4
	left := c.Min.X + 12
	split := c.Min.X + (c.Max.X-c.Min.X)*0.62
	right := split + 18
	drawSeriesKey(c, gatewayChartModes, name, body, left, top, split-left, 2)
	targetsWidth := c.Max.X - 8 - right - indent
	c.FillText(name, vg.Point{X: right, Y: top}, "Targets (dashed, on the ratio panel)")
	y := top - lineHeight - 4
	for _, t := range gatewayTargets {
		mid := y - body.Height("X")/2
		c.StrokeLine2(draw.LineStyle{Color: gatewayModeColor(t.mode), Width: vg.Points(1.5), Dashes: targetDashes}, right, mid, right+swatch, mid)
		text := fmt.Sprintf("%s ≥ %g × at %d client%s", t.mode, t.want, t.clients, plural(t.clients))
		for _, l := range wrap(body, text, targetsWidth, targetsWidth) {
			c.FillText(body, vg.Point{X: right + indent, Y: y}, l)
			y -= lineHeight
		}
		y -= 2
	}
	y -= 4
	noteWidth := c.Max.X - 8 - right
	for _, l := range wrap(body, "Ratio: the median over the rounds of a mode's requests/s over the plain proxy's in front of the same upstream, in the same round.", noteWidth, noteWidth) {
		c.FillText(body, vg.Point{X: right, Y: y}, l)
		y -= lineHeight
	}
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// gatewayChartPath is where the gateway's chart goes: beside the
// service's, named after it.
func gatewayChartPath(chart string) string {
	return strings.TrimSuffix(chart, ".png") + "-gateway.png"
}

func writePNG(path string, img *vgimg.Canvas) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
