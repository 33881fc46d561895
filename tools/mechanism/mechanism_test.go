package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// pictures are the pictures drawn by this command, by name: NAME.txt in
// docs/img/src, NAME.svg in docs/img.
var pictures = []string{"request-sequence", "gateway-key-states"}

// TestCommittedPicturesAreFresh draws each committed source and compares
// the result with the committed picture, byte for byte, so that make test
// fails, as make verify does through docs/img/SOURCES.sha256, when a source
// or the drawer changed without a redraw. Drawing each one several times in
// one process also catches an output that depends on map order.
func TestCommittedPicturesAreFresh(t *testing.T) {
	t.Parallel()
	sources, err := filepath.Glob("../../docs/img/src/*.txt")
	require.NoError(t, err)
	var names []string
	for _, s := range sources {
		names = append(names, strings.TrimSuffix(filepath.Base(s), ".txt"))
	}
	require.ElementsMatch(t, pictures, names, "the sources in docs/img/src are the pictures tools/docs-images.sh knows")
	for _, name := range pictures {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			src := "../../docs/img/src/" + name + ".txt"
			text, err := os.ReadFile(src)
			require.NoError(t, err)
			got, err := draw(src, text)
			require.NoError(t, err, "the committed source must draw")
			for range 3 {
				again, err := draw(src, text)
				require.NoError(t, err)
				require.True(t, bytes.Equal(got, again), "%s: two drawings of one source differ", src)
			}
			want, err := os.ReadFile("../../docs/img/" + name + ".svg")
			require.NoError(t, err, "docs/img/%s.svg is missing: run 'make docs/mechanism' and commit it", name)
			require.True(t, bytes.Equal(want, got),
				"docs/img/%s.svg is stale (its source or the drawer changed): run 'make docs/mechanism' and commit it with docs/img/SOURCES.sha256", name)
		})
	}
}

// TestSourceErrorsNameTheLine: a source that cannot be drawn is refused
// with the file, the line and what is wrong with it.
func TestSourceErrorsNameTheLine(t *testing.T) {
	t.Parallel()
	const seq = "diagram sequence\nparticipant a : A\nparticipant b : B\n"
	const states = "diagram states\ncanvas 400 300\nstate a 100 100 : A\n"
	for _, tc := range []struct {
		name, src, want string
	}{
		{"not a diagram", "# a comment\n\nsequence\n", `x.txt:3: the first directive must be "diagram sequence" or "diagram states", not "sequence"`},
		{"unknown kind", "diagram flow\n", `x.txt:1: unknown diagram "flow" (want sequence or states)`},
		{"empty", "# nothing\n", `x.txt: empty: the first directive must be "diagram sequence" or "diagram states"`},
		{"unknown directive", seq + "bogus a b\n", `x.txt:4: unknown directive "bogus" (want title, participant, A -> B, A --> B, note, section, frame, end, activate, deactivate or footer)`},
		{"unknown participant", seq + "a -> c : hello\n", `x.txt:4: unknown participant "c" (declare it with participant c : NAME)`},
		{"message to itself", seq + "a -> a : hello\n", `x.txt:4: a message from a to itself: use a note`},
		{"message without text", seq + "a -> b\n", `x.txt:4: a message needs its text after " : "`},
		{"nothing after the colon", seq + "a -> b :\n", `x.txt:4: nothing after " : "`},
		{"unpaired backtick", seq + "a -> b : `Idempotency-Key\n", "x.txt:4: a ` without its closing `: code goes between two backticks on one line"},
		{"participant late", seq + "a -> b : hi\nparticipant c : C\n", `x.txt:5: participants come before the first message, note or section`},
		{"frame without end", seq + "frame : F\na -> b : hi\n", `x.txt:5: a frame without its end`},
		{"end without frame", seq + "end\n", `x.txt:4: end without a frame`},
		{"activate twice", seq + "a -> b : hi\nactivate b\nactivate b\n", `x.txt:6: activate b: it is already activated`},
		{"still active", seq + "a -> b : hi\nactivate b\n", `x.txt:5: b is still active at the end: deactivate it`},
		{"one participant", "diagram sequence\nparticipant a : A\n", `x.txt:2: a sequence needs at least two participants`},
		{"no canvas", "diagram states\nstate a 100 100 : A\n", `x.txt: no canvas: say how large the picture is with canvas W H`},
		{"bad number", states + "state b 1OO 200 : B\n", `x.txt:4: x "1OO" is not a number of pixels`},
		{"unknown state", states + "edge a -> b : go\n", `x.txt:4: unknown state or group "b"`},
		{"unknown edge option", states + "state b 300 100 : B\nedge a -> b curved\n", `x.txt:5: unknown edge option "curved" (want dashed, via X,Y or at X,Y)`},
		{"bad point", states + "state b 300 100 : B\nedge a -> b via 200 : go\n", `x.txt:5: via "200" is not a point X,Y`},
		{"at without text", states + "state b 300 100 : B\nedge a -> b at 200,100\n", `x.txt:5: at places an edge's text, and this edge has none`},
		{"states overlap", states + "state b 110 100 : B\n", `x.txt:4: state b overlaps state a (line 3)`},
		{"text over a state", states + "state b 300 100 : B\nedge a -> b at 100,110 : go\n", `x.txt:5: the text of the edge a -> b overlaps state a (line 3)`},
		{"off the canvas", states + "state b 390 100 : B\n", `x.txt:4: state b leaves the canvas (400 by 300, line 2): it spans 370.3,80.5 to 409.7,119.5`},
		{"via inside a state", states + "state b 300 100 : B\nedge a -> b via 100,100\n", `x.txt:5: the edge a -> b passes through 100,100, inside state a`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := draw("x.txt", []byte(tc.src))
			require.EqualError(t, err, tc.want)
		})
	}
}
