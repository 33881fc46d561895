package main

import (
	"math"
	"strconv"
	"strings"
)

// A state diagram's directives. Everything is placed by hand, in pixels
// from the top left corner; a state's box is as large as its text, around
// the centre it is given:
//
//	title : TEXT                       the picture's title, centred on top
//	canvas W H                         the picture's size
//	state ID X Y : NAME\nLINE...       a state centred on X,Y: its name, a
//	                                   rule, then its lines
//	group ID X Y W H : TEXT            a dashed box, top left at X,Y, that
//	                                   edges may start or end at
//	initial ID X Y                     the start: a dot at X,Y, an arrow to ID
//	edge A -> B [dashed] [via X,Y]... [at X,Y] [ : TEXT]
//	                                   an arrow from A to B through the via
//	                                   points, its text centred at X,Y (by
//	                                   default on the middle of its path)
//	note X Y : TEXT                    text whose top left is at X,Y
//
// An edge leaves and enters a box straight when the next point lies
// beside it (within its height, or its width), so two edges between the
// same boxes can run side by side. Drawing fails, naming the line, when a
// box or a text overlaps another or leaves the canvas.

// node is a box edges join: a state, or a group of states.
type node struct {
	id         string
	line       int
	x, y, w, h float64 // the box
	text       []string
	group      bool
}

func (n *node) centre() pt { return pt{n.x + n.w/2, n.y + n.h/2} }

// edge is an arrow from one box to another.
type edge struct {
	line         int
	fromID, toID string
	from, to     *node
	via          []pt
	at           *pt
	dashed       bool
	text         []string
}

// initial is a start dot and its arrow.
type initial struct {
	line int
	toID string
	to   *node
	at   pt
}

// note is free text.
type note struct {
	line int
	at   pt
	text []string
}

// stateDiagram is a parsed state diagram.
type stateDiagram struct {
	file          string
	title         []string
	width, height float64
	canvasLine    int
	nodes         []*node
	edges         []edge
	initials      []initial
	notes         []note
}

// The state diagram's measures, in pixels.
const (
	stTitleSize = 18.0
	stNameSize  = 15.0
	stLineSize  = 12.5
	stEdgeSize  = 12.5
	stNoteSize  = 12.0
	stPadX      = 14.0
	stPadY      = 9.0
	stRuleGap   = 7.0 // above and below the rule under a state's name
	stClear     = 6.0 // the least room between two boxes or texts
)

// stateSize is the size of a state's box for its text.
func stateSize(text []string) (w, h float64) {
	w = textWidth(text[0], stNameSize, true)
	h = lineHeight(stNameSize)
	if len(text) > 1 {
		w = max(w, blockWidth(text[1:], stLineSize, false))
		h += 2*stRuleGap + float64(len(text)-1)*lineHeight(stLineSize) - 4
	}
	return w + 2*stPadX, h + 2*stPadY
}

