package canonform_test

import (
	"net/url"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/oncekey/oncekey/idempotency/internal/canonform"
)

// FuzzCanonicalForm: a body that canonicalises means what its canonical
// form means, to a decoder written here apart from the package's (a key's
// values in order, each with or without "="), and to Go's own url.ParseQuery;
// and the canonical form is its own canonical form.
func FuzzCanonicalForm(f *testing.F) {
	for _, seed := range []string{
		orderForm,
		"b=2&a=1",
		"a[]=1&a[]=2&a[]=1",
		"a=&a&a=",
		"note=gift+wrap&note=gift%20wrap",
		"k%7e=%7E~&K=%c3%a9",
		"=&=1&&&",
		"a=b=c&%3D=%26",
		"order[items][][sku]=A&order[items][][qty]=1&order[items][][sku]=B&order[items][][qty]=5",
		"a[]=x&a[0]=y&a.b=1&a_b=2&a%5B=3",
		"a=1%2B1&b=+",
		"name=Jos\u00e9&city=%E4%B8%96%E7%95%8C",
		"a=1;b=2",
		"a=%",
		"a=%zz",
		"a=%ff",
		"\xff=1",
		"",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		t.Parallel()
		canonical, err := canonform.Canonicalize(body)
		if err != nil {
			return
		}
		again, err := canonform.Canonicalize(canonical)
		if err != nil {
			t.Fatalf("the canonical form %q of %q is refused: %v", canonical, body, err)
		}
		if string(again) != string(canonical) {
			t.Fatalf("not its own canonical form:\nbody:      %q\ncanonical: %q\nagain:     %q", body, canonical, again)
		}
		want, ok := decodeForm(string(body))
		if !ok {
			t.Fatalf("%q was canonicalised, but the test's decoder refuses it", body)
		}
		got, ok := decodeForm(string(canonical))
		if !ok || !reflect.DeepEqual(want, got) {
			t.Fatalf("the canonical form means something else:\nbody:      %q → %v\ncanonical: %q → %v", body, want, canonical, got)
		}
		// Rack and PHP read the canonical form as they read the body, so
		// two bodies of one canonical form are read alike by both.
		if r1, r2 := rackRead(string(body)), rackRead(string(canonical)); r1 != r2 {
			t.Fatalf("Rack reads them differently:\nbody:      %q → %s\ncanonical: %q → %s", body, r1, canonical, r2)
		}
		if p1, p2 := phpRead(string(body)), phpRead(string(canonical)); p1 != p2 {
			t.Fatalf("PHP reads them differently:\nbody:      %q → %s\ncanonical: %q → %s", body, p1, canonical, p2)
		}
		goWant, err1 := url.ParseQuery(string(body))
		goGot, err2 := url.ParseQuery(string(canonical))
		if err1 != nil || err2 != nil || !reflect.DeepEqual(goWant, goGot) {
			t.Fatalf("url.ParseQuery reads them differently:\nbody:      %q → %v (%v)\ncanonical: %q → %v (%v)", body, goWant, err1, canonical, goGot, err2)
		}
	})
}

// formField is one field of a form, decoded.
type formField struct {
	key   string
	value formValue
}

// formValue is one value of a key as a strict parser reads it: nil ("a")
// and "" ("a=") differ.
type formValue struct {
	value     string
	hasEquals bool
}

// decodeForm reads body as the WHATWG urlencoded parser does, but keeps
// "a" and "a=" apart, as its pairs in order, so that two bodies that
// decode equal mean the same to every parser (Rack's and PHP's read a
// form's decoded pairs in order). false: body has a ";", a malformed
// escape or decodes to invalid UTF-8.
func decodeForm(body string) ([]formField, bool) {
	var out []formField
	for pair := range strings.SplitSeq(body, "&") {
		if pair == "" {
			continue
		}
		if strings.Contains(pair, ";") {
			return nil, false
		}
		k, v, hasEquals := strings.Cut(pair, "=")
		key, ok1 := unescape(k)
		value, ok2 := unescape(v)
		if !ok1 || !ok2 {
			return nil, false
		}
		out = append(out, formField{key, formValue{value, hasEquals}})
	}
	return out, true
}

// unescape decodes "+" and "%XX" by hand, not with net/url, so that the
// test does not share the package's decoder.
func unescape(s string) (string, bool) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '+':
			b.WriteByte(' ')
		case '%':
			if i+2 >= len(s) {
				return "", false
			}
			hi, ok1 := hexValue(s[i+1])
			lo, ok2 := hexValue(s[i+2])
			if !ok1 || !ok2 {
				return "", false
			}
			b.WriteByte(hi<<4 | lo)
			i += 2
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), utf8.ValidString(b.String())
}

func hexValue(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
