package main

import (
	"math"
	"strings"
)

// A sequence diagram's directives, in the order they are drawn from top to
// bottom (participants first, left to right):
//
//	title : TEXT                  the picture's title
//	participant ID : NAME\nSUB    a lane: its name, and lines under it
//	A -> B : TEXT                 a message from lane A to lane B
//	A --> B : TEXT                a reply (dashed)
//	note ID : TEXT                a note on lane ID
//	section : TEXT                a band across the lanes that starts a part
//	frame : TEXT                  a frame around what follows, up to end
//	end                           the frame's end (frames do not nest)
//	activate ID                   lane ID runs from the last message on
//	deactivate ID                 until the last message
//	footer : TEXT                 a line under the picture
//
// Lanes are placed as close as their labels allow: a message's text fits
// between the lanes it joins, a note's between its lane's neighbours.

// participant is a lane.
type participant struct {
	id   string
	text []string // the name, then the lines under it
}

// seqKind is what an item of a sequence is.
type seqKind int

const (
	seqMessage seqKind = iota
	seqNote
	seqSection
	seqFrame
	seqEnd
	seqActivate
	seqDeactivate
)

// seqItem is one directive of a sequence after its participants.
type seqItem struct {
	kind     seqKind
	from, to int // lanes; a note's, an activation's lane is from
	reply    bool
	text     []string
}

// sequence is a parsed sequence diagram.
type sequence struct {
	title  []string
	parts  []participant
	items  []seqItem
	footer []string
}

// parseSequence reads a sequence diagram's directives.
func parseSequence(file string, ds []directive) (*sequence, error) {
	seq := &sequence{}
	lanes := map[string]int{}
	lane := func(d directive, id string) (int, error) {
		i, ok := lanes[id]
		if !ok {
			return 0, errorf(file, d.line, "unknown participant %q (declare it with participant %s : NAME)", id, id)
		}
		return i, nil
	}
	var inFrame bool
	active := map[int]bool{}
	messages := 0
	for _, d := range ds {
		w := d.words
		if len(w) == 0 {
			return nil, errorf(file, d.line, "a line without a directive")
		}
		if len(w) == 3 && (w[1] == "->" || w[1] == "-->") {
			from, err := lane(d, w[0])
			if err != nil {
				return nil, err
			}
			to, err := lane(d, w[2])
			if err != nil {
				return nil, err
			}
			if from == to {
				return nil, errorf(file, d.line, "a message from %s to itself: use a note", w[0])
			}
			if d.text == nil {
				return nil, errorf(file, d.line, "a message needs its text after \" : \"")
			}
			seq.items = append(seq.items, seqItem{kind: seqMessage, from: from, to: to, reply: w[1] == "-->", text: d.text})
			messages++
			continue
		}
		switch w[0] {
		case "title":
			if err := d.shape(file, 1, true); err != nil {
				return nil, err
			}
			seq.title = d.text
		case "participant":
			if err := d.shape(file, 2, true); err != nil {
				return nil, err
			}
			if len(seq.items) > 0 {
				return nil, errorf(file, d.line, "participants come before the first message, note or section")
			}
			if _, dup := lanes[w[1]]; dup {
				return nil, errorf(file, d.line, "participant %q declared twice", w[1])
			}
			lanes[w[1]] = len(seq.parts)
			seq.parts = append(seq.parts, participant{id: w[1], text: d.text})
		case "note":
			if err := d.shape(file, 2, true); err != nil {
				return nil, err
			}
			i, err := lane(d, w[1])
			if err != nil {
				return nil, err
			}
			seq.items = append(seq.items, seqItem{kind: seqNote, from: i, text: d.text})
		case "section", "frame":
			if err := d.shape(file, 1, true); err != nil {
				return nil, err
			}
			if inFrame {
				return nil, errorf(file, d.line, "%s inside a frame: end the frame first", w[0])
			}
			kind := seqSection
			if w[0] == "frame" {
				kind, inFrame = seqFrame, true
			}
			seq.items = append(seq.items, seqItem{kind: kind, text: d.text})
		case "end":
			if err := d.shape(file, 1, false); err != nil {
				return nil, err
			}
			if !inFrame {
				return nil, errorf(file, d.line, "end without a frame")
			}
			inFrame = false
			seq.items = append(seq.items, seqItem{kind: seqEnd})
		case "activate", "deactivate":
			if err := d.shape(file, 2, false); err != nil {
				return nil, err
			}
			i, err := lane(d, w[1])
			if err != nil {
				return nil, err
			}
			if messages == 0 {
				return nil, errorf(file, d.line, "%s before any message: it starts or ends at the last message", w[0])
			}
			if active[i] == (w[0] == "activate") {
				return nil, errorf(file, d.line, "%s %s: it is already %sd", w[0], w[1], w[0])
			}
			active[i] = w[0] == "activate"
			kind := seqActivate
			if w[0] == "deactivate" {
				kind = seqDeactivate
			}
			seq.items = append(seq.items, seqItem{kind: kind, from: i})
		case "footer":
			if err := d.shape(file, 1, true); err != nil {
				return nil, err
			}
			seq.footer = append(seq.footer, d.text...)
		default:
			return nil, errorf(file, d.line, "unknown directive %q (want title, participant, A -> B, A --> B, note, section, frame, end, activate, deactivate or footer)", w[0])
		}
	}
	last := 0
	if len(ds) > 0 {
		last = ds[len(ds)-1].line
	}
	switch {
	case len(seq.parts) < 2:
		return nil, errorf(file, last, "a sequence needs at least two participants")
	case inFrame:
		return nil, errorf(file, last, "a frame without its end")
	}
	for i, p := range seq.parts {
		if active[i] {
			return nil, errorf(file, last, "%s is still active at the end: deactivate it", p.id)
		}
	}
	return seq, nil
}

