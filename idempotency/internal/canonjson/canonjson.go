// Package canonjson turns a JSON document into a canonical form, so that
// two bodies with the same meaning — keys reordered, whitespace changed,
// numbers or strings spelled differently — give the same bytes and
// therefore the same fingerprint, while two bodies that some parser reads
// differently never do.
//
// The canonical form is RFC 8785's (JCS), except for numbers, which JCS
// reads as IEEE doubles: 123456789.123456789123 and 123456789.12345679
// would be one number to it, though a decimal parser reads two amounts.
// Here a number means its exact decimal value:
//
//   - a number whose exact value is the shortest decimal that round-trips
//     some double (1, 1.0, 12e2, 0.1, 4.50, 9007199254740994, 1e21) is
//     written as JCS writes that double; so a body of ordinary numbers has
//     exactly its RFC 8785 canonical form;
//   - any other number (more digits than a double keeps, an integer beyond
//     ±2^53 that no double is, beyond a double's range) is written as its
//     significand without leading or trailing zeros, "E" and its exponent
//     ("123456789123456789123E-12", "9007199254740993E0"). JCS never writes
//     an upper-case "E", so no such form is ever a double's;
//   - -0 and 0 are one number.
//
// The serialisation of strings and the order of keys are
// github.com/gowebpki/jcs's. Where the canonical form is only the
// document's own tokens rearranged, as it is for most request bodies,
// writeFast writes it itself, byte for byte as the full writer would
// (FuzzWriteFast), without jcs's allocation per token. This package adds
// the input rules a fingerprint needs on top of it, each closing a way in
// which two different requests could otherwise share a canonical form or
// in which hostile input could hurt the server:
//
//   - invalid UTF-8 is rejected (JCS would otherwise see replacement
//     characters, and "\xff" and "\xfe" would be the same request);
//   - duplicate object keys are rejected (which one wins differs between
//     parsers, so the request has no single meaning);
//   - a number whose exponent is written with more than 9 digits is
//     rejected: no request means one, and its exact value would cost what
//     its exponent says;
//   - nesting deeper than MaxDepth is rejected before the recursive
//     canonicaliser sees it;
//   - more than MaxValues values in all, or MaxMembers members in one
//     object, are rejected before anything is allocated for them (a map of
//     keys, a token each): a hostile megabyte of 80,000 keys cost 47 MB and
//     140 ms before it was refused.
//
// Legacy is the canonical form of the rules before numbers were exact
// (pure RFC 8785, integers beyond ±2^53 refused): the fingerprints of
// records stored under those rules are compared with it.
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

// numbers is how one set of rules admits and writes numbers: exactly
// (Canonicalize) or as doubles (Legacy).
type numbers struct {
	// check refuses a literal the rules give no canonical form.
	check func(lit string) error
	// spell writes a literal that check admitted in its canonical form.
	spell func(lit string) string
}

var (
	exactNumbers  = numbers{check: checkExact, spell: spellExact}
	legacyNumbers = numbers{check: checkLegacy, spell: spellLegacy}
)

// Canonicalize returns the canonical form of doc, numbers compared as
// exact decimals (see the package documentation). An empty (or
// all-whitespace) document canonicalises to an empty result, so that
// operations without a body can still be fingerprinted.
func Canonicalize(doc []byte) ([]byte, error) { return canonicalize(doc, exactNumbers) }

// Legacy returns the canonical form of doc under the rules before numbers
// were exact: its RFC 8785 form, numbers read as doubles, integers beyond
// ±2^53 refused. Only the fingerprints of records stored under those rules
// are compared with it.
func Legacy(doc []byte) ([]byte, error) { return canonicalize(doc, legacyNumbers) }

func canonicalize(doc []byte, n numbers) ([]byte, error) {
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
	if checkFast(doc, n) {
		if out, ok := writeFast(doc, n); ok {
			return out, nil
		}
	} else if err := check(doc, n); err != nil {
		// Invalid, or beyond what the fast path decides: the full check
		// finds the reason (or accepts it after all).
		return nil, err
	}
	return writeFull(doc, n)
}

