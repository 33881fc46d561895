package main

import (
	"encoding/json"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/oncekey/oncekey/deploy/grafana"
)

// The picture: 1600×1000 pixels at 96 dpi, panels in a 3×2 grid.
const (
	imageWidth  = vg.Length(1200)
	imageHeight = vg.Length(750)
	imageDPI    = 96
	gridCols    = 3
)

const operation = "POST /orders"

// line is one series of a panel.
type line struct {
	name  string
	color color.Color
	xys   plotter.XYs // NaN: no value at that time (a gap)
}

// panel is one of the dashboard's panels, evaluated from the scrapes.
type panel struct {
	title   string // exactly as in the dashboard
	yLabel  string
	stacked bool // areas stacked, as the dashboard draws outcomes
	logY    bool // a logarithmic axis, as the dashboard has for percentiles
	lines   func([]scrape) []line
}

var (
	outcomeColors = []struct {
		outcome string
		color   color.Color
	}{
		{"executed", rgb(0x56, 0xa6, 0x4b)},
		{"replayed", rgb(0x32, 0x74, 0xd9)},
		{"rejected", rgb(0xe0, 0xb4, 0x00)},
		{"conflict", rgb(0xe0, 0x2f, 0x44)},
		{"in_flight", rgb(0xff, 0x98, 0x30)},
		{"error", rgb(0x8b, 0x00, 0x00)},
	}
	palette    = []color.Color{rgb(0x32, 0x74, 0xd9), rgb(0x56, 0xa6, 0x4b), rgb(0xe0, 0x2f, 0x44), rgb(0x8f, 0x3b, 0xb8), rgb(0xff, 0x98, 0x30)}
	burstShade = color.RGBA{R: 0xee, G: 0xee, B: 0xee, A: 0xff}
)

func rgb(r, g, b uint8) color.Color { return color.RGBA{R: r, G: g, B: b, A: 0xff} }

var idemRequests = selector{family: "oncekey_idempotency_requests_total", match: map[string]string{"operation": operation}}

func outcomeRate(ss []scrape, outcome string) plotter.XYs {
	s := idemRequests
	s.match = map[string]string{"operation": operation, "outcome": outcome}
	return s.rate(ss)[""]
}

// panels are the dashboard's main panels, each computed as its PromQL does.
var panels = []panel{
	{
		title:  "Repeat rate (replayed share)",
		yLabel: "% of executed + replayed",
		lines: func(ss []scrape) []line {
			replayed, executed := outcomeRate(ss, "replayed"), outcomeRate(ss, "executed")
			share := make(plotter.XYs, len(replayed))
			for i := range replayed {
				share[i] = plotter.XY{X: replayed[i].X, Y: math.NaN()}
				if total := replayed[i].Y + executed[i].Y; total > 0 {
					share[i].Y = 100 * replayed[i].Y / total
				}
			}
			return []line{{name: operation, color: palette[0], xys: share}}
		},
	},
	{
		title:   "Idempotent requests by outcome",
		yLabel:  "requests/s",
		stacked: true,
		lines: func(ss []scrape) []line {
			s := idemRequests
			s.by = "outcome"
			rates := s.rate(ss)
			var ls []line
			for _, oc := range outcomeColors {
				ls = append(ls, line{name: oc.outcome, color: oc.color, xys: rates[oc.outcome]})
			}
			return ls
		},
	},
	{
		title:  "Duplicate wait time p50 / p90 / p99",
		yLabel: "ms",
		logY:   true,
		lines: func(ss []scrape) []line {
			s := selector{family: "oncekey_idempotency_duplicate_wait_seconds"}
			var ls []line
			for i, q := range []float64{0.5, 0.9, 0.99} {
				ls = append(ls, line{name: fmt.Sprintf("p%.0f", q*100), color: palette[i], xys: scaled(s.quantile(ss, q)[""], 1000)})
			}
			return ls
		},
	},
	{
		title:  "409 conflicts and 202 in-flight per second",
		yLabel: "requests/s",
		lines: func(ss []scrape) []line {
			return []line{
				{name: "409 conflict", color: outcomeColors[3].color, xys: outcomeRate(ss, "conflict")},
				{name: "202 in flight", color: outcomeColors[4].color, xys: outcomeRate(ss, "in_flight")},
			}
		},
	},
	{
		title:  "Keys table rows by status",
		yLabel: "rows",
		lines: func(ss []scrape) []line {
			rows := selector{family: keysFamily, by: "status"}.gauge(ss)
			return []line{
				{name: "completed", color: palette[0], xys: rows["completed"]},
				{name: "processing", color: outcomeColors[4].color, xys: rows["processing"]},
			}
		},
	},
	{
		title:  "p99 latency by route",
		yLabel: "ms",
		logY:   true,
		lines: func(ss []scrape) []line {
			byRoute := selector{family: "oncekey_http_request_duration_seconds", by: "route"}.quantile(ss, 0.99)
			var ls []line
			for i, route := range []string{"/orders", "/orders/{id}", "/metrics"} {
				ls = append(ls, line{name: route, color: palette[i], xys: scaled(byRoute[route], 1000)})
			}
			return ls
		},
	},
}