// The sequence diagram's measures, in pixels.
const (
	seqMargin     = 24.0
	seqTitleSize  = 18.0
	seqNameSize   = 14.0
	seqSubSize    = 12.0
	seqMsgSize    = 13.0
	seqNoteSize   = 12.5
	seqFooterSize = 12.0
	seqHeadPadX   = 14.0
	seqHeadPadY   = 8.0
	seqLaneGap    = 28.0 // between two lanes' heads
	seqLabelPad   = 14.0 // between a message's text and the lanes it joins
	seqNotePadX   = 10.0
	seqNotePadY   = 7.0
	seqNoteGap    = 12.0 // between a note and a neighbouring lane
	seqActHalf    = 5.0  // half an activation bar's width
	seqBandHeight = 24.0
	seqTabHeight  = 22.0
)

// head is a lane's head box: its size.
func (p participant) head() (w, h float64) {
	w = textWidth(p.text[0], seqNameSize, true)
	h = lineHeight(seqNameSize)
	for _, l := range p.text[1:] {
		w = max(w, textWidth(l, seqSubSize, false))
		h += lineHeight(seqSubSize)
	}
	return w + 2*seqHeadPadX, h + 2*seqHeadPadY
}

func noteSize(text []string) (w, h float64) {
	return blockWidth(text, seqNoteSize, false) + 2*seqNotePadX, float64(len(text))*lineHeight(seqNoteSize) + 2*seqNotePadY
}

// lanes places the lanes: each as far left as every message, note and head
// between it and a lane to its left allows.
func (seq *sequence) lanes() (xs []float64, left, right float64) {
	n := len(seq.parts)
	// need[i][j], i < j: how far lane j must be right of lane i.
	need := make([][]float64, n)
	for i := range need {
		need[i] = make([]float64, n)
	}
	heads := make([]float64, n)
	reach := make([]float64, n) // how far a lane's head or notes reach either side
	for i, p := range seq.parts {
		w, _ := p.head()
		heads[i] = w
		reach[i] = w / 2
	}
	for i := 1; i < n; i++ {
		need[i-1][i] = (heads[i-1]+heads[i])/2 + seqLaneGap
	}
	for _, it := range seq.items {
		switch it.kind {
		case seqMessage:
			a, b := min(it.from, it.to), max(it.from, it.to)
			need[a][b] = max(need[a][b], blockWidth(it.text, seqMsgSize, false)+2*seqLabelPad+2*seqActHalf)
		case seqNote:
			w, _ := noteSize(it.text)
			i := it.from
			reach[i] = max(reach[i], w/2)
			if i > 0 {
				need[i-1][i] = max(need[i-1][i], w/2+seqNoteGap+seqActHalf)
			}
			if i < n-1 {
				need[i][i+1] = max(need[i][i+1], w/2+seqNoteGap+seqActHalf)
			}
		}
	}
	xs = make([]float64, n)
	xs[0] = seqMargin + reach[0]
	for j := 1; j < n; j++ {
		for i := range j {
			xs[j] = max(xs[j], xs[i]+need[i][j])
		}
	}
	left, right = seqMargin, xs[n-1]+reach[n-1]
	for i := range n {
		left = min(left, xs[i]-reach[i])
		right = max(right, xs[i]+reach[i])
	}
	return xs, left, right
}

