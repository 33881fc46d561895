package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// The palette, shared by both kinds of picture.
const (
	colorInk      = "#1f2937" // text, arrows
	colorMuted    = "#4b5563" // secondary text
	colorLine     = "#9ca3af" // lifelines, dividers
	colorBoxFill  = "#eef4fb" // participants, states
	colorBoxLine  = "#3b5b85"
	colorNoteFill = "#fff8dc"
	colorNoteLine = "#c8b26a"
	colorFrame    = "#f5f3ff" // a frame's or a group's fill
	colorFrameIn  = "#6d5bb0"
	colorFaint    = "#6b7280" // dashed edges
	colorPaper    = "#ffffff"
)

// pt is a point of the picture, in pixels.
type pt struct{ x, y float64 }

// svg writes one SVG document. Every number goes through num, and nothing
// is written in map order, so that one source always gives the same bytes.
type svg struct {
	b strings.Builder
}

// newSVG starts a document w by h pixels on white paper, titled for
// screen readers.
func newSVG(w, h float64, title string) *svg {
	s := &svg{}
	s.printf(`<svg xmlns="http://www.w3.org/2000/svg" width="%s" height="%s" viewBox="0 0 %s %s" font-family="%s" font-size="13">`+"\n",
		num(w), num(h), num(w), num(h), sansFamily)
	s.printf("<title>%s</title>\n", esc(plain(title)))
	s.printf("<style>.code { font-family: %s; }</style>\n", monoFamily)
	s.printf(`<rect width="%s" height="%s" fill="%s"/>`+"\n", num(w), num(h), colorPaper)
	return s
}

func (s *svg) printf(format string, args ...any) { fmt.Fprintf(&s.b, format, args...) }

// bytes ends the document.
func (s *svg) bytes() []byte {
	s.printf("</svg>\n")
	return []byte(s.b.String())
}

// stroke is how a line or an outline is drawn.
type stroke struct {
	color  string
	width  float64
	dashed bool
}

func (st stroke) attrs() string {
	a := fmt.Sprintf(` stroke="%s" stroke-width="%s"`, st.color, num(st.width))
	if st.dashed {
		a += ` stroke-dasharray="6 4"`
	}
	return a
}

func (s *svg) rect(x, y, w, h, radius float64, fill string, st stroke) {
	s.printf(`<rect x="%s" y="%s" width="%s" height="%s" rx="%s" fill="%s"%s/>`+"\n",
		num(x), num(y), num(w), num(h), num(radius), fill, st.attrs())
}

// plainRect is a rectangle without an outline: a label's backing.
func (s *svg) plainRect(x, y, w, h float64, fill string) {
	s.printf(`<rect x="%s" y="%s" width="%s" height="%s" fill="%s"/>`+"\n", num(x), num(y), num(w), num(h), fill)
}

func (s *svg) polyline(points []pt, st stroke) {
	s.printf(`<polyline points="%s" fill="none"%s stroke-linejoin="round"/>`+"\n", pointList(points), st.attrs())
}

func (s *svg) polygon(points []pt, fill string, st stroke) {
	s.printf(`<polygon points="%s" fill="%s"%s/>`+"\n", pointList(points), fill, st.attrs())
}

func (s *svg) circle(c pt, r float64, fill string) {
	s.printf(`<circle cx="%s" cy="%s" r="%s" fill="%s"/>`+"\n", num(c.x), num(c.y), num(r), fill)
}

// arrowHead draws a filled head at tip, pointing away from from.
func (s *svg) arrowHead(from, tip pt, color string) {
	const length, half = 10.0, 4.5
	dx, dy := tip.x-from.x, tip.y-from.y
	d := math.Hypot(dx, dy)
	if d == 0 {
		return
	}
	ux, uy := dx/d, dy/d
	base := pt{tip.x - ux*length, tip.y - uy*length}
	s.polygon([]pt{tip, {base.x - uy*half, base.y + ux*half}, {base.x + uy*half, base.y - ux*half}}, color, stroke{color: color, width: 1})
}

// textStyle is how a line of text is set.
type textStyle struct {
	size   float64
	bold   bool
	anchor string // start, middle or end
	color  string
}

// text sets one line with its baseline at y, anchored at x; its code spans
// (between backticks) in the monospaced font.
func (s *svg) text(x, y float64, line string, ts textStyle) {
	s.printf(`<text x="%s" y="%s" font-size="%s"`, num(x), num(y), num(ts.size))
	if ts.bold {
		s.printf(` font-weight="bold"`)
	}
	if ts.anchor != "" && ts.anchor != "start" {
		s.printf(` text-anchor="%s"`, ts.anchor)
	}
	s.printf(` fill="%s">`, ts.color)
	for _, sp := range spans(line) {
		// SVG collapses a run of spaces into one; a no-break space after
		// each keeps the run as wide as it was measured.
		t := esc(strings.ReplaceAll(sp.text, "  ", " \u00a0"))
		if sp.code {
			s.printf(`<tspan class="code">%s</tspan>`, t)
		} else {
			s.printf("%s", t)
		}
	}
	s.printf("</text>\n")
}

// lineHeight is the distance between the baselines of two lines set at
// size.
func lineHeight(size float64) float64 { return math.Round(size * 1.4) }

// ascent is how far above its baseline a line set at size reaches, about:
// where a block's first baseline goes below its top.
func ascent(size float64) float64 { return math.Round(size * 0.95) }

// num writes a coordinate: rounded to a tenth of a pixel, without a
// trailing zero or a negative zero.
func num(v float64) string {
	r := math.Round(v*10) / 10
	if r == 0 {
		r = 0
	}
	return strconv.FormatFloat(r, 'f', -1, 64)
}

func pointList(points []pt) string {
	parts := make([]string, len(points))
	for i, p := range points {
		parts[i] = num(p.x) + "," + num(p.y)
	}
	return strings.Join(parts, " ")
}

var escaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;")

func esc(s string) string { return escaper.Replace(s) }

// plain is text without its backticks, for the document's title.
func plain(s string) string { return strings.ReplaceAll(s, "`", "") }
