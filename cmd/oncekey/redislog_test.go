package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/gateway/upstreamtest"
	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// TestRedisFailingIsLoggedOnce: the service and the gateway, given a Redis
// that refuses connections, write one WARN line that the Redis tier is
// failing, however many requests then look keys up on it (replays of one
// key; without the record cache, which would answer them first). A Redis
// Cluster whose master failed over showed only in the metrics.
func TestRedisFailingIsLoggedOnce(t *testing.T) {
	t.Parallel()
	const replays = 30
	for _, tc := range []struct {
		name  string
		start func(t *testing.T, env map[string]string, pool *pgxpool.Pool) (p *serveProcess, send func() int)
	}{
		{"serve", func(t *testing.T, env map[string]string, pool *pgxpool.Pool) (*serveProcess, func() int) {
			creds, err := auth.CreateAccount(context.Background(), postgres.New(pool, nil), "redis-log", "")
			require.NoError(t, err)
			p := startServeProcess(t, env)
			client := &http.Client{Timeout: 10 * time.Second}
			key := uuid.NewString()
			return p, func() int {
				r, err := postOrder(client, p.addr, creds.APIKey, key)
				require.NoError(t, err)
				return r.Status
			}
		}},
		{"proxy", func(t *testing.T, env map[string]string, _ *pgxpool.Pool) (*serveProcess, func() int) {
			u := upstreamtest.Start(t)
			p := spawnProxy(t, env, "--upstream", u.URL, "--spec", u.Spec, "--scope-header", "X-Account-Id")
			scope, key := "acct-"+uuid.NewString(), uuid.NewString()
			return p, func() int {
				status, _ := gatewayPost(t, p.addr, scope, key, "")
				return status
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			url, pool := testdb.Fresh(t)
			env := map[string]string{"DATABASE_URL": url, "REDIS_URL": "redis://" + freeAddr(t) + "/0", "ONCEKEY_RECORD_CACHE_SIZE": "0"}
			p, send := tc.start(t, env, pool)
			for i := range 1 + replays {
				require.Equal(t, http.StatusCreated, send(), "request %d: the database answers without Redis", i)
			}
			failing := func() int { return strings.Count(p.logs.String(), "Redis tier failing") }
			require.Eventually(t, func() bool { return failing() > 0 }, 10*time.Second, 10*time.Millisecond, "a line says Redis is failing:\n%s", p.logs)
			require.Equal(t, 1, failing(), "one line for %d replays:\n%s", replays, p.logs)
		})
	}
}
