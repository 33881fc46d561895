package conformance

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"
)

// Formats are the report formats Write knows.
var Formats = []string{"text", "json", "junit"}

// Summary counts results by status.
type Summary struct {
	Passed  int `json:"passed"`
	Failed  int `json:"failed"`
	Skipped int `json:"skipped"`
	Errors  int `json:"errors"` // checks that could not run: see Error
}

// Summarize counts results.
func Summarize(results []Result) Summary {
	var s Summary
	for _, r := range results {
		switch r.Status {
		case Pass:
			s.Passed++
		case Fail:
			s.Failed++
		case Skip:
			s.Skipped++
		case Error:
			s.Errors++
		}
	}
	return s
}

// String is the report's closing line: "N passed, M failed, K skipped, E
// errors", every count always there, so that a script reads it alike.
func (s Summary) String() string {
	return fmt.Sprintf("%d passed, %d failed, %d skipped, %d errors", s.Passed, s.Failed, s.Skipped, s.Errors)
}

// Write writes results in format: a table for people, JSON for programs,
// JUnit XML for CI systems.
func Write(w io.Writer, format string, profile Profile, results []Result) error {
	switch format {
	case "text", "":
		return writeText(w, results)
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Profile Profile  `json:"profile"`
			Summary Summary  `json:"summary"`
			Results []Result `json:"results"`
		}{profile, Summarize(results), results})
	case "junit":
		return writeJUnit(w, profile, results)
	}
	return fmt.Errorf("no format %q (there are %s)", format, strings.Join(Formats, ", "))
}

func writeText(w io.Writer, results []Result) error {
	var table bytes.Buffer
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RESULT\tCHECK\tOPERATION\tREASON")
	for _, r := range results {
		op := r.Operation
		if op == "" {
			op = "(every answer)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Status, Printable(r.Check), Printable(op), Printable(oneLine(r.Reason)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for line := range strings.Lines(table.String()) {
		if _, err := io.WriteString(w, strings.TrimRight(line, " \n")+"\n"); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintln(w, Summarize(results))
	return err
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// Printable is s with what a terminal acts on instead of showing written as
// Go's escapes: the control characters (C0, DEL and C1; ESC starts the
// sequences that clear the screen, move the cursor, retitle the window or
// hide a link), Unicode's bidirectional controls (which reorder what is
// shown), and bytes that are not UTF-8. The text reports show an API's
// answers and a document's strings, which others wrote, on a terminal or
// in a CI log; the JSON and JUnit reports escape them by their own rules.
func Printable(s string) string {
	i := strings.IndexFunc(s, func(r rune) bool { return r == utf8.RuneError || acted(r) })
	if i < 0 {
		return s
	}
	var b strings.Builder
	b.WriteString(s[:i])
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r < utf8.RuneSelf && acted(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case acted(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// acted says whether a terminal acts on r rather than show it.
func acted(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) }

// junitSuites is the JUnit XML report as Jenkins, GitLab and GitHub
// Actions' test reporters read it.
type junitSuites struct {
	XMLName xml.Name     `xml:"testsuites"`
	Suites  []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Errors   int         `xml:"errors,attr"` // JUnit's own: a test that could not run
	Skipped  int         `xml:"skipped,attr"`
	Time     string      `xml:"time,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	Classname string        `xml:"classname,attr"`
	Time      string        `xml:"time,attr"`
	Failure   *junitMessage `xml:"failure,omitempty"`
	Error     *junitMessage `xml:"error,omitempty"`
	Skipped   *junitMessage `xml:"skipped,omitempty"`
}

type junitMessage struct {
	Message string `xml:"message,attr"`
	Text    string `xml:",chardata"`
}

func writeJUnit(w io.Writer, profile Profile, results []Result) error {
	sum := Summarize(results)
	suite := junitSuite{
		Name: "idempotency conformance (profile " + profile.Name + ")", Tests: len(results),
		Failures: sum.Failed, Errors: sum.Errors, Skipped: sum.Skipped,
	}
	var total time.Duration
	for _, r := range results {
		total += r.Duration
		c := junitCase{Name: r.Check, Classname: r.Operation, Time: seconds(r.Duration)}
		if c.Classname == "" {
			c.Classname = "every answer"
		}
		switch r.Status {
		case Fail:
			c.Failure = &junitMessage{Message: oneLine(r.Reason), Text: r.Reason}
		case Error:
			c.Error = &junitMessage{Message: oneLine(r.Reason), Text: r.Reason}
		case Skip:
			c.Skipped = &junitMessage{Message: oneLine(r.Reason)}
		}
		suite.Cases = append(suite.Cases, c)
	}
	suite.Time = seconds(total)
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(junitSuites{Suites: []junitSuite{suite}}); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}

func seconds(d time.Duration) string { return fmt.Sprintf("%.3f", d.Seconds()) }
