package frontdoor_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/frontdoor"
)

// TestProfileStatuses: ietf answers a duplicate in flight 409 and a
// reused key 422; oncekey 202 and 409; both keep 409 for an unknown
// outcome and 400 for a missing key.
func TestProfileStatuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err           error
		ietf, oncekey int
	}{
		{idempotency.ErrInFlight, http.StatusConflict, http.StatusAccepted},
		{idempotency.ErrKeyMismatch, http.StatusUnprocessableEntity, http.StatusConflict},
		{idempotency.ErrOutcomeUnknown, http.StatusConflict, http.StatusConflict},
		{idempotency.ErrNotStored, http.StatusConflict, http.StatusConflict},
		{idempotency.ErrMissingKey, http.StatusBadRequest, http.StatusBadRequest},
	} {
		t.Run(tc.err.Error(), func(t *testing.T) {
			t.Parallel()
			for p, want := range map[frontdoor.Profile]int{frontdoor.IETF: tc.ietf, frontdoor.Oncekey: tc.oncekey} {
				got := p.ProblemOf(tc.err)
				require.Equal(t, want, got.Status, "profile %s", p)
			}
		})
	}
	p, err := frontdoor.ParseProfile("")
	require.NoError(t, err)
	require.Equal(t, frontdoor.IETF, p, "the default profile")
	_, err = frontdoor.ParseProfile("stripe")
	require.Error(t, err)
}

// TestTemplateFilledAndEscaped: each placeholder is filled in, escaped as
// JSON (quotes, newlines, backslashes), the document's order and other
// strings kept, and the answer is application/json with its status and the
// headers set before.
func TestTemplateFilledAndEscaped(t *testing.T) {
	t.Parallel()
	tmpl, err := frontdoor.ParseTemplate([]byte(`{"error": {"type": "idempotency_error", "code": "{code}", "message": "{detail}", "also": "{title} ({status}) at {type}", "n": 1.50, "braces": "{} {a b}", "list": ["{code}", true, null]}}`))
	require.NoError(t, err)
	w := httptest.NewRecorder()
	w.Header().Set("Retry-After", "1")
	frontdoor.Write(w, tmpl, frontdoor.Answer{Status: 422, Type: "about:blank", Code: idempotency.ProblemOf(idempotency.ErrKeyMismatch).Slug, Title: "T", Detail: "say \"no\"\nthen \\ </b>"})
	require.Equal(t, 422, w.Code)
	require.Equal(t, "application/json", w.Header().Get("Content-Type"))
	require.Equal(t, "1", w.Header().Get("Retry-After"))
	body := w.Body.String()
	want := `{"error": {"type": "idempotency_error", "code": "SLUG", "message": "say \"no\"\nthen \\ </b>", "also": "T (422) at about:blank", "n": 1.50, "braces": "{} {a b}", "list": ["SLUG", true, null]}}`
	require.Equal(t, strings.ReplaceAll(want, "SLUG", idempotency.ProblemOf(idempotency.ErrKeyMismatch).Slug), body)
	var doc struct{ Error struct{ Message string } }
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &doc), body)
	require.Equal(t, "say \"no\"\nthen \\ </b>", doc.Error.Message)
}

// TestTemplateRefused: a template that is not JSON, or names a placeholder
// that does not exist, is refused with one line that says so.
func TestTemplateRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, doc, want string }{
		{"not json", `{"error": `, "not a JSON document"},
		{"empty", ``, "not a JSON document"},
		{"unknown placeholder", `{"error": {"message": "{foo}"}}`, "unknown placeholder {foo}"},
		{"unknown placeholder in an array", `["{detail} {Code}"]`, "unknown placeholder {Code}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := frontdoor.ParseTemplate([]byte(tc.doc))
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), "\n", "one line")
		})
	}
}

// TestKeyPlace: the key is read from the header or body member named, with
// the engine's rules; a missing key is ErrMissingKey and any other fault
// is a 400 of the protocol.
func TestKeyPlace(t *testing.T) {
	t.Parallel()
	header := func(name string, values ...string) http.Header {
		h := http.Header{}
		for _, v := range values {
			h.Add(name, v)
		}
		return h
	}
	for _, tc := range []struct {
		name    string
		place   frontdoor.KeyPlace
		h       http.Header
		body    string
		want    string
		wantErr error
	}{
		{"default header", frontdoor.KeyPlace{}, header("Idempotency-Key", "k1"), "", "k1", nil},
		{"x-idempotency-key", frontdoor.KeyPlace{Header: "x-idempotency-key"}, header("X-Idempotency-Key", "k2"), "", "k2", nil},
		{"x-idempotency-key missing", frontdoor.KeyPlace{Header: "X-Idempotency-Key"}, header("Idempotency-Key", "k2"), "", "", idempotency.ErrMissingKey},
		{"paypal twice", frontdoor.KeyPlace{Header: "PayPal-Request-Id"}, header("PayPal-Request-Id", "a", "b"), "", "", idempotency.ErrInvalidKey},
		{"header not printable", frontdoor.KeyPlace{Header: "PayPal-Request-Id"}, header("PayPal-Request-Id", "a\x01"), "", "", idempotency.ErrInvalidKey},
		{"body field", frontdoor.KeyPlace{BodyField: "/idempotency_key"}, header("Idempotency-Key", "no"), `{"amount":1,"idempotency_key":"k3"}`, "k3", nil},
		{"nested body field", frontdoor.KeyPlace{BodyField: "/meta/a~1b/0"}, nil, `{"meta":{"a/b":["k4"]}}`, "k4", nil},
		{"body field missing", frontdoor.KeyPlace{BodyField: "/idempotency_key"}, nil, `{"amount":1}`, "", idempotency.ErrMissingKey},
		{"body field a number", frontdoor.KeyPlace{BodyField: "/idempotency_key"}, nil, `{"idempotency_key":12}`, "", idempotency.ErrInvalidKey},
		{"body field too long", frontdoor.KeyPlace{BodyField: "/k"}, nil, `{"k":"` + strings.Repeat("a", 256) + `"}`, "", idempotency.ErrInvalidKey},
		{"body not json", frontdoor.KeyPlace{BodyField: "/k"}, nil, `k=1`, "", idempotency.ErrMalformedBody},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.NoError(t, tc.place.Check())
			key, err := tc.place.Key(tc.h, []byte(tc.body))
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				p := idempotency.ProblemOf(err)
				require.Equal(t, http.StatusBadRequest, p.Status)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, key)
		})
	}
	require.Error(t, frontdoor.KeyPlace{Header: "X-Idempotency-Key", BodyField: "/k"}.Check())
	require.Error(t, frontdoor.KeyPlace{BodyField: "idempotency_key"}.Check())
}

// TestNoTemplateIsTheEnginesProblem: without a template, the oncekey
// profile writes byte for byte what the engine's own writer does.
func TestNoTemplateIsTheEnginesProblem(t *testing.T) {
	t.Parallel()
	for _, err := range []error{idempotency.ErrKeyMismatch, idempotency.ErrInFlight, idempotency.ErrMissingKey, idempotency.ErrUnavailable} {
		ours, engine := httptest.NewRecorder(), httptest.NewRecorder()
		frontdoor.Writer(frontdoor.Oncekey, nil, "https://example.com/p/")(ours, nil, err)
		idempotency.ProblemWriter("https://example.com/p/")(engine, nil, err)
		require.Equal(t, engine.Code, ours.Code, "%v", err)
		require.Equal(t, engine.Header(), ours.Header(), "%v", err)
		require.Equal(t, engine.Body.String(), ours.Body.String(), "%v", err)
	}
}