// parseStates reads a state diagram's directives.
func parseStates(file string, ds []directive) (*stateDiagram, error) {
	sd := &stateDiagram{file: file}
	byID := map[string]*node{}
	number := func(d directive, s, what string) (float64, error) {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v < 0 || math.IsInf(v, 0) {
			return 0, errorf(file, d.line, "%s %q is not a number of pixels", what, s)
		}
		return v, nil
	}
	point := func(d directive, s, what string) (pt, error) {
		xs, ys, ok := strings.Cut(s, ",")
		if !ok {
			return pt{}, errorf(file, d.line, "%s %q is not a point X,Y", what, s)
		}
		x, err := number(d, xs, what+" x")
		if err != nil {
			return pt{}, err
		}
		y, err := number(d, ys, what+" y")
		return pt{x, y}, err
	}
	declare := func(d directive, n *node) error {
		if _, dup := byID[n.id]; dup {
			return errorf(file, d.line, "%q declared twice", n.id)
		}
		byID[n.id] = n
		sd.nodes = append(sd.nodes, n)
		return nil
	}
	for _, d := range ds {
		w := d.words
		if len(w) == 0 {
			return nil, errorf(file, d.line, "a line without a directive")
		}
		var nums [4]float64
		numbers := func(from int, what ...string) error {
			for i, name := range what {
				v, err := number(d, w[from+i], name)
				if err != nil {
					return err
				}
				nums[i] = v
			}
			return nil
		}
		switch w[0] {
		case "title":
			if err := d.shape(file, 1, true); err != nil {
				return nil, err
			}
			sd.title = d.text
		case "canvas":
			if err := d.shape(file, 3, false); err != nil {
				return nil, err
			}
			if err := numbers(1, "width", "height"); err != nil {
				return nil, err
			}
			sd.width, sd.height, sd.canvasLine = nums[0], nums[1], d.line
		case "state":
			if err := d.shape(file, 4, true); err != nil {
				return nil, err
			}
			if err := numbers(2, "x", "y"); err != nil {
				return nil, err
			}
			bw, bh := stateSize(d.text)
			if err := declare(d, &node{id: w[1], line: d.line, x: nums[0] - bw/2, y: nums[1] - bh/2, w: bw, h: bh, text: d.text}); err != nil {
				return nil, err
			}
		case "group":
			if err := d.shape(file, 6, true); err != nil {
				return nil, err
			}
			if err := numbers(2, "x", "y", "width", "height"); err != nil {
				return nil, err
			}
			if err := declare(d, &node{id: w[1], line: d.line, x: nums[0], y: nums[1], w: nums[2], h: nums[3], text: d.text, group: true}); err != nil {
				return nil, err
			}
		case "initial":
			if err := d.shape(file, 4, false); err != nil {
				return nil, err
			}
			if err := numbers(2, "x", "y"); err != nil {
				return nil, err
			}
			sd.initials = append(sd.initials, initial{line: d.line, toID: w[1], at: pt{nums[0], nums[1]}})
		case "note":
			if err := d.shape(file, 3, true); err != nil {
				return nil, err
			}
			if err := numbers(1, "x", "y"); err != nil {
				return nil, err
			}
			sd.notes = append(sd.notes, note{line: d.line, at: pt{nums[0], nums[1]}, text: d.text})
		case "edge":
			if len(w) < 4 || w[2] != "->" {
				return nil, errorf(file, d.line, "an edge is \"edge A -> B [dashed] [via X,Y]... [at X,Y] [ : TEXT]\"")
			}
			e := edge{line: d.line, fromID: w[1], toID: w[3], text: d.text}
			for i := 4; i < len(w); i++ {
				switch w[i] {
				case "dashed":
					e.dashed = true
				case "via", "at":
					if i+1 == len(w) {
						return nil, errorf(file, d.line, "%s needs a point X,Y after it", w[i])
					}
					p, err := point(d, w[i+1], w[i])
					if err != nil {
						return nil, err
					}
					if w[i] == "via" {
						e.via = append(e.via, p)
					} else {
						e.at = &p
					}
					i++
				default:
					return nil, errorf(file, d.line, "unknown edge option %q (want dashed, via X,Y or at X,Y)", w[i])
				}
			}
			if e.at != nil && e.text == nil {
				return nil, errorf(file, d.line, "at places an edge's text, and this edge has none")
			}
			sd.edges = append(sd.edges, e)
		default:
			return nil, errorf(file, d.line, "unknown directive %q (want title, canvas, state, group, initial, edge or note)", w[0])
		}
	}
	// Edges are resolved once every box is declared, so that one may come
	// before the boxes it joins.
	lookup := func(line int, id string) (*node, error) {
		n, ok := byID[id]
		if !ok {
			return nil, errorf(file, line, "unknown state or group %q", id)
		}
		return n, nil
	}
	var err error
	for i := range sd.initials {
		in := &sd.initials[i]
		if in.to, err = lookup(in.line, in.toID); err != nil {
			return nil, err
		}
	}
	for i := range sd.edges {
		e := &sd.edges[i]
		if e.from, err = lookup(e.line, e.fromID); err != nil {
			return nil, err
		}
		if e.to, err = lookup(e.line, e.toID); err != nil {
			return nil, err
		}
	}
	if sd.width == 0 || sd.height == 0 {
		return nil, errorf(file, 0, "no canvas: say how large the picture is with canvas W H")
	}
	return sd, nil
}

// rect is an area of the picture, for the overlap checks.
type rect struct {
	x0, y0, x1, y1 float64
	what           string
	line           int
}

func (r rect) overlaps(o rect) bool {
	return r.x0 < o.x1+stClear && o.x0 < r.x1+stClear && r.y0 < o.y1+stClear && o.y0 < r.y1+stClear
}

func (r rect) inside(w, h float64) bool { return r.x0 >= 0 && r.y0 >= 0 && r.x1 <= w && r.y1 <= h }