// activation is a lane's bar, from y0 to y1.
type activation struct {
	lane   int
	y0, y1 float64
}

// draw lays the diagram out and draws it.
func (seq *sequence) draw() []byte {
	xs, left, right := seq.lanes()
	titleW := blockWidth(seq.title, seqTitleSize, true)
	footerW := blockWidth(seq.footer, seqFooterSize, false)
	width := math.Ceil(max(right-left, titleW, footerW) + 2*seqMargin)
	// The lanes go in the middle of a picture that their title or footer
	// may widen; the footer starts where they do, or at the margin.
	shift := seqMargin + (width-2*seqMargin-(right-left))/2 - left
	for i := range xs {
		xs[i] += shift
	}
	left, right = left+shift, right+shift
	footerX := min(left, (width-footerW)/2)

	// First pass: the vertical place of everything.
	y := seqMargin
	titleTop := y
	y += float64(len(seq.title)) * lineHeight(seqTitleSize)
	if len(seq.title) > 0 {
		y += 12
	}
	headTop := y
	var headH float64
	for _, p := range seq.parts {
		_, h := p.head()
		headH = max(headH, h)
	}
	y += headH + 18
	ys := make([]float64, len(seq.items)) // each item's anchor
	var acts []activation
	open := map[int]float64{}
	var lastArrow float64
	frameTop := 0.0
	type box struct{ top, bottom float64 }
	frames := map[int]box{} // by the frame item's index
	frameAt := -1
	for i, it := range seq.items {
		switch it.kind {
		case seqMessage:
			y += float64(len(it.text)) * lineHeight(seqMsgSize)
			ys[i] = y + 4
			lastArrow = ys[i]
			y = ys[i] + 16
		case seqNote:
			_, h := noteSize(it.text)
			ys[i] = y + 2
			y = ys[i] + h + 14
		case seqSection:
			y += 8
			ys[i] = y
			y += seqBandHeight + 12
		case seqFrame:
			frameTop, frameAt = y+2, i
			ys[i] = frameTop
			y = frameTop + seqTabHeight + 12
		case seqEnd:
			y += 2
			frames[frameAt] = box{frameTop, y}
			y += 14
		case seqActivate:
			open[it.from] = lastArrow
		case seqDeactivate:
			acts = append(acts, activation{lane: it.from, y0: open[it.from], y1: lastArrow})
			delete(open, it.from)
		}
	}
	lifeEnd := y + 4
	y = lifeEnd + 16
	footerTop := y
	y += float64(len(seq.footer)) * lineHeight(seqFooterSize)
	height := math.Ceil(y + seqMargin - 10)

	s := newSVG(width, height, joinLines(seq.title))
	for k, l := range seq.title {
		s.text(width/2, titleTop+ascent(seqTitleSize)+float64(k)*lineHeight(seqTitleSize), l, textStyle{size: seqTitleSize, bold: true, anchor: "middle", color: colorInk})
	}
	// Frames first, under everything but their tabs, which go over the
	// lifelines.
	for i, it := range seq.items {
		if it.kind == seqFrame {
			f := frames[i]
			s.rect(left, f.top, right-left, f.bottom-f.top, 6, colorFrame, stroke{color: colorFrameIn, width: 1.2})
		}
	}
	// Lifelines and heads.
	for i, p := range seq.parts {
		w, _ := p.head()
		s.polyline([]pt{{xs[i], headTop + headH}, {xs[i], lifeEnd}}, stroke{color: colorLine, width: 1.2, dashed: true})
		s.rect(xs[i]-w/2, headTop, w, headH, 6, colorBoxFill, stroke{color: colorBoxLine, width: 1.4})
		_, h := p.head()
		ty := headTop + (headH-h)/2 + seqHeadPadY + ascent(seqNameSize)
		s.text(xs[i], ty, p.text[0], textStyle{size: seqNameSize, bold: true, anchor: "middle", color: colorInk})
		ty += lineHeight(seqNameSize) - 1
		for _, l := range p.text[1:] {
			s.text(xs[i], ty, l, textStyle{size: seqSubSize, anchor: "middle", color: colorMuted})
			ty += lineHeight(seqSubSize)
		}
	}
	for i, it := range seq.items {
		if it.kind != seqFrame {
			continue
		}
		top := frames[i].top
		tabW := textWidth(it.text[0], seqMsgSize, true) + 24
		s.polygon([]pt{{left, top}, {left + tabW, top}, {left + tabW, top + seqTabHeight - 7}, {left + tabW - 7, top + seqTabHeight}, {left, top + seqTabHeight}},
			"#e4defa", stroke{color: colorFrameIn, width: 1.2})
		s.text(left+10, top+seqTabHeight-6.5, it.text[0], textStyle{size: seqMsgSize, bold: true, color: colorFrameIn})
	}
	for _, a := range acts {
		s.rect(xs[a.lane]-seqActHalf, a.y0, 2*seqActHalf, a.y1-a.y0, 0, "#dbe7f7", stroke{color: colorBoxLine, width: 1})
	}
	// activeAt: whether lane's bar covers y, so that an arrow stops at it.
	activeAt := func(lane int, y float64) bool {
		for _, a := range acts {
			if a.lane == lane && y >= a.y0-0.5 && y <= a.y1+0.5 {
				return true
			}
		}
		return false
	}
	inFrame := false
	for i, it := range seq.items {
		bg := colorPaper
		if inFrame {
			bg = colorFrame
		}
		switch it.kind {
		case seqFrame:
			inFrame = true
		case seqEnd:
			inFrame = false
		case seqSection:
			s.rect(left, ys[i], right-left, seqBandHeight, 4, "#f1f3f6", stroke{color: "#d5d9e0", width: 1})
			s.text(left+10, ys[i]+seqBandHeight/2+ascent(seqMsgSize)/2-1, it.text[0], textStyle{size: seqMsgSize, bold: true, color: colorInk})
		case seqNote:
			w, h := noteSize(it.text)
			x0 := xs[it.from] - w/2
			fold := 8.0
			s.polygon([]pt{{x0, ys[i]}, {x0 + w - fold, ys[i]}, {x0 + w, ys[i] + fold}, {x0 + w, ys[i] + h}, {x0, ys[i] + h}},
				colorNoteFill, stroke{color: colorNoteLine, width: 1})
			for k, l := range it.text {
				s.text(x0+seqNotePadX, ys[i]+seqNotePadY+ascent(seqNoteSize)+float64(k)*lineHeight(seqNoteSize), l, textStyle{size: seqNoteSize, color: colorInk})
			}
		case seqMessage:
			y := ys[i]
			x0, x1 := xs[it.from], xs[it.to]
			dir := 1.0
			if x1 < x0 {
				dir = -1
			}
			if activeAt(it.from, y) {
				x0 += dir * seqActHalf
			}
			if activeAt(it.to, y) {
				x1 -= dir * seqActHalf
			}
			s.polyline([]pt{{x0, y}, {x1 - dir*8, y}}, stroke{color: colorInk, width: 1.4, dashed: it.reply})
			s.arrowHead(pt{x0, y}, pt{x1, y}, colorInk)
			mid := (xs[it.from] + xs[it.to]) / 2
			lh := lineHeight(seqMsgSize)
			w := blockWidth(it.text, seqMsgSize, false)
			top := y - 7 - float64(len(it.text)-1)*lh - ascent(seqMsgSize)
			s.plainRect(mid-w/2-3, top-1, w+6, float64(len(it.text)-1)*lh+ascent(seqMsgSize)+5, bg)
			for k, l := range it.text {
				s.text(mid, y-7-float64(len(it.text)-1-k)*lh, l, textStyle{size: seqMsgSize, anchor: "middle", color: colorInk})
			}
		}
	}
	for k, l := range seq.footer {
		s.text(footerX, footerTop+ascent(seqFooterSize)+float64(k)*lineHeight(seqFooterSize), l, textStyle{size: seqFooterSize, color: colorMuted})
	}
	return s.bytes()
}

// joinLines is a block of text as one line, for a title element.
func joinLines(lines []string) string { return strings.Join(lines, " ") }
