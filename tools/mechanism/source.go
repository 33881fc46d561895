package main

import (
	"fmt"
	"strings"
)

// A source is a text file of lines, one directive a line:
//
//	# a comment (a line whose first non-blank character is #)
//	diagram sequence            (or states: the first directive, always)
//	WORDS [ : TEXT]
//
// WORDS are the directive and its arguments, separated by blanks; TEXT,
// after the first " : ", is what the picture says. In TEXT, \n breaks the
// line, and `code` is set in a monospaced font. Blank lines are ignored.
// sequence.go and states.go list the directives of each kind.

// directive is one line of a source.
type directive struct {
	line  int      // its number in the source, from 1
	words []string // before " : "
	text  []string // after it, one entry a line of the picture; nil without
}

// shape checks that d has words words before " : " (its directive among
// them), and text after it or none, as its directive takes: one check for
// the directives of both kinds.
func (d directive) shape(file string, words int, text bool) error {
	w := d.words
	switch {
	case len(w) != words:
		return errorf(file, d.line, "%s takes %d word(s) before \" : \", not %d", w[0], words-1, len(w)-1)
	case text && d.text == nil:
		return errorf(file, d.line, "%s needs its text after \" : \"", w[0])
	case !text && d.text != nil:
		return errorf(file, d.line, "%s takes no text", w[0])
	}
	return nil
}

// sourceError is a source that cannot be drawn: it names the file and the
// line.
type sourceError struct {
	file string
	line int
	msg  string
}

func (e *sourceError) Error() string {
	if e.line == 0 {
		return fmt.Sprintf("%s: %s", e.file, e.msg)
	}
	return fmt.Sprintf("%s:%d: %s", e.file, e.line, e.msg)
}

// errorf is an error of the source file at line.
func errorf(file string, line int, format string, args ...any) error {
	return &sourceError{file: file, line: line, msg: fmt.Sprintf(format, args...)}
}

// readSource splits a source into its kind (the argument of its first
// directive, diagram) and its other directives.
func readSource(file string, src []byte) (kind string, ds []directive, err error) {
	for i, raw := range strings.Split(string(src), "\n") {
		n := i + 1
		trimmed := strings.TrimSpace(raw)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		d := directive{line: n}
		head, text, hasText := strings.Cut(trimmed, " : ")
		if !hasText && strings.HasSuffix(trimmed, " :") {
			return "", nil, errorf(file, n, "nothing after \" : \"")
		}
		d.words = strings.Fields(head)
		if hasText {
			text = strings.TrimSpace(text)
			if text == "" {
				return "", nil, errorf(file, n, "nothing after \" : \"")
			}
			d.text = strings.Split(text, `\n`)
			for _, l := range d.text {
				if strings.Count(l, "`")%2 != 0 {
					return "", nil, errorf(file, n, "a ` without its closing `: code goes between two backticks on one line")
				}
			}
		}
		if kind == "" {
			if len(d.words) != 2 || d.words[0] != "diagram" || d.text != nil {
				return "", nil, errorf(file, n, "the first directive must be \"diagram sequence\" or \"diagram states\", not %q", trimmed)
			}
			kind = d.words[1]
			if kind != "sequence" && kind != "states" {
				return "", nil, errorf(file, n, "unknown diagram %q (want sequence or states)", kind)
			}
			continue
		}
		ds = append(ds, d)
	}
	if kind == "" {
		return "", nil, errorf(file, 0, "empty: the first directive must be \"diagram sequence\" or \"diagram states\"")
	}
	return kind, ds, nil
}

// draw reads a source and draws its picture.
func draw(file string, src []byte) ([]byte, error) {
	kind, ds, err := readSource(file, src)
	if err != nil {
		return nil, err
	}
	switch kind {
	case "sequence":
		seq, err := parseSequence(file, ds)
		if err != nil {
			return nil, err
		}
		return seq.draw(), nil
	default:
		sd, err := parseStates(file, ds)
		if err != nil {
			return nil, err
		}
		return sd.draw()
	}
}