// writeFull is the canonical form of any document that passed check: jcs
// writes its strings and orders its keys, and its numbers are written by
// n. Each number literal is first replaced by its index among the
// document's numbers (a small integer, which jcs writes as it is spelled),
// and each index in jcs's output then by the literal's canonical spelling:
// jcs would read the literals as doubles.
func writeFull(doc []byte, n numbers) ([]byte, error) {
	var lits []string
	indexed := eachNumber(doc, make([]byte, 0, len(doc)), func(out, lit []byte) []byte {
		out = strconv.AppendInt(out, int64(len(lits)), 10)
		lits = append(lits, string(lit))
		return out
	})
	canon, err := jcs.Transform(indexed)
	if err != nil {
		return nil, fmt.Errorf("%w: %s", ErrInvalid, err.Error())
	}
	if len(lits) == 0 {
		return canon, nil
	}
	var bad []byte
	out := eachNumber(canon, make([]byte, 0, len(canon)+len(doc)-len(indexed)), func(out, lit []byte) []byte {
		index, err := strconv.Atoi(string(lit))
		if err != nil || index < 0 || index >= len(lits) {
			bad = lit
			return out
		}
		return append(out, n.spell(lits[index])...)
	})
	if bad != nil {
		return nil, fmt.Errorf("%w: number %q of jcs's output is no index", ErrInvalid, bad)
	}
	return out, nil
}

// eachNumber appends doc to out, each number literal outside strings as
// number appends it.
func eachNumber(doc, out []byte, number func(out, lit []byte) []byte) []byte {
	for i := 0; i < len(doc); i++ {
		switch c := doc[i]; {
		case c == '"':
			end, _ := stringEnd(doc, i)
			out = append(out, doc[i:end]...)
			i = end - 1
		case c == '-' || (c >= '0' && c <= '9'):
			end := numberEnd(doc, i)
			out = number(out, doc[i:end])
			i = end - 1
		default:
			out = append(out, c)
		}
	}
	return out
}

// numberEnd returns the index just past the number literal starting at
// doc[i].
func numberEnd(doc []byte, i int) int {
	end := i + 1
	for end < len(doc) && strings.IndexByte("0123456789+-.eE", doc[end]) >= 0 {
		end++
	}
	return end
}

// checkFast reports whether doc certainly passes check, without
// allocating for the documents requests carry: json.Valid settles the
// syntax (one value, no trailing data), then one pass over the bytes
// applies check's rules. It answers false, leaving the verdict and its
// message to check, for anything invalid and for what it does not decide
// itself: a key with an escape (its meaning needs decoding), an object of
// more than maxFastKeys keys, and nesting beyond MaxDepth. FuzzCheckFast holds it to check's verdicts.
func checkFast(doc []byte, n numbers) bool {
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
			end := numberEnd(doc, i)
			if !admitted(doc[i:end], n) {
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

// admitted is n.check's verdict for a number literal, deciding the common
// short integers, which every rule admits, without converting the literal
// to a string.
func admitted(lit []byte, n numbers) bool {
	digits := len(lit)
	if lit[0] == '-' {
		digits--
	}
	if digits < 16 && bytes.IndexAny(lit, ".eE") < 0 {
		return true
	}
	return n.check(string(lit)) == nil
}

// check walks doc's tokens once without recursion, enforcing the depth,
// duplicate-key and number rules (n's). json.Decoder also rejects syntax
// errors, so jcs.Transform only ever sees well-formed input.
func check(doc []byte, n numbers) error {
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
			if err := n.check(t.String()); err != nil {
				return err
			}
		}
	}
	return nil
}

// maxExponentDigits bounds the digits of a number's exponent, leading
// zeros aside: a billion orders of magnitude is beyond anything a request
// means, and an exponent's value then fits any int.
const maxExponentDigits = 9

