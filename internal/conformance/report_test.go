package conformance_test

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/conformance"
)

// hostile is what an API (or a document) may put in front of a terminal:
// ESC sequences that clear the screen, retitle the window and hide a link,
// a bell, the 8-bit CSI, a right-to-left override and a byte that is not
// UTF-8.
const hostile = "\x1b[2J\x1b[H\x1b]0;pwned\x07\x1b]8;;https://evil.example\x1b\\here\x1b]8;;\x1b\\ \u009b31m \u202egnp.exe \xff"

// TestTextReportsEscapeControlCharacters: an API that answers with
// terminal escape sequences gets them shown, as escapes, in the text
// report; no byte of them reaches the terminal. The JSON and JUnit
// reports escape them by their own rules.
func TestTextReportsEscapeControlCharacters(t *testing.T) {
	t.Parallel()
	// Every request runs, and its answer (quoted in the reasons of the
	// checks that fail) holds the sequences.
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"w1","name":"gear","size":3,"note":"%s"}`, hostile)
	})
	results := runAgainst(t, api, "Bearer a", "", "", "createWidget")
	require.Contains(t, reasons(results), "\x1b[2J", "the answer is in the reasons as it came")

	var text bytes.Buffer
	require.NoError(t, conformance.Write(&text, "text", conformance.Profiles["oncekey"], results))
	report := text.String()
	for _, raw := range []string{"\x1b", "\x07", "\u009b", "\u202e", "\xff"} {
		require.False(t, strings.Contains(report, raw), "a raw %q in the text report", raw)
	}
	require.Contains(t, report, `\x1b[2J\x1b[H\x1b]0;pwned\x07\x1b]8;;https://evil.example\x1b\here`, "the sequences, shown")
	require.Contains(t, report, `\u009b31m \u202egnp.exe \xff`)

	for _, format := range []string{"json", "junit"} {
		var b bytes.Buffer
		require.NoError(t, conformance.Write(&b, format, conformance.Profiles["oncekey"], results))
		require.False(t, strings.Contains(b.String(), "\x1b"), "a raw ESC in the %s report", format)
	}
}

// TestPrintable: what a terminal acts on is escaped, and nothing else.
func TestPrintable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"POST /orders: got 201 {\"id\":\"é ✓ 😀\"}", "POST /orders: got 201 {\"id\":\"é ✓ 😀\"}"},
		{"a\x1b[31mred", `a\x1b[31mred`},
		{"tab\tnew\nline\r", `tab\x09new\x0aline\x0d`},
		{"del\x7f nul\x00", `del\x7f nul\x00`},
		{"c1 \u0085 \u009b", `c1 \u0085 \u009b`},
		{"bidi \u202e \u2066 \u200f", `bidi \u202e \u2066 \u200f`},
		{"bad \xff\xfe utf-8, and a real \ufffd", `bad \xff\xfe utf-8, and a real ` + "\ufffd"},
		{strings.Repeat("x", 3), "xxx"},
	} {
		require.Equal(t, tc.want, conformance.Printable(tc.in), "%q", tc.in)
	}
	notice := conformance.Notice{What: "fields that are neither OpenAPI's nor extensions (x-): a\x1b[2J", Pointer: "/paths/~1a", Done: "they are ignored"}
	require.Equal(t, `unsupported: fields that are neither OpenAPI's nor extensions (x-): a\x1b[2J at /paths/~1a: they are ignored`, notice.String(), "a notice, printed")
}
