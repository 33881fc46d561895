// Package canonjson turns a JSON document into its RFC 8785 (JCS) canonical
// form, so that two bodies with the same meaning — keys reordered, whitespace
// changed, numbers or strings spelled differently — give the same bytes and
// therefore the same fingerprint.
//
// The serialisation is github.com/gowebpki/jcs's, except where the canonical
// form is only the document's own tokens rearranged, as it is for most
// request bodies: writeFast writes those itself, byte for byte as jcs would
// (FuzzWriteFast), without jcs's allocation per token. This package adds the
// input rules a fingerprint needs on top of it, each closing a way in which
// two different requests could otherwise share a canonical form or in which
// hostile input could hurt the server:
//
//   - invalid UTF-8 is rejected (JCS would otherwise see replacement
//     characters, and "\xff" and "\xfe" would be the same request);
//   - duplicate object keys are rejected (which one wins differs between
//     parsers, so the request has no single meaning);
//   - integers beyond ±2^53 are rejected, however spelled (1e16 too): JCS
//     represents numbers as IEEE doubles, so 9007199254740993 and
//     9007199254740992 would canonicalise alike although a Go int64 decoder
//     tells them apart;
//   - nesting deeper than MaxDepth is rejected before the recursive
//     canonicaliser sees it;
//   - more than MaxValues values in all, or MaxMembers members in one
//     object, are rejected before anything is allocated for them (a map of
//     keys, a token each): a hostile megabyte of 80,000 keys cost 47 MB and
//     140 ms before it was refused.
package canonjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
)

// MaxDepth bounds object and array nesting. Real request bodies nest a few
// levels; a bound keeps a hostile body from costing stack or time.
const MaxDepth = 64

// MaxValues and MaxMembers bound a document's values in all and one
// object's members: request bodies carry tens or hundreds, and what
// canonicalising allocates grows with them.
const (
	MaxValues  = 20_000
	MaxMembers = 1_000
)

// ErrInvalid is returned, wrapped with the reason, for any input that has no
// canonical form under the rules above.
var ErrInvalid = errors.New("invalid JSON")

// maxExactFloat is 2^53, the largest magnitude up to which every integer
// has an exact IEEE double.
const maxExactFloat = 1 << 53

// Canonicalize returns the RFC 8785 canonical form of doc. An empty (or
// all-whitespace) document canonicalises to an empty result, so that
// operations without a body can still be fingerprinted.
func Canonicalize(doc []byte) ([]byte, error) {
	// Only JSON's own whitespace (RFC 8259 §2): bytes.TrimSpace would also
	// take "\f", "\v" or U+00A0, which are not JSON, for an empty body.
	if len(bytes.Trim(doc, " \t\r\n")) == 0 {
		return nil, nil
	}
	if !utf8.Valid(doc) {
		return nil, fmt.Errorf("%w: not valid UTF-8", ErrInvalid)
	}
	if err := bounded(doc); err != nil {
		return nil, err
	}
	if checkFast(doc) {
		if out, ok := writeFast(doc); ok {
			return out, nil
		}
	} else if err := check(doc); err != nil {
		// Invalid, or beyond what the fast path decides: the full check
		// finds the reason (or accepts it after all).
		return nil, err
	}
	out, err := jcs.Transform(doc)
	if err != nil {
		return nil, fmt.Errorf("%w: %s", ErrInvalid, err.Error())
	}
	return out, nil
}

