package idempotency_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
)

// ttlBundle is an operation kept for 90 minutes, whose handler claims a
// retention of its own (5) and blocks while its body says "block" until
// release is closed.
type ttlBundle struct {
	handler http.Handler
	started chan struct{}
	release chan struct{}
}

func setupTTL(t *testing.T, cfg idempotency.OperationConfig) *ttlBundle {
	t.Helper()
	b := &ttlBundle{started: make(chan struct{}, 1), release: make(chan struct{})}
	engine := idempotency.New(idempotency.Config{
		Scope: func(*http.Request) (string, error) { return "tenant", nil },
		TTL:   48 * time.Hour,
		// An adopter that lists the header among the replayed still
		// replays the operation's retention, not the stored one.
		ReplayHeaders: []string{"Content-Type", "Idempotency-TTL"},
	})
	op := idempotency.NewOperation(engine, memstore.New(), cfg)
	b.handler = op.HandlerFunc(func(w http.ResponseWriter, r *http.Request, _ *memstore.Tx) {
		if r.Header.Get("X-Block") != "" {
			b.started <- struct{}{}
			<-b.release
		}
		w.Header().Set("Idempotency-TTL", "5")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"ok":true}`))
	})
	return b
}

func (b *ttlBundle) post(key, body string, header ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/things", strings.NewReader(body))
	if key != "" {
		req.Header.Set(idempotency.HeaderKey, key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	b.handler.ServeHTTP(rec, req)
	return rec
}

// TestAnswersCarryIdempotencyTTL: every answer Serve gives (the first, a
// replay, a duplicate in flight, a mismatch) carries Idempotency-TTL, the
// operation's TTL in whole seconds, whatever the handler set; a request
// refused before its key is looked at (none, or an invalid one) does not.
func TestAnswersCarryIdempotencyTTL(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		cfg    idempotency.OperationConfig
		answer func(t *testing.T, b *ttlBundle) *httptest.ResponseRecorder
		status int
		want   string // "" for no header
	}{
		{
			name:   "first answer, the engine's TTL",
			answer: func(_ *testing.T, b *ttlBundle) *httptest.ResponseRecorder { return b.post("k", `{}`) },
			status: http.StatusCreated, want: "172800",
		},
		{
			name:   "first answer, the operation's TTL rounded down",
			cfg:    idempotency.OperationConfig{TTL: 90*time.Minute + 900*time.Millisecond},
			answer: func(_ *testing.T, b *ttlBundle) *httptest.ResponseRecorder { return b.post("k", `{}`) },
			status: http.StatusCreated, want: "5400",
		},
		{
			name: "replay",
			cfg:  idempotency.OperationConfig{TTL: time.Hour},
			answer: func(t *testing.T, b *ttlBundle) *httptest.ResponseRecorder {
				require.Equal(t, http.StatusCreated, b.post("k", `{}`).Code, "the first request")
				rec := b.post("k", `{}`)
				require.Equal(t, "true", rec.Header().Get(idempotency.HeaderReplayed), "the second is a replay")
				return rec
			},
			status: http.StatusCreated, want: "3600",
		},
		{
			name: "duplicate in flight",
			cfg:  idempotency.OperationConfig{TTL: time.Hour, Wait: time.Millisecond},
			answer: func(t *testing.T, b *ttlBundle) *httptest.ResponseRecorder {
				first := make(chan *httptest.ResponseRecorder, 1)
				go func() { first <- b.post("k", `{}`, "X-Block", "1") }()
				<-b.started
				rec := b.post("k", `{}`)
				close(b.release)
				require.Equal(t, "3600", (<-first).Header().Get("Idempotency-TTL"), "the first request's answer")
				return rec
			},
			status: http.StatusAccepted, want: "3600",
		},
		{
			name: "mismatch",
			cfg:  idempotency.OperationConfig{TTL: time.Hour},
			answer: func(t *testing.T, b *ttlBundle) *httptest.ResponseRecorder {
				require.Equal(t, http.StatusCreated, b.post("k", `{"a":1}`).Code, "the first request")
				return b.post("k", `{"a":2}`)
			},
			status: http.StatusConflict, want: "3600",
		},
		{
			name:   "held operation: at least its lease",
			cfg:    idempotency.OperationConfig{TTL: time.Minute, Held: &idempotency.HeldConfig{Lease: 2 * time.Hour}},
			answer: func(_ *testing.T, b *ttlBundle) *httptest.ResponseRecorder { return b.post("k", `{}`) },
			status: http.StatusCreated, want: "7200",
		},
		{
			name:   "no key",
			cfg:    idempotency.OperationConfig{TTL: time.Hour},
			answer: func(_ *testing.T, b *ttlBundle) *httptest.ResponseRecorder { return b.post("", `{}`) },
			status: http.StatusBadRequest,
		},
		{
			name:   "invalid key",
			cfg:    idempotency.OperationConfig{TTL: time.Hour},
			answer: func(_ *testing.T, b *ttlBundle) *httptest.ResponseRecorder { return b.post("\x01", `{}`) },
			status: http.StatusBadRequest,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setupTTL(t, tt.cfg)
			rec := tt.answer(t, b)
			require.Equal(t, tt.status, rec.Code, "the answer's status: %s", rec.Body)
			require.Equal(t, tt.want, rec.Header().Get("Idempotency-TTL"), "the answer's Idempotency-TTL")
			require.Len(t, rec.Header().Values("Idempotency-TTL"), min(1, len(tt.want)), "one value at most")
		})
	}
}
