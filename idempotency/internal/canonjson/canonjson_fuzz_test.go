package canonjson_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/oncekey/oncekey/idempotency/internal/canonjson"
	"github.com/oncekey/oncekey/idempotency/internal/jsonmeaning"
)

// fuzzSeeds are representative documents for both fuzz targets. More
// seeds, including inputs that once broke a property, live under
// testdata/fuzz/.
var fuzzSeeds = []string{
	orderBody,
	`{"currency":"RUB","amount":1200,"items":[{"qty":2,"sku":"SKU-1"}]}`,
	"{\n  \"items\": [\n    {\"sku\": \"SKU-1\", \"qty\": 2.0}\n  ],\n  \"amount\": 12e2,\n  \"currency\": \"\\u0052UB\"\n}\n",
	`{"a":{"b":{"c":[1,[2,[3,{"d":null}]]]}},"e":[true,false]}`,
	`[[],{},[{}],{"":[]}]`,
	`{"numbers":[333333333.33333329,4.50,2e-3,0.000000000000000000000000001,-0,5e-324]}`,
	`[9007199254740992,-9007199254740992,9007199254740991,0.1,1e-7,123456789012345.6]`,
	`{"amount":123456789.123456789123,"rate":1.00000000000000000001,"big":9007199254740993,"z":-0}`,
	`{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew","1":"One","\ud83d\ude00":"Emoji","\u0080":"Control","\u00f6":"o"}`,
	`"\u0041\u00e9\u2028\ud83d\ude00\\\"\/\b\f\n\r\t\u001f"`,
	`"Привет, 世界 😀"`,
	`true`,
	`null`,
	`42`,
	``,
	` `,
}

// decode parses doc into what it means (jsonmeaning: numbers as exact
// decimals), the meaning model of Canonicalize: two documents mean the
// same thing exactly when their decoded values are reflect.DeepEqual. ok
// is false for a document with a number too large to decode exactly in a
// test.
func decode(t *testing.T, doc []byte) (v any, ok bool) {
	t.Helper()
	v, err := jsonmeaning.Decode(doc)
	if errors.Is(err, jsonmeaning.ErrHugeExponent) {
		return nil, false
	}
	if err != nil {
		t.Fatalf("jsonmeaning.Decode(%q): %v", doc, err)
	}
	return v, true
}

// isJSONWhitespace reports whether doc consists only of the four
// whitespace characters RFC 8259 allows between tokens.
func isJSONWhitespace(doc []byte) bool {
	return len(bytes.Trim(doc, " \t\r\n")) == 0
}

func FuzzCanonicalize(f *testing.F) {
	for _, seed := range fuzzSeeds {
		f.Add([]byte(seed))
	}
	f.Add([]byte(strings.Repeat("[", canonjson.MaxDepth) + strings.Repeat("]", canonjson.MaxDepth)))

	f.Fuzz(func(t *testing.T, data []byte) {
		t.Parallel()
		out, err := canonjson.Canonicalize(data)
		if err != nil {
			return
		}

		if len(out) == 0 {
			// Only a body without a value has an empty canonical form.
			if !isJSONWhitespace(data) {
				t.Fatalf("Canonicalize(%q) = empty, but the input is not empty or JSON whitespace", data)
			}
			return
		}

		// (a) The canonical form is a fixed point.
		again, err := canonjson.Canonicalize(out)
		if err != nil {
			t.Fatalf("Canonicalize(%q) = %q, which does not canonicalise again: %v", data, out, err)
		}
		if !bytes.Equal(again, out) {
			t.Fatalf("Canonicalize not idempotent:\n  input  %q\n  once   %q\n  twice  %q", data, out, again)
		}

		// (b) The canonical form means what the input meant.
		in, ok := decode(t, data)
		if !ok {
			return
		}
		canon, _ := decode(t, out)
		if !reflect.DeepEqual(in, canon) {
			t.Fatalf("canonical form changes meaning:\n  input     %q decodes to %#v\n  canonical %q decodes to %#v", data, in, out, canon)
		}

		// (c) Another spelling of the same value (Go's own encoder: other
		// whitespace, other key order, other escapes; numbers as spelled)
		// reaches the same canonical form.
		var raw any
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		if err := dec.Decode(&raw); err != nil {
			t.Fatalf("json.Decode(%q): %v", data, err)
		}
		respelled, err := json.MarshalIndent(raw, "", "\t")
		if err != nil {
			t.Fatalf("json.MarshalIndent(%#v) from input %q: %v", in, data, err)
		}
		fromRespelled, err := canonjson.Canonicalize(respelled)
		if err != nil {
			t.Fatalf("input %q canonicalises, but its re-encoding %q does not: %v", data, respelled, err)
		}
		if !bytes.Equal(fromRespelled, out) {
			t.Fatalf("same value, different canonical forms:\n  input      %q -> %q\n  re-encoded %q -> %q", data, out, respelled, fromRespelled)
		}
	})
}

func FuzzDifferentMeaning(f *testing.F) {
	for i, a := range fuzzSeeds {
		f.Add([]byte(a), []byte(fuzzSeeds[(i+1)%len(fuzzSeeds)]))
	}
	f.Add([]byte(orderBody), []byte(`{"currency":"RUB","amount":1200,"items":[{"qty":2,"sku":"SKU-1"}]}`))
	f.Add([]byte(orderBody), []byte(`{"items":[{"sku":"SKU-1","qty":2}],"amount":1201,"currency":"RUB"}`))
	f.Add([]byte(`9007199254740992`), []byte(`9007199254740993`))
	f.Add([]byte(`1`), []byte(`"1"`))
	f.Add([]byte(`[1,2]`), []byte(`[2,1]`))
	f.Add([]byte(`"\u0041"`), []byte(`"A"`))
	f.Add([]byte(`1.0`), []byte(`1`))
	f.Add([]byte(`123456789.123456789123`), []byte(`123456789.12345679`))
	f.Add([]byte(`1.00000000000000000001`), []byte(`1`))

	f.Fuzz(func(t *testing.T, a, b []byte) {
		t.Parallel()
		outA, errA := canonjson.Canonicalize(a)
		outB, errB := canonjson.Canonicalize(b)
		if errA != nil || errB != nil || !bytes.Equal(outA, outB) {
			return
		}
		if len(outA) == 0 {
			// Both bodies are empty; there is no value to compare.
			if !isJSONWhitespace(a) || !isJSONWhitespace(b) {
				t.Fatalf("%q and %q share the empty canonical form, but are not both empty or JSON whitespace", a, b)
			}
			return
		}
		va, okA := decode(t, a)
		vb, okB := decode(t, b)
		if !okA || !okB {
			return
		}
		if !reflect.DeepEqual(va, vb) {
			t.Fatalf("different meanings share canonical form %q:\n  %q decodes to %#v\n  %q decodes to %#v", outA, a, va, b, vb)
		}
	})
}
