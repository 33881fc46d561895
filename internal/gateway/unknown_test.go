package gateway_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/pgstore/keyadmin"
	"github.com/oncekey/oncekey/internal/gateway"
	"github.com/oncekey/oncekey/internal/service/servicetest"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// TestUnknownOutcomeTellsTheClientNoAddress: an upstream that reads a
// request and resets the connection leaves its outcome unknown. The
// client's 409 carries the protocol's fixed detail, and nothing of the
// cause, which names the upstream's internal address ("read tcp
// 127.0.0.1:55234->127.0.0.1:42681: … reset by peer"); the gateway's log
// and the key's held record (keys inspect) keep the cause for operators.
func TestUnknownOutcomeTellsTheClientNoAddress(t *testing.T) {
	t.Parallel()
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		if tcp, ok := conn.(*net.TCPConn); ok {
			_ = tcp.SetLinger(0) // close with a reset, not a FIN
		}
		_ = conn.Close()
	}))
	t.Cleanup(upstream.Close)
	up, err := url.Parse(upstream.URL)
	require.NoError(t, err)

	pg, err := pgstore.New(testdb.Pool(t), pgstore.Options{})
	require.NoError(t, err)
	store, err := pg.ClaimAtCommit()
	require.NoError(t, err)
	var logs servicetest.SyncBuffer
	srv := transfersGateway(t, gateway.Config{Upstream: up, Logger: slog.New(slog.NewTextHandler(&logs, nil))},
		store)

	key := "k-" + strings.ReplaceAll(t.Name(), "/", "-")
	c := client{t: t, url: srv.URL, scope: "acct-unknown"}
	for _, attempt := range []string{"first", "retry"} {
		resp, body := c.post("/transfers", key, transfer)
		require.Equal(t, http.StatusConflict, resp.StatusCode, "%s: %s", attempt, body)
		require.Equal(t, idempotency.ProblemOf(idempotency.ErrOutcomeUnknown).Slug, problemType(t, body), attempt)
		var p struct {
			Detail string `json:"detail"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &p))
		require.Equal(t, idempotency.ErrOutcomeUnknown.Error(), p.Detail, "%s: the fixed detail", attempt)
		require.NotContains(t, body, up.Host, "%s: the upstream's address is not the client's", attempt)
		require.NotContains(t, body, "127.0.0.1", attempt)
	}

	require.Contains(t, logs.String(), up.Host, "the log names the cause, with the upstream's address")
	scopes, err := keyadmin.ScopesOf(t.Context(), pg, key, 2)
	require.NoError(t, err)
	require.Len(t, scopes, 1, "the key is stored under one scope")
	info, err := keyadmin.Inspect(t.Context(), pg, scopes[0], key)
	require.NoError(t, err)
	require.Equal(t, "unknown", info.Status)
	require.NotNil(t, info.Held)
	require.Contains(t, info.Held.Reason, up.Host, "the held record keeps the cause for keys inspect")
}
