package canonjson

import (
	"bytes"
	"slices"
)

// writeFast returns doc's canonical form when it is only doc's tokens
// rearranged, which is so for the bodies requests mostly carry: no escape
// anywhere (a string is then written as it is spelled) and object keys in
// ASCII (whose byte order is the UTF-16 order RFC 8785 sorts by); numbers
// are written by n (short integers as spelled, but -0 as 0). It answers
// false for anything else, which writeFull canonicalises; doc must be one
// that checkFast accepted. FuzzWriteFast holds it to writeFull's output.
// Each byte is read once more for every object around it: at most
// MaxDepth times.
func writeFast(doc []byte, n numbers) ([]byte, bool) {
	if bytes.IndexByte(doc, '\\') >= 0 {
		return nil, false
	}
	w := fastWriter{doc: doc, out: make([]byte, 0, len(doc)), numbers: n}
	if end, ok := w.value(skipSpace(doc, 0)); !ok || skipSpace(doc, end) != len(doc) {
		return nil, false
	}
	return w.out, true
}

// fastWriter writes the canonical form of a document checkFast accepted
// and that has no escape: its syntax is known good, so it reads tokens
// without checking them again.
type fastWriter struct {
	doc, out []byte
	numbers  numbers
}

// member is one member of an object: its key without the quotes, and where
// its value starts.
type member struct {
	key   []byte
	value int
}

// value writes the value starting at doc[i] and returns the index just past
// it.
func (w *fastWriter) value(i int) (int, bool) {
	switch w.doc[i] {
	case '{':
		return w.object(i)
	case '[':
		return w.array(i)
	}
	end := skipValue(w.doc, i)
	lit := w.doc[i:end]
	switch {
	case lit[0] == '"' || lit[0] == 't' || lit[0] == 'f' || lit[0] == 'n':
	case string(lit) == "-0":
		lit = lit[1:]
	case len(lit) > 15 || bytes.IndexAny(lit, ".eE") >= 0:
		// Below 10^15, an integer's canonical spelling is its own, under
		// every rule; beyond, the rules decide.
		w.out = append(w.out, w.numbers.spell(string(lit))...)
		return end, true
	}
	w.out = append(w.out, lit...)
	return end, true
}

func (w *fastWriter) array(i int) (int, bool) {
	w.out = append(w.out, '[')
	for i = skipSpace(w.doc, i+1); w.doc[i] != ']'; {
		if w.doc[i] == ',' {
			w.out = append(w.out, ',')
			i = skipSpace(w.doc, i+1)
		}
		end, ok := w.value(i)
		if !ok {
			return 0, false
		}
		i = skipSpace(w.doc, end)
	}
	w.out = append(w.out, ']')
	return i + 1, true
}

func (w *fastWriter) object(i int) (int, bool) {
	var buf [8]member
	members := buf[:0]
	i = skipSpace(w.doc, i+1)
	for w.doc[i] != '}' {
		if w.doc[i] == ',' {
			i = skipSpace(w.doc, i+1)
		}
		end, _ := stringEnd(w.doc, i)
		key := w.doc[i+1 : end-1]
		for _, b := range key {
			if b >= 0x80 {
				return 0, false // UTF-16 order differs from UTF-8's beyond U+FFFF
			}
		}
		start := skipSpace(w.doc, skipSpace(w.doc, end)+1) // past the colon
		members = append(members, member{key: key, value: start})
		i = skipSpace(w.doc, skipValue(w.doc, start))
	}
	slices.SortFunc(members, func(a, b member) int { return bytes.Compare(a.key, b.key) })
	w.out = append(w.out, '{')
	for n, m := range members {
		if n > 0 {
			w.out = append(w.out, ',')
		}
		w.out = append(w.out, '"')
		w.out = append(w.out, m.key...)
		w.out = append(w.out, '"', ':')
		if _, ok := w.value(m.value); !ok {
			return 0, false
		}
	}
	w.out = append(w.out, '}')
	return i + 1, true
}

// skipValue returns the index just past the value starting at doc[i], in a
// document without escapes.
func skipValue(doc []byte, i int) int {
	switch doc[i] {
	case '"':
		end, _ := stringEnd(doc, i)
		return end
	case '{', '[':
		for depth := 0; ; i++ {
			switch doc[i] {
			case '"':
				end, _ := stringEnd(doc, i)
				i = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
	default: // a number or a literal, up to what ends it
		for i < len(doc) && bytes.IndexByte(delimiters, doc[i]) < 0 {
			i++
		}
		return i
	}
}

// delimiters are the bytes that can follow a number or a literal.
var delimiters = []byte(",}] \t\r\n")

// skipSpace returns the index of the first byte at or after i that is not
// JSON whitespace.
func skipSpace(doc []byte, i int) int {
	for i < len(doc) && (doc[i] == ' ' || doc[i] == '\t' || doc[i] == '\r' || doc[i] == '\n') {
		i++
	}
	return i
}
