package idempotency_test

import (
	"context"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
)

// upgradeBundle is an operation on POST /orders/{id} over a memstore that
// a test can write records into as an older engine did.
type upgradeBundle struct {
	store   *memstore.Store
	handler http.Handler
	runs    atomic.Int64
}

func setupUpgrade(t *testing.T) *upgradeBundle {
	t.Helper()
	b := &upgradeBundle{store: memstore.New()}
	engine := idempotency.New(idempotency.Config{Scope: func(*http.Request) (string, error) { return "tenant", nil }})
	op := idempotency.NewOperation(engine, b.store, idempotency.OperationConfig{})
	mux := http.NewServeMux()
	mux.Handle("POST /orders/{id}", op.HandlerFunc(func(w http.ResponseWriter, _ *http.Request, _ *memstore.Tx) {
		b.runs.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"stored":"after"}`))
	}))
	b.handler = mux
	return b
}

// storeBefore stores a 201 under key with fingerprint fp, as an engine
// before the upgrade did.
func (b *upgradeBundle) storeBefore(t *testing.T, key, fp string) {
	t.Helper()
	raw, err := hex.DecodeString(fp)
	require.NoError(t, err)
	var f idempotency.Fingerprint
	copy(f[:], raw)
	ctx := context.Background()
	lease, rec, err := b.store.Claim(ctx, idempotency.ClaimRequest{
		Scope: "tenant", Key: key, Fingerprint: f, Method: http.MethodPost, Route: "/orders/{id}", TTL: time.Hour, Wait: time.Second,
	})
	require.NoError(t, err)
	require.Nil(t, rec)
	require.NoError(t, lease.Commit(ctx, idempotency.Response{
		Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"stored":"before"}`),
	}))
}

func (b *upgradeBundle) send(t *testing.T, key, contentType, body string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/orders/42?b=2&a=1&a=0", strings.NewReader(body))
	req.Header.Set(idempotency.HeaderKey, key)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	rec := httptest.NewRecorder()
	b.handler.ServeHTTP(rec, req)
	return rec
}

// TestRecordsStoredBeforeTheUpgradeStillReplay: a record stored with a
// fingerprint of the rules before exact numbers, ordered forms and hashed
// JSON media types (pinned in fingerprint_internal_test.go) is still
// replayed to the request it was stored for, and to no other.
func TestRecordsStoredBeforeTheUpgradeStillReplay(t *testing.T) {
	t.Parallel()
	const form = "application/x-www-form-urlencoded"
	tests := []struct {
		name, fp, contentType, body string
		replayed                    bool
	}{
		{"JSON", idempotency.LegacyPinnedJSON, "application/json", idempotency.LegacyPinnedBody, true},
		{"JSON as merge-patch, which was not hashed then", idempotency.LegacyPinnedJSON, "application/merge-patch+json", idempotency.LegacyPinnedBody, true},
		{"decimals", idempotency.LegacyPinnedDecimals, "application/json", idempotency.LegacyDecimalsBody, true},
		{"Rack-style form", idempotency.LegacyPinnedForm, form, idempotency.LegacyFormBody, true},
		{"another amount", idempotency.LegacyPinnedDecimals, "application/json", `{"amount":1,"rate":1,"n":0}`, false},
		{"another form", idempotency.LegacyPinnedForm, form, "order[items][][sku]=A", false},
		{"the empty body's record and a body", idempotency.LegacyPinnedEmpty, "application/json", `{}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setupUpgrade(t)
			b.storeBefore(t, "k", tt.fp)
			rec := b.send(t, "k", tt.contentType, tt.body)
			if tt.replayed {
				require.Equal(t, http.StatusCreated, rec.Code, "%s", rec.Body)
				require.Equal(t, "true", rec.Header().Get(idempotency.HeaderReplayed), "%s", rec.Body)
				require.JSONEq(t, `{"stored":"before"}`, rec.Body.String())
			} else {
				requireProblem(t, rec, idempotency.ProblemOf(idempotency.ErrKeyMismatch))
			}
			require.Zero(t, b.runs.Load(), "nothing ran under a stored key")
		})
	}
}

// TestRecordsOfTheCurrentRulesNeverMatchALegacyFingerprint: under the
// legacy rules 123456789.12345679 and 123456789.123456789123 were one
// request; a record stored now, with the marker, is compared only with
// the current fingerprint, under which they are two.
func TestRecordsOfTheCurrentRulesNeverMatchALegacyFingerprint(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, first, then string }{
		{"doubles, then decimals", `{"amount":123456789.12345679,"rate":1,"n":0}`, idempotency.LegacyDecimalsBody},
		{"decimals, then doubles", idempotency.LegacyDecimalsBody, `{"amount":123456789.12345679,"rate":1,"n":0}`},
		{"a form, then sorted", idempotency.LegacyFormBody, "order[items][][qty]=1&order[items][][qty]=5&order[items][][sku]=A&order[items][][sku]=B"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupUpgrade(t)
			contentType := "application/json"
			if !strings.HasPrefix(tc.first, "{") {
				contentType = "application/x-www-form-urlencoded"
			}
			first := b.send(t, "k", contentType, tc.first)
			require.Equal(t, http.StatusCreated, first.Code, "%s", first.Body)
			requireProblem(t, b.send(t, "k", contentType, tc.then), idempotency.ProblemOf(idempotency.ErrKeyMismatch))
			again := b.send(t, "k", contentType, tc.first)
			require.Equal(t, "true", again.Header().Get(idempotency.HeaderReplayed), "the same request replays")
			require.EqualValues(t, 1, b.runs.Load())
		})
	}
}
