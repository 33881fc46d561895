package main

import (
	"strings"
)

// The fonts the pictures name, widest first in what they are measured by:
// a viewer draws them in the first one it has. Text is measured with
// DejaVu Sans's advance widths, the widest of the usual sans-serif fonts
// (Linux's default; Helvetica, Arial and Liberation Sans are narrower), so
// that a label fits its box in any of them.
const (
	sansFamily = `Helvetica, Arial, 'Liberation Sans', 'DejaVu Sans', sans-serif`
	monoFamily = `'DejaVu Sans Mono', Menlo, Consolas, 'Liberation Mono', monospace`
)

// sansWidths and sansBoldWidths are DejaVu Sans's and DejaVu Sans Bold's
// advance widths of the printable ASCII characters, from ' ' (32) to '~'
// (126), in thousandths of an em (read from the fonts' hmtx tables).
var sansWidths = [95]int{
	317, 400, 459, 837, 636, 950, 779, 274, 390, 390, 500, 837, 317, 360, 317, 336,
	636, 636, 636, 636, 636, 636, 636, 636, 636, 636, 336, 336, 837, 837, 837, 530,
	1000, 684, 686, 698, 770, 631, 575, 774, 751, 294, 294, 655, 557, 862, 748, 787,
	603, 787, 694, 634, 610, 731, 684, 988, 685, 610, 685, 390, 336, 390, 837, 500,
	500, 612, 634, 549, 634, 615, 352, 634, 633, 277, 277, 579, 277, 974, 633, 611,
	634, 634, 411, 520, 392, 633, 591, 817, 591, 591, 524, 636, 336, 636, 837,
}

var sansBoldWidths = [95]int{
	348, 456, 520, 837, 695, 1001, 872, 306, 457, 457, 522, 837, 379, 415, 379, 365,
	695, 695, 695, 695, 695, 695, 695, 695, 695, 695, 399, 399, 837, 837, 837, 580,
	1000, 773, 762, 733, 830, 683, 683, 820, 836, 372, 372, 774, 637, 995, 836, 850,
	732, 850, 770, 720, 682, 812, 773, 1103, 770, 724, 725, 457, 365, 457, 837, 500,
	500, 674, 715, 592, 715, 678, 435, 715, 711, 342, 342, 665, 342, 1041, 711, 687,
	715, 715, 493, 595, 478, 711, 651, 923, 645, 651, 582, 711, 365, 711, 837,
}

// monoWidth is every character's width in a monospaced font: DejaVu Sans
// Mono's and Menlo's 0.602 em, more than Consolas' and Liberation Mono's.
const monoWidth = 602

// wideWidth is the width assumed of a character outside printable ASCII
// (an ellipsis, an arrow): an em, more than DejaVu Sans gives any of those
// the sources use.
const wideWidth = 1000

// span is a run of one line of text in one font: code (between backticks
// in a source) is set in the monospaced font.
type span struct {
	text string
	code bool
}

// spans splits a line at its backticks: the runs between a pair are code.
// An unpaired backtick is refused by the parser (checkMarkup), so every
// line here has pairs.
func spans(line string) []span {
	var out []span
	for i, part := range strings.Split(line, "`") {
		if part != "" {
			out = append(out, span{text: part, code: i%2 == 1})
		}
	}
	return out
}

// textWidth is how wide line is set at size pixels, bold or not, its code
// spans in the monospaced font.
func textWidth(line string, size float64, bold bool) float64 {
	table := &sansWidths
	if bold {
		table = &sansBoldWidths
	}
	var units int
	for _, s := range spans(line) {
		for _, r := range s.text {
			switch {
			case s.code:
				units += monoWidth
			case r >= ' ' && r <= '~':
				units += table[r-' ']
			default:
				units += wideWidth
			}
		}
	}
	return float64(units) * size / 1000
}

// blockWidth is the width of the widest of lines.
func blockWidth(lines []string, size float64, bold bool) float64 {
	var w float64
	for _, l := range lines {
		w = max(w, textWidth(l, size, bold))
	}
	return w
}
