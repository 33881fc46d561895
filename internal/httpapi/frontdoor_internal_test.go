package httpapi

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/internal/store"
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
