package httpapi

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/google/uuid"

	"github.com/oncekey/oncekey/internal/service/store"
)

func TestHoldsNUL(t *testing.T) {
	t.Parallel()
	for doc, want := range map[string]bool{
		`{"a":"x\u0000y"}`:     true,
		`{"a":"\u0000"}`:       true,
		`{"a":"\\\u0000"}`:     true,  // an escaped backslash, then NUL
		`{"a":"\\u0000"}`:      false, // the text \u0000, backslash escaped
		`{"a":"\\\\u0000"}`:    false,
		`{"a":"u0000"}`:        false,
		`{"a":"\u00000"}`:      true,
		`{"a":"x","\u0000":1}`: true, // in a key too
		``:                     false,
	} {
		if got := holdsNUL([]byte(doc)); got != want {
			t.Errorf("holdsNUL(%s) = %v, want %v", doc, got, want)
		}
	}
}

// TestCallIsFoundByItsKindOfUnit: a handler finds its call only under the
// kind of unit of work its operation was bound with, so a handler wired to
// the wrong store, or reached outside the protocol, fails with errNoUnit
// rather than writing through something else; and a call without a caller
// fails with errNoAccount.
func TestCallIsFoundByItsKindOfUnit(t *testing.T) {
	t.Parallel()
	caller := uuid.New()
	tx := withCall(httptest.NewRequest(http.MethodPost, "/", nil), call[store.Tx]{account: caller}).Context()
	read := withCall(httptest.NewRequest(http.MethodGet, "/", nil), call[noUnit]{account: caller}).Context()
	anonymous := withCall(httptest.NewRequest(http.MethodGet, "/", nil), call[noUnit]{}).Context()
	for _, tc := range []struct {
		name string
		got  func() (uuid.UUID, error)
		want error
	}{
		{"a transaction's call", func() (uuid.UUID, error) { c, err := callFrom[store.Tx](tx); return c.account, err }, nil},
		{"a read's call", func() (uuid.UUID, error) { c, err := callFrom[noUnit](read); return c.account, err }, nil},
		{"another kind of unit", func() (uuid.UUID, error) { c, err := callFrom[store.Deferred](tx); return c.account, err }, errNoUnit},
		{"a read asking for a unit", func() (uuid.UUID, error) { c, err := callFrom[store.Tx](read); return c.account, err }, errNoUnit},
		{"no call at all", func() (uuid.UUID, error) { c, err := callFrom[noUnit](context.Background()); return c.account, err }, errNoUnit},
		{"no caller", func() (uuid.UUID, error) { c, err := callFrom[noUnit](anonymous); return c.account, err }, errNoAccount},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			account, err := tc.got()
			if !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
			if tc.want == nil && account != caller {
				t.Fatalf("account %v, want %v", account, caller)
			}
		})
	}
}

// TestBodiesBindAsValidated: every request body of openapi.yaml binds into
// its generated type from the value its check decoded, so that no
// operation decodes its body twice; a schema that loses it (a default, an
// object open to other members) would only cost time, and this says so.
// A body that could bind otherwise than its bytes decode is not handed on.
func TestBodiesBindAsValidated(t *testing.T) {
	t.Parallel()
	doc, err := LoadSpec()
	if err != nil {
		t.Fatal(err)
	}
	c := newContract(doc)
	if len(c.exact) == 0 {
		t.Fatal("no request body found in openapi.yaml")
	}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if op.RequestBody != nil && !c.exact[op.RequestBody.Value] {
				t.Errorf("%s %s: its body is decoded twice (bindsExactly is false)", method, path)
			}
		}
	}

	for schema, want := range map[string]bool{
		`{"type":"object","additionalProperties":false,"properties":{"a":{"type":"string"}}}`:              true,
		`{"type":"object","properties":{"a":{"type":"string"}}}`:                                           false, // "A" binds to a only from the bytes
		`{"type":"object","additionalProperties":false,"properties":{"a":{"type":"integer","default":1}}}`: false,
		`{"type":"array","items":{"type":"string","nullable":true}}`:                                       false,
		`{"type":"array","items":{"type":"integer"}}`:                                                      true,
		`{"oneOf":[{"type":"string"}]}`:                                                                    false,
	} {
		var s openapi3.Schema
		if err := s.UnmarshalJSON([]byte(schema)); err != nil {
			t.Fatalf("%s: %v", schema, err)
		}
		if got := bindsExactly(openapi3.NewSchemaRef("", &s), map[*openapi3.Schema]bool{}); got != want {
			t.Errorf("bindsExactly(%s) = %v, want %v", schema, got, want)
		}
	}
}

// TestKeySchema: kin-openapi leaves the Idempotency-Key header to
// idempotency.ParseKey only while the header's schema in openapi.yaml
// accepts every key ParseKey does; a stricter one is checked as before.
func TestKeySchema(t *testing.T) {
	t.Parallel()
	doc, err := LoadSpec()
	if err != nil {
		t.Fatal(err)
	}
	p := doc.Components.Parameters["IdempotencyKey"]
	if p == nil || !keySchema(p.Value) {
		t.Fatal("openapi.yaml's Idempotency-Key header is checked twice: its schema is not the one ParseKey enforces")
	}
	stricter := *p.Value.Schema.Value
	limit := uint64(64)
	stricter.MaxLength = &limit
	if keySchema(&openapi3.Parameter{Schema: openapi3.NewSchemaRef("", &stricter)}) {
		t.Error("a header of at most 64 characters would be left unchecked")
	}
	stricter = *p.Value.Schema.Value
	stricter.Pattern = "^[a-z]+$"
	if keySchema(&openapi3.Parameter{Schema: openapi3.NewSchemaRef("", &stricter)}) {
		t.Error("a header with another pattern would be left unchecked")
	}
}

// TestIntegerSpelling: a number the fingerprint counts as an integer
// (1.2e3, 2.0) binds as one; what is no integer, or beyond int64, is left
// to the contract and the decoder.
func TestIntegerSpelling(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ lit, want string }{
		{"2.0", "2"}, {"1.2e3", "1200"}, {"-1.50E+1", "-15"}, {"0.0e5", "0"}, {"-0.0", "0"},
		{"1000e-3", "1"}, {"9.223372036854775807e18", "9223372036854775807"},
		{"2", ""}, {"2.5", ""}, {"1e-1", ""}, {"1e19", ""}, {"1e999999999", ""},
	} {
		if got, ok := integerSpelling(tc.lit); got != tc.want || ok != (tc.want != "") {
			t.Errorf("integerSpelling(%q) = %q, %v; want %q", tc.lit, got, ok, tc.want)
		}
	}
}