// checkFast reports whether doc certainly passes check, without
// allocating for the documents requests carry: json.Valid settles the
// syntax (one value, no trailing data), then one pass over the bytes
// applies check's rules. It answers false, leaving the verdict and its
// message to check, for anything invalid and for what it does not decide
// itself: a key with an escape (its meaning needs decoding), an object of
// more than maxFastKeys keys, and nesting beyond MaxDepth. FuzzCheckFast holds it to check's verdicts.
func checkFast(doc []byte) bool {
	if !json.Valid(doc) {
		return false
	}
	// keys holds the keys of every open object, innermost last; opened[d]
	// is where the object at depth d starts in keys (-1 for an array).
	var (
		keysBuf   [32][]byte
		openedBuf [16]int
		keys      = keysBuf[:0]
		opened    = openedBuf[:0]
	)
	for i := 0; i < len(doc); i++ {
		switch c := doc[i]; {
		case c == '{' || c == '[':
			if len(opened) == MaxDepth {
				return false
			}
			start := -1
			if c == '{' {
				start = len(keys)
			}
			opened = append(opened, start)
		case c == '}' || c == ']':
			if start := opened[len(opened)-1]; start >= 0 {
				keys = keys[:start]
			}
			opened = opened[:len(opened)-1]
		case c == '"':
			end, escaped := stringEnd(doc, i)
			// A string in an object is a key when a colon follows it
			// (after whitespace); json.Valid has checked the grammar.
			if len(opened) > 0 && opened[len(opened)-1] >= 0 && isKey(doc, end) {
				if escaped {
					return false
				}
				key := doc[i+1 : end-1]
				siblings := keys[opened[len(opened)-1]:]
				if len(siblings) == maxFastKeys {
					// Comparing each key with all before it is quadratic: a
					// hostile object of 100 000 keys would cost seconds.
					// check's map decides large objects.
					return false
				}
				for _, seen := range siblings {
					if bytes.Equal(seen, key) {
						return false
					}
				}
				keys = append(keys, key)
			}
			i = end - 1
		case c == '-' || (c >= '0' && c <= '9'):
			end := i + 1
			for end < len(doc) && strings.IndexByte("0123456789+-.eE", doc[end]) >= 0 {
				end++
			}
			if !exactNumber(doc[i:end]) {
				return false
			}
			i = end - 1
		}
	}
	return true
}

// bounded refuses a document of more than MaxValues values, or with an
// object of more than MaxMembers members, in one pass that allocates
// nothing; the grammar is left to the checks after it. Values are counted
// by their separators: each comma outside a string adds one.
func bounded(doc []byte) error {
	var (
		members [MaxDepth + 1]int  // commas of each open container, innermost last
		object  [MaxDepth + 1]bool // whether it is an object
		depth   int
		values  = 1
	)
	for i := 0; i < len(doc); i++ {
		switch doc[i] {
		case '"':
			end, _ := stringEnd(doc, i)
			i = end - 1
		case '{', '[':
			depth++
			if depth <= MaxDepth {
				members[depth], object[depth] = 0, doc[i] == '{'
			}
		case '}', ']':
			if depth > 0 { // an unbalanced close is json.Valid's to refuse
				depth--
			}
		case ',':
			values++
			if values > MaxValues {
				return fmt.Errorf("%w: more than %d values", ErrInvalid, MaxValues)
			}
			if depth > 0 && depth <= MaxDepth && object[depth] {
				if members[depth]++; members[depth] >= MaxMembers {
					return fmt.Errorf("%w: an object of more than %d members", ErrInvalid, MaxMembers)
				}
			}
		}
	}
	return nil
}

// maxFastKeys is the most keys an object may have for checkFast to decide
// it; request objects have a handful.
const maxFastKeys = 32

// stringEnd returns the index just past the closing quote of the string
// that opens at doc[i], and whether it contains an escape.
func stringEnd(doc []byte, i int) (end int, escaped bool) {
	for j := i + 1; j < len(doc); j++ {
		switch doc[j] {
		case '\\':
			escaped = true
			j++
		case '"':
			return j + 1, escaped
		}
	}
	return len(doc), escaped
}

// isKey reports whether the string ending before doc[end] is followed by a
// colon.
func isKey(doc []byte, end int) bool {
	for ; end < len(doc); end++ {
		switch doc[end] {
		case ' ', '\t', '\r', '\n':
		case ':':
			return true
		default:
			return false
		}
	}
	return false
}