// attach is where a line toward p leaves or enters box n: straight out of
// the side p lies beside, else on the line to n's centre.
func attach(n *node, p pt) pt {
	const inset = 4
	x0, y0, x1, y1 := n.x, n.y, n.x+n.w, n.y+n.h
	switch {
	case p.y >= y0+inset && p.y <= y1-inset && p.x > x1:
		return pt{x1, p.y}
	case p.y >= y0+inset && p.y <= y1-inset && p.x < x0:
		return pt{x0, p.y}
	case p.x >= x0+inset && p.x <= x1-inset && p.y < y0:
		return pt{p.x, y0}
	case p.x >= x0+inset && p.x <= x1-inset && p.y > y1:
		return pt{p.x, y1}
	}
	c := n.centre()
	dx, dy := p.x-c.x, p.y-c.y
	t := math.Inf(1)
	if dx != 0 {
		t = min(t, (n.w/2)/math.Abs(dx))
	}
	if dy != 0 {
		t = min(t, (n.h/2)/math.Abs(dy))
	}
	return pt{c.x + dx*t, c.y + dy*t}
}

func (n *node) contains(p pt) bool {
	return p.x > n.x && p.x < n.x+n.w && p.y > n.y && p.y < n.y+n.h
}

// path is an edge's polyline, from box to box.
func (e edge) path() []pt {
	first, last := e.to.centre(), e.from.centre()
	if len(e.via) > 0 {
		first, last = e.via[0], e.via[len(e.via)-1]
	}
	points := append([]pt{attach(e.from, first)}, e.via...)
	return append(points, attach(e.to, last))
}

// labelBox is where an edge's text goes: centred on at, or on the middle
// of the path's middle segment.
func (e edge) labelBox(path []pt) (c pt, w, h float64) {
	if e.at != nil {
		c = *e.at
	} else {
		k := (len(path) - 1) / 2
		c = pt{(path[k].x + path[k+1].x) / 2, (path[k].y + path[k+1].y) / 2}
	}
	w = blockWidth(e.text, stEdgeSize, false) + 8
	h = float64(len(e.text))*lineHeight(stEdgeSize) + 2
	return c, w, h
}

func noteBox(n note) rect {
	w := blockWidth(n.text, stNoteSize, false)
	return rect{n.at.x, n.at.y, n.at.x + w, n.at.y + float64(len(n.text))*lineHeight(stNoteSize), "a note", n.line}
}

// check refuses a picture whose boxes or texts overlap or leave the
// canvas, naming the source line of the later one.
func (sd *stateDiagram) check() error {
	var placed []rect
	add := func(r rect) error {
		if !r.inside(sd.width, sd.height) {
			return errorf(sd.file, r.line, "%s leaves the canvas (%s by %s, line %d): it spans %s,%s to %s,%s",
				r.what, num(sd.width), num(sd.height), sd.canvasLine, num(r.x0), num(r.y0), num(r.x1), num(r.y1))
		}
		for _, o := range placed {
			if r.overlaps(o) {
				return errorf(sd.file, r.line, "%s overlaps %s (line %d)", r.what, o.what, o.line)
			}
		}
		placed = append(placed, r)
		return nil
	}
	for _, n := range sd.nodes {
		r := rect{n.x, n.y, n.x + n.w, n.y + n.h, "state " + n.id, n.line}
		if n.group {
			// A group holds states: only its label must keep clear.
			r = rect{n.x + 8, n.y + 6, n.x + 8 + blockWidth(n.text, stEdgeSize, true), n.y + 6 + float64(len(n.text))*lineHeight(stEdgeSize), "the text of group " + n.id, n.line}
			if !(rect{n.x, n.y, n.x + n.w, n.y + n.h, "group " + n.id, n.line}).inside(sd.width, sd.height) {
				return errorf(sd.file, n.line, "group %s leaves the canvas", n.id)
			}
		}
		if err := add(r); err != nil {
			return err
		}
	}
	for _, e := range sd.edges {
		for _, p := range e.via {
			for _, n := range sd.nodes {
				if !n.group && n.contains(p) {
					return errorf(sd.file, e.line, "the edge %s -> %s passes through %s,%s, inside state %s", e.from.id, e.to.id, num(p.x), num(p.y), n.id)
				}
			}
		}
		if e.text == nil {
			continue
		}
		c, w, h := e.labelBox(e.path())
		if err := add(rect{c.x - w/2, c.y - h/2, c.x + w/2, c.y + h/2, "the text of the edge " + e.from.id + " -> " + e.to.id, e.line}); err != nil {
			return err
		}
	}
	for _, n := range sd.notes {
		if err := add(noteBox(n)); err != nil {
			return err
		}
	}
	return nil
}