func floored(xys plotter.XYs, least float64) plotter.XYs {
	out := make(plotter.XYs, len(xys))
	for i, p := range xys {
		out[i] = plotter.XY{X: p.X, Y: p.Y}
		if p.Y < least {
			out[i].Y = least
		}
	}
	return out
}

func scaled(xys plotter.XYs, by float64) plotter.XYs {
	out := make(plotter.XYs, len(xys))
	for i, p := range xys {
		out[i] = plotter.XY{X: p.X, Y: p.Y * by}
	}
	return out
}

// dashboardPanels checks that every panel drawn here has its namesake in
// the dashboard, so the picture shows the dashboard and not a cousin of it.
func dashboardPanels() ([]panel, error) {
	var d struct {
		Panels []struct {
			Title string `json:"title"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(grafana.Dashboard, &d); err != nil {
		return nil, fmt.Errorf("read the dashboard: %w", err)
	}
	titles := map[string]bool{}
	for _, p := range d.Panels {
		titles[p.Title] = true
	}
	for _, p := range panels {
		if !titles[p.title] {
			return nil, fmt.Errorf("the dashboard has no panel %q (deploy/grafana/oncekey.json)", p.title)
		}
	}
	return panels, nil
}

// render draws the panels from the scrapes into a PNG at path.
func render(path string, panels []panel, ss []scrape, duration time.Duration) error {
	rows := (len(panels) + gridCols - 1) / gridCols
	plots := make([][]*plot.Plot, rows)
	for i := range plots {
		plots[i] = make([]*plot.Plot, gridCols)
	}
	end := ss[len(ss)-1].at.Seconds()
	burstFrom, burstTo := (duration / 3).Seconds(), (2 * duration / 3).Seconds()
	for i, p := range panels {
		pl, err := p.plot(ss, end, burstFrom, burstTo)
		if err != nil {
			return fmt.Errorf("panel %q: %w", p.title, err)
		}
		plots[i/gridCols][i%gridCols] = pl
	}

	img := vgimg.NewWith(vgimg.UseWH(imageWidth, imageHeight), vgimg.UseDPI(imageDPI))
	dc := draw.New(img)
	header := text.Style{
		Color:   color.Black,
		Font:    font.From(plot.DefaultFont, 13),
		XAlign:  draw.XLeft,
		YAlign:  draw.YTop,
		Handler: plot.DefaultTextHandler,
	}
	dc.FillText(header, vg.Point{X: 12, Y: imageHeight - 8}, fmt.Sprintf(
		"Oncekey dashboard snapshot: %s of synthetic load on the in-memory store, scraped every %s; rates over %d scrapes. "+
			"Unshaded: steady traffic with a few retries.", duration, scrapeInterval, window))
	dc.FillText(header, vg.Point{X: 12, Y: imageHeight - 26}, "Shaded: an injected storm: "+
		"retries of everything, edited requests on old keys, and duplicates piled onto requests slowed to 0.3–1.8 s on purpose.")
	tiles := draw.Tiles{
		Rows: rows, Cols: gridCols,
		PadTop: 48, PadBottom: 6, PadLeft: 6, PadRight: 12,
		PadX: 18, PadY: 14,
	}
	canvases := plot.Align(plots, tiles, dc)
	for r := range plots {
		for c, pl := range plots[r] {
			if pl != nil {
				pl.Draw(canvases[r][c])
			}
		}
	}

	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
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

func (p panel) plot(ss []scrape, end, burstFrom, burstTo float64) (*plot.Plot, error) {
	pl := plot.New()
	pl.Title.Text = p.title
	pl.Title.TextStyle.Font.Size = 14
	pl.Title.Padding = 6
	pl.X.Label.Text = "seconds"
	pl.Y.Label.Text = p.yLabel
	pl.X.Min, pl.X.Max = 0, math.Ceil(end)
	pl.Y.Min = 0
	pl.Legend.Top, pl.Legend.Left = true, true
	pl.Legend.TextStyle.Font.Size = 10
	pl.Legend.XOffs, pl.Legend.YOffs = 6, -4

	ls := p.lines(ss)
	if p.stacked {
		ls = stack(ls)
	}
	top, bottom := 0.0, math.Inf(1)
	for _, l := range ls {
		for _, pt := range l.xys {
			if !math.IsNaN(pt.Y) {
				top = max(top, pt.Y)
				if pt.Y > 0 {
					bottom = min(bottom, pt.Y)
				}
			}
		}
	}
	if top == 0 {
		return nil, fmt.Errorf("no data")
	}
	// Headroom above the data for the legend in the top left corner.
	headroom := 1.15 + 0.1*float64(len(ls))
	pl.Y.Max = top * headroom
	if p.logY {
		pl.Y.Scale, pl.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
		pl.Y.Min = math.Pow(10, math.Floor(math.Log10(bottom)))
		pl.Y.Max = top * math.Pow(top/pl.Y.Min, 0.08+0.06*float64(len(ls)))
		for i := range ls {
			ls[i].xys = floored(ls[i].xys, pl.Y.Min) // a log axis has no 0
		}
	}

	shade, err := plotter.NewPolygon(plotter.XYs{{X: burstFrom, Y: pl.Y.Min}, {X: burstTo, Y: pl.Y.Min}, {X: burstTo, Y: pl.Y.Max}, {X: burstFrom, Y: pl.Y.Max}})
	if err != nil {
		return nil, err
	}
	shade.Color, shade.LineStyle.Width = burstShade, 0
	pl.Add(shade, plotter.NewGrid())

	for _, l := range ls {
		first := true
		for _, seg := range segments(l.xys) {
			ln, err := plotter.NewLine(seg)
			if err != nil {
				return nil, err
			}
			ln.Color, ln.Width = l.color, vg.Points(2)
			if p.stacked {
				ln.FillColor, ln.Width = l.color, vg.Points(1)
			}
			pl.Add(ln)
			if first {
				pl.Legend.Add(l.name, ln)
				first = false
			}
		}
	}
	return pl, nil
}

// stack turns series into the tops of stacked areas, topmost first so that
// each lower area is painted over the one above it.
func stack(ls []line) []line {
	out := make([]line, len(ls))
	var sum plotter.XYs
	for _, l := range ls {
		if len(l.xys) > len(sum) {
			sum = make(plotter.XYs, len(l.xys))
			for j, pt := range l.xys {
				sum[j].X = pt.X
			}
		}
	}
	for i, l := range ls {
		cum := make(plotter.XYs, len(sum))
		for j := range sum {
			y := 0.0
			if j < len(l.xys) && !math.IsNaN(l.xys[j].Y) {
				y = l.xys[j].Y
			}
			sum[j].Y += y
			cum[j] = sum[j]
		}
		out[len(ls)-1-i] = line{name: l.name, color: l.color, xys: cum}
	}
	return out
}

// segments splits a series at its gaps (NaN), which gonum will not draw.
func segments(xys plotter.XYs) []plotter.XYs {
	var out []plotter.XYs
	var cur plotter.XYs
	for _, pt := range xys {
		if math.IsNaN(pt.Y) {
			if len(cur) > 0 {
				out = append(out, cur)
			}
			cur = nil
			continue
		}
		cur = append(cur, pt)
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}
