package redisstore_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/internal/testharness"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/idempotency/redisstore"
	"github.com/oncekey/oncekey/idempotency/redisstore/redistest"
)

// TestRedisFailingAndRecoveringIsLogged: a Redis that stops answering
// under load is one WARN line, not one a request; its recovery is one
// more. Only the metrics showed either before.
func TestRedisFailingAndRecoveringIsLogged(t *testing.T) {
	t.Parallel()
	server := redistest.Start(t)
	rdb, err := redisstore.NewClient(server.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = rdb.Close() })
	logs := &testharness.Logs{}
	fast := redisstore.New(rdb, redisstore.Config{AlwaysLookUp: true, Cooldown: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	store := redisstore.Wrap(fast, idempotency.Store[*memstore.Tx](memstore.New()))
	ctx := context.Background()
	req := idempotency.ClaimRequest{Scope: "logged", Key: "k", Fingerprint: idempotency.Fingerprint{7},
		Method: "POST", Route: "/orders", TTL: time.Hour, Wait: time.Second}
	lease, _, err := store.Claim(ctx, req)
	require.NoError(t, err)
	require.NoError(t, lease.Commit(ctx, idempotency.Response{Status: 201, Header: http.Header{}, Body: []byte(`{}`)}))
	replays := func(n int) { // each looks its key up on Redis while it is not left alone
		t.Helper()
		for range n {
			_, rec, err := store.Claim(ctx, req)
			require.NoError(t, err, "the durable store answers whatever Redis does")
			require.NotNil(t, rec)
		}
	}
	count := func(what string) int { return strings.Count(logs.String(), what) }

	replays(10)
	require.Empty(t, logs.String(), "a Redis that answers is not logged")

	require.NoError(t, server.Process.Signal(syscall.SIGSTOP))
	replays(30)
	require.Equal(t, 1, count("Redis tier failing"), "one line for 30 requests while Redis does not answer:\n%s", logs)
	require.Contains(t, logs.String(), "level=WARN")
	require.Regexp(t, `err="?[^"\s]`, logs.String(), "the line says what failed")

	require.NoError(t, server.Process.Signal(syscall.SIGCONT))
	require.Eventually(t, func() bool { return count("Redis tier recovered") == 1 }, 10*time.Second, 10*time.Millisecond, "a probe finds Redis again:\n%s", logs)
	replays(30)
	require.Equal(t, 1, count("Redis tier failing"), logs.String())
	require.Equal(t, 1, count("Redis tier recovered"), logs.String())
	require.Equal(t, 2, strings.Count(logs.String(), "\n"), "two lines in all:\n%s", logs)
}