// checkExact refuses a number whose exponent has more than
// maxExponentDigits digits; every other JSON number has an exact value.
func checkExact(lit string) error {
	i := strings.IndexAny(lit, "eE")
	if i < 0 {
		return nil
	}
	exp := strings.TrimLeft(strings.TrimLeft(lit[i+1:], "+-"), "0")
	if len(exp) > maxExponentDigits {
		return fmt.Errorf("%w: number %s has an exponent beyond %d digits", ErrInvalid, truncate(lit), maxExponentDigits)
	}
	return nil
}

// spellExact writes a number literal as its exact value: as JCS writes a
// double where the value is the shortest decimal that round-trips one,
// else as significand "E" exponent, which JCS never writes.
func spellExact(lit string) string {
	neg, sig, exp := decimal(lit)
	if sig == "" {
		return "0" // -0 too, as JCS writes it
	}
	// A double's shortest decimal has at most 17 digits.
	if len(sig) <= 17 {
		f, err := strconv.ParseFloat(sig+"e"+strconv.Itoa(exp), 64)
		if err == nil && f != 0 {
			if shortSig, shortExp := shortest(f); shortSig == sig && shortExp == exp {
				if neg {
					f = -f
				}
				if s, err := jcs.NumberToJSON(f); err == nil {
					return s
				}
			}
		}
	}
	sign := ""
	if neg {
		sign = "-"
	}
	return sign + sig + "E" + strconv.Itoa(exp)
}

// decimal reads a JSON number literal as its exact value: sign, the
// significand's digits without leading or trailing zeros ("" for zero)
// and the power of ten they are multiplied by. checkExact has bounded the
// exponent.
func decimal(lit string) (neg bool, sig string, exp int) {
	if lit != "" && lit[0] == '-' {
		neg, lit = true, lit[1:]
	}
	mantissa, exponent, _ := strings.Cut(strings.ReplaceAll(lit, "E", "e"), "e")
	if exponent != "" {
		exp, _ = strconv.Atoi(strings.TrimPrefix(exponent, "+"))
	}
	whole, fraction, _ := strings.Cut(mantissa, ".")
	digits := strings.TrimLeft(whole+fraction, "0")
	exp -= len(fraction)
	trimmed := strings.TrimRight(digits, "0")
	exp += len(digits) - len(trimmed)
	if trimmed == "" {
		return neg, "", 0
	}
	return neg, trimmed, exp
}

// shortest is the shortest decimal that round-trips f, which is positive:
// its digits and their power of ten.
func shortest(f float64) (sig string, exp int) {
	s := strconv.FormatFloat(f, 'e', -1, 64) // "d.ddde±x"
	mantissa, exponent, _ := strings.Cut(s, "e")
	whole, fraction, _ := strings.Cut(mantissa, ".")
	e, _ := strconv.Atoi(exponent)
	return whole + fraction, e - len(fraction)
}

// checkLegacy is the number rule before numbers were exact: it rejects
// integer literals that an IEEE double cannot hold exactly. Literals with
// a fraction or exponent are decimal values whose meaning JCS defines as
// the nearest double, which is what a JSON number means under I-JSON (RFC
// 7493); but that double must not lie beyond ±2^53 either. Every double
// that large is an integer, and JCS writes it out as an integer literal
// ("1e16" becomes "10000000000000000"), which this rule would then reject:
// the canonical form would not canonicalise again.
func checkLegacy(lit string) error {
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

// spellLegacy writes a number literal as JCS does: the nearest double, in
// ECMAScript's form.
func spellLegacy(lit string) string {
	f, _ := strconv.ParseFloat(lit, 64) // checkLegacy has kept it in range
	s, _ := jcs.NumberToJSON(f)
	return s
}

func truncate(s string) string {
	const limit = 40
	if len(s) <= limit {
		return s
	}
	return s[:limit] + "…"
}
