package idempotency

import (
	"encoding/hex"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"
)

// Fingerprints computed by the engine before numbers were exact, forms
// kept their order and JSON media types were hashed (at 1b8732c): records
// stored then carry them, and legacyFingerprint must give them still, or
// those records stop replaying on upgrade. upgrade_test.go replays records
// stored with them.
const (
	LegacyPinnedJSON     = "a20ea71cab2b0ce05dfc5997af772e2aa5e399c7ebffebeb033d0d5b96723ad3"
	LegacyPinnedBody     = `{"currency":"RUB","amount":1.2e3,"items":[{"qty":2,"sku":"SKU-1"}]}`
	LegacyPinnedDecimals = "ff4fa1951deda179f5dc265aab2c96780a8a513f30196b456f8cd1ff3055d489"
	LegacyDecimalsBody   = `{"amount":123456789.123456789123,"rate":1.00000000000000000001,"n":-0}`
	LegacyPinnedForm     = "a3a5129d893402d5ec9cb8369d39f1afb98c3e061488a35b0a2f9a4024d74f3f"
	LegacyFormBody       = "order[items][][sku]=A&order[items][][qty]=1&order[items][][sku]=B&order[items][][qty]=5"
	LegacyPinnedEmpty    = "c9c6df65596b897cb9f4a8418204230153904a47136befe10b275191c536271e"
)

// LegacyPinnedQuery is the query of every pinned request but the empty one.
var LegacyPinnedQuery = url.Values{"b": {"2"}, "a": {"1", "0"}}

func TestLegacyFingerprintsArePinned(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, contentType, body, want string
	}{
		{"JSON", "", LegacyPinnedBody, LegacyPinnedJSON},
		// The media type of JSON was not hashed.
		{"JSON as application/json", "application/json", LegacyPinnedBody, LegacyPinnedJSON},
		{"JSON with a charset", "application/json; charset=utf-8", LegacyPinnedBody, LegacyPinnedJSON},
		{"JSON, type in capitals", "Application/JSON", LegacyPinnedBody, LegacyPinnedJSON},
		{"JSON as merge-patch", "application/merge-patch+json", LegacyPinnedBody, LegacyPinnedJSON},
		{"JSON with a broken parameter", "application/json; =broken", LegacyPinnedBody, LegacyPinnedJSON},
		// Numbers were doubles: one fingerprint for both spellings.
		{"decimals", "application/json", LegacyDecimalsBody, LegacyPinnedDecimals},
		{"decimals as doubles", "application/json", `{"amount":123456789.12345679,"rate":1,"n":0}`, LegacyPinnedDecimals},
		// Forms were sorted by name.
		{"form", "application/x-www-form-urlencoded", LegacyFormBody, LegacyPinnedForm},
		{"form sorted", "application/x-www-form-urlencoded", "order[items][][qty]=1&order[items][][qty]=5&order[items][][sku]=A&order[items][][sku]=B", LegacyPinnedForm},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fp, ok := legacyFingerprint("POST", "/orders/{id}", "/orders/42", LegacyPinnedQuery, tt.contentType, []byte(tt.body))
			require.True(t, ok, "the legacy rules fingerprint %q", tt.body)
			require.Equal(t, tt.want, hex.EncodeToString(fp[:]), "legacy fingerprint of %q as %q", tt.body, tt.contentType)
			require.False(t, fp.current(), "a legacy fingerprint has no marker")
			now, err := Request{Method: "POST", Route: "/orders/{id}", Path: "/orders/42", Query: LegacyPinnedQuery.Encode(), ContentType: tt.contentType, Body: []byte(tt.body)}.Fingerprint()
			require.NoError(t, err)
			require.True(t, now.current(), "the current rules' fingerprint has the marker")
			require.NotEqual(t, fp, now)
		})
	}
	// A body without content was no body, whatever it was labelled.
	for _, tc := range []struct{ contentType, body string }{
		{"", ""}, {"application/json", " \n"}, {"application/x-www-form-urlencoded", ""},
		{"application/x-www-form-urlencoded", "&&"}, {"application/octet-stream", ""}, {"not a media type", ""},
	} {
		fp, ok := legacyFingerprint("POST", "/things", "/things", url.Values{}, tc.contentType, []byte(tc.body))
		require.True(t, ok)
		require.Equal(t, LegacyPinnedEmpty, hex.EncodeToString(fp[:]), "Content-Type %q, body %q", tc.contentType, tc.body)
	}
	// What the legacy rules refused has no legacy fingerprint.
	_, ok := legacyFingerprint("POST", "/x", "/x", nil, "", []byte(`9007199254740993`))
	require.False(t, ok, "an integer beyond 2^53 had no legacy fingerprint")
}