// draw checks the placement and draws the diagram.
func (sd *stateDiagram) draw() ([]byte, error) {
	if err := sd.check(); err != nil {
		return nil, err
	}
	s := newSVG(sd.width, sd.height, joinLines(sd.title))
	for k, l := range sd.title {
		s.text(sd.width/2, 20+ascent(stTitleSize)+float64(k)*lineHeight(stTitleSize), l, textStyle{size: stTitleSize, bold: true, anchor: "middle", color: colorInk})
	}
	for _, n := range sd.nodes {
		if !n.group {
			continue
		}
		s.rect(n.x, n.y, n.w, n.h, 10, colorFrame, stroke{color: colorFrameIn, width: 1.2, dashed: true})
		for k, l := range n.text {
			s.text(n.x+8, n.y+6+ascent(stEdgeSize)+float64(k)*lineHeight(stEdgeSize), l, textStyle{size: stEdgeSize, bold: true, color: colorFrameIn})
		}
	}
	for _, e := range sd.edges {
		path := e.path()
		color := colorInk
		if e.dashed {
			color = colorFaint
		}
		// The line stops short of the tip, so that its end does not
		// blunt the head.
		tip, before := path[len(path)-1], path[len(path)-2]
		d := math.Hypot(tip.x-before.x, tip.y-before.y)
		line := append([]pt(nil), path...)
		if d > 8 {
			line[len(line)-1] = pt{tip.x - (tip.x-before.x)/d*8, tip.y - (tip.y-before.y)/d*8}
		}
		s.polyline(line, stroke{color: color, width: 1.4, dashed: e.dashed})
		s.arrowHead(before, tip, color)
	}
	for _, in := range sd.initials {
		s.circle(in.at, 7, colorInk)
		tip := attach(in.to, in.at)
		d := math.Hypot(tip.x-in.at.x, tip.y-in.at.y)
		start := pt{in.at.x + (tip.x-in.at.x)/d*7, in.at.y + (tip.y-in.at.y)/d*7}
		end := pt{tip.x - (tip.x-in.at.x)/d*8, tip.y - (tip.y-in.at.y)/d*8}
		s.polyline([]pt{start, end}, stroke{color: colorInk, width: 1.4})
		s.arrowHead(in.at, tip, colorInk)
	}
	for _, n := range sd.nodes {
		if n.group {
			continue
		}
		s.rect(n.x, n.y, n.w, n.h, 8, colorBoxFill, stroke{color: colorBoxLine, width: 1.5})
		c := n.centre()
		y := n.y + stPadY + ascent(stNameSize)
		s.text(c.x, y, n.text[0], textStyle{size: stNameSize, bold: true, anchor: "middle", color: colorInk})
		if len(n.text) == 1 {
			continue
		}
		rule := n.y + stPadY + lineHeight(stNameSize) + stRuleGap - 3
		s.polyline([]pt{{n.x, rule}, {n.x + n.w, rule}}, stroke{color: colorBoxLine, width: 0.8})
		y = rule + stRuleGap + ascent(stLineSize) - 1
		for _, l := range n.text[1:] {
			s.text(c.x, y, l, textStyle{size: stLineSize, anchor: "middle", color: colorInk})
			y += lineHeight(stLineSize)
		}
	}
	for _, e := range sd.edges {
		if e.text == nil {
			continue
		}
		c, w, h := e.labelBox(e.path())
		s.plainRect(c.x-w/2, c.y-h/2, w, h, colorPaper)
		y := c.y - h/2 + 1 + ascent(stEdgeSize) - 1
		for _, l := range e.text {
			s.text(c.x, y, l, textStyle{size: stEdgeSize, anchor: "middle", color: colorInk})
			y += lineHeight(stEdgeSize)
		}
	}
	for _, n := range sd.notes {
		for k, l := range n.text {
			s.text(n.at.x, n.at.y+ascent(stNoteSize)+float64(k)*lineHeight(stNoteSize), l, textStyle{size: stNoteSize, color: colorMuted})
		}
	}
	return s.bytes(), nil
}
