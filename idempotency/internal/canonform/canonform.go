// Package canonform turns an application/x-www-form-urlencoded body into a
// canonical form, so that two bodies that every form parser reads alike
// give the same bytes and therefore the same fingerprint, while two bodies
// that some parser reads differently never do.
//
// What does not change the canonical form (no parser tells these apart):
//
//   - how a byte is spelled: "+" or "%20" for a space, "%7E" or "~",
//     "%2f" or "%2F", a raw byte or its escape;
//   - empty pairs ("a=1&&b=2", a leading or trailing "&").
//
// What does (some parser, or the operation, reads these differently):
//
//   - the order of the fields, all of them: parsers that read "[]" by
//     position build arrays from the order of fields of different names
//     (Rack starts a new element of "items[][sku]=A&items[][qty]=1&..."
//     when a key repeats, PHP appends for each "[]"), and PHP's and Ruby's
//     arrays keep the order of their keys for whoever iterates them. Every
//     parser reads a form as its decoded pairs in order, so two forms with
//     one canonical form are read alike by every one;
//   - "a=" and "a": Rack and others read the first as "" and the second as
//     nil, so merging them could replay one request's answer to the other;
//   - the case of a key, and any decoded byte of a key or value.
//
// Bodies whose meaning is not certain are refused with ErrInvalid rather
// than canonicalised: a malformed percent escape, a ";" (Go refuses it as
// a separator, other frameworks split on it), decoded bytes that are not
// UTF-8 (form bodies are UTF-8, as the WHATWG URL standard defines
// application/x-www-form-urlencoded), and more than MaxFields fields.
package canonform

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"unicode/utf8"
)

// MaxFields bounds a body's fields, as canonjson bounds a document's
// values: request forms carry tens, and what canonicalising allocates and
// sorts grows with them.
const MaxFields = 20_000

// ErrInvalid is returned, wrapped with the reason, for any body that has no
// canonical form under the rules above.
var ErrInvalid = errors.New("invalid form")

// field is one key=value pair, decoded. hasValue tells "a=" from "a".
type field struct {
	key, value string
	hasValue   bool
}

// Canonicalize returns the canonical form of body: its non-empty fields in
// their order, each key and value re-encoded with url.QueryEscape, "="
// kept only where the field had one. A body without fields canonicalises
// to an empty result.
func Canonicalize(body []byte) ([]byte, error) { return canonicalize(body, false) }

// Legacy returns the canonical form of the rules before the order of
// fields was kept: Canonicalize's, its fields stably sorted by decoded
// key. Only the fingerprints of records stored under those rules are
// compared with it.
func Legacy(body []byte) ([]byte, error) { return canonicalize(body, true) }

func canonicalize(body []byte, sorted bool) ([]byte, error) {
	form := string(body)
	if i := strings.IndexByte(form, ';'); i >= 0 {
		return nil, fmt.Errorf("%w: a ';' at byte %d (send it as %%3B; as a separator it is read differently by different servers)", ErrInvalid, i)
	}
	n := 0
	for pair := range strings.SplitSeq(form, "&") {
		if pair != "" {
			n++
		}
	}
	if n > MaxFields {
		return nil, fmt.Errorf("%w: more than %d fields", ErrInvalid, MaxFields)
	}
	fields := make([]field, 0, n)
	for pair := range strings.SplitSeq(form, "&") {
		if pair == "" {
			continue
		}
		rawKey, rawValue, hasValue := strings.Cut(pair, "=")
		key, err := decode(rawKey)
		if err != nil {
			return nil, err
		}
		value, err := decode(rawValue)
		if err != nil {
			return nil, err
		}
		fields = append(fields, field{key, value, hasValue})
	}
	if sorted {
		// Stable: the values of one key keep their order.
		slices.SortStableFunc(fields, func(a, b field) int { return cmp.Compare(a.key, b.key) })
	}
	var out bytes.Buffer
	for i, f := range fields {
		if i > 0 {
			out.WriteByte('&')
		}
		out.WriteString(url.QueryEscape(f.key))
		if f.hasValue {
			out.WriteByte('=')
			out.WriteString(url.QueryEscape(f.value))
		}
	}
	return out.Bytes(), nil
}

// decode percent-decodes one key or value, "+" as a space, and requires
// the result to be UTF-8.
func decode(s string) (string, error) {
	d, err := url.QueryUnescape(s)
	if err != nil {
		return "", fmt.Errorf("%w: %q has a malformed percent escape", ErrInvalid, truncate(s))
	}
	if !utf8.ValidString(d) {
		return "", fmt.Errorf("%w: %q is not UTF-8 once decoded (form bodies are UTF-8)", ErrInvalid, truncate(s))
	}
	return d, nil
}

// truncate keeps an error message short whatever the body holds.
func truncate(s string) string {
	const most = 40
	if len(s) <= most {
		return s
	}
	return s[:most] + "…"
}