// exactNumber is checkNumber's verdict for a number literal, deciding the
// common short integers without converting the literal to a string.
func exactNumber(lit []byte) bool {
	digits := len(lit)
	if lit[0] == '-' {
		digits--
	}
	if digits < 16 && bytes.IndexAny(lit, ".eE") < 0 {
		return true
	}
	return checkNumber(string(lit)) == nil
}

// check walks doc's tokens once without recursion, enforcing the depth,
// duplicate-key and exact-integer rules. json.Decoder also rejects
// syntax errors, so jcs.Transform only ever sees well-formed input.
func check(doc []byte) error {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()

	// One frame per open container: the keys seen so far for an object (nil
	// for an array), and whether the next string token is a key.
	type frame struct {
		keys      map[string]struct{}
		expectKey bool
	}
	var stack []frame
	topLevelValues := 0

	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("%w: %s", ErrInvalid, err.Error())
		}
		top := len(stack) - 1
		if top < 0 {
			// json.Decoder reads a stream of values; a request body is one.
			if topLevelValues++; topLevelValues > 1 {
				return fmt.Errorf("%w: more than one JSON value", ErrInvalid)
			}
		}
		// In key position the decoder yields either a key (a string) or the
		// object's closing '}'.
		if key, isString := tok.(string); isString && top >= 0 && stack[top].keys != nil && stack[top].expectKey {
			if _, dup := stack[top].keys[key]; dup {
				return fmt.Errorf("%w: duplicate key %q", ErrInvalid, truncate(key))
			}
			stack[top].keys[key] = struct{}{}
			stack[top].expectKey = false
			continue
		}
		if top >= 0 && stack[top].keys != nil {
			stack[top].expectKey = true // this token is a value; a key comes next
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{', '[':
				if len(stack) >= MaxDepth {
					return fmt.Errorf("%w: nested deeper than %d levels", ErrInvalid, MaxDepth)
				}
				f := frame{}
				if t == '{' {
					f = frame{keys: map[string]struct{}{}, expectKey: true}
				}
				stack = append(stack, f)
			case '}', ']':
				stack = stack[:top]
				if len(stack) > 0 && stack[len(stack)-1].keys != nil {
					stack[len(stack)-1].expectKey = true
				}
			}
		case json.Number:
			if err := checkNumber(t.String()); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkNumber rejects integer literals that an IEEE double cannot hold
// exactly. Literals with a fraction or exponent are decimal values whose
// meaning JCS defines as the nearest double, which is what a JSON number
// means under I-JSON (RFC 7493); but that double must not lie beyond ±2^53
// either. Every double that large is an integer, and JCS writes it out as an
// integer literal ("1e16" becomes "10000000000000000"), which this rule would
// then reject: the canonical form would not canonicalise again.
func checkNumber(lit string) error {
	if strings.ContainsAny(lit, ".eE") {
		f, err := strconv.ParseFloat(lit, 64)
		if err != nil || math.Abs(f) > maxExactFloat {
			return fmt.Errorf("%w: number %s is too large to compare exactly (limit ±2^53)", ErrInvalid, truncate(lit))
		}
		return nil
	}
	digits := strings.TrimPrefix(lit, "-")
	// JSON integers have no leading zeros, so more than 16 digits is beyond
	// 2^53 (9007199254740992) without parsing: a hostile megabyte of digits
	// costs nothing.
	if len(digits) > 16 {
		return fmt.Errorf("%w: integer %s is too large to compare exactly (limit ±2^53)", ErrInvalid, truncate(lit))
	}
	if len(digits) < 16 { // < 10^15 < 2^53: always exact
		return nil
	}
	n, err := strconv.ParseUint(digits, 10, 64)
	if err != nil || n > maxExactFloat {
		return fmt.Errorf("%w: integer %s is too large to compare exactly (limit ±2^53)", ErrInvalid, truncate(lit))
	}
	return nil
}

func truncate(s string) string {
	const limit = 40
	if len(s) <= limit {
		return s
	}
	return s[:limit] + "…"
}
