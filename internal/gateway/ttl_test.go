package gateway_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/internal/gateway"
	"github.com/oncekey/oncekey/internal/gateway/keyscope"
)

// TestAnswersCarryTheGatewaysTTL: every answer of a covered route to a
// request with a key (the upstream's, its replay, a stream passed
// through, a mismatch, the gateway's own 502) carries Idempotency-TTL, the
// route's retention in seconds (--ttl, or the route's ttl), in place of
// the one the upstream sent: it is the gateway that keeps the key. A
// request without a key is refused without it.
func TestAnswersCarryTheGatewaysTTL(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Idempotency-TTL", "5") // the upstream's own: not the gateway's to pass on
		if r.URL.Path == "/events" {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = w.Write([]byte("data: one\n\n"))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"t1"}`))
	}))
	t.Cleanup(up.Close)
	cfg := gateway.Config{
		Upstream: mustURL(t, up.URL),
		Routes: []gateway.Route{
			{Method: "POST", Path: "/transfers"},
			{Method: "POST", Path: "/events", TTL: 2 * time.Hour},
		},
		Scope: keyscope.Header("X-Account-Id"),
		TTL:   3 * time.Hour,
	}
	store := memstore.New()
	live := httptest.NewServer(newGateway(t, cfg, store))
	t.Cleanup(live.Close)
	deadCfg := cfg
	deadCfg.Upstream = mustURL(t, "http://"+closedPort(t))
	dead := httptest.NewServer(newGateway(t, deadCfg, store))
	t.Cleanup(dead.Close)

	tests := []struct {
		name   string
		answer func(c, dead client) (*http.Response, string)
		status int
		want   string // "" for no header
	}{
		{
			name:   "the upstream's answer",
			answer: func(c, _ client) (*http.Response, string) { return c.post("/transfers", "first", transfer) },
			status: http.StatusCreated, want: "10800",
		},
		{
			name: "a replay",
			answer: func(c, _ client) (*http.Response, string) {
				c.post("/transfers", "replayed", transfer)
				resp, body := c.post("/transfers", "replayed", transfer)
				require.Equal(t, "true", resp.Header.Get(idempotency.HeaderReplayed), "the retry is a replay")
				return resp, body
			},
			status: http.StatusCreated, want: "10800",
		},
		{
			name: "a mismatch",
			answer: func(c, _ client) (*http.Response, string) {
				c.post("/transfers", "mismatched", transfer)
				return c.post("/transfers", "mismatched", `{"amount":501,"currency":"EUR"}`)
			},
			status: http.StatusUnprocessableEntity, want: "10800",
		},
		{
			name:   "a stream passed through, on a route of its own TTL",
			answer: func(c, _ client) (*http.Response, string) { return c.post("/events", "streamed", `{}`) },
			status: http.StatusOK, want: "7200",
		},
		{
			name: "the gateway's own 502",
			answer: func(_, dead client) (*http.Response, string) {
				return dead.post("/transfers", uuid.NewString(), transfer)
			},
			status: http.StatusBadGateway, want: "10800",
		},
		{
			name:   "no key",
			answer: func(c, _ client) (*http.Response, string) { return c.post("/transfers", "", transfer) },
			status: http.StatusBadRequest,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			resp, body := tt.answer(client{t, live.URL, "acct-ttl"}, client{t, dead.URL, "acct-ttl"})
			require.Equal(t, tt.status, resp.StatusCode, "the answer: %s", body)
			require.Equal(t, tt.want, resp.Header.Get("Idempotency-TTL"), "the answer's Idempotency-TTL")
			require.Len(t, resp.Header.Values("Idempotency-TTL"), min(1, len(tt.want)), "one value at most")
		})
	}
}
