package httpapi_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/gen/api"
	"github.com/oncekey/oncekey/internal/auth"
	"github.com/oncekey/oncekey/internal/httpapi"
	"github.com/oncekey/oncekey/internal/store/postgres"
	"github.com/oncekey/oncekey/internal/store/rediscache"
	"github.com/oncekey/oncekey/internal/testdb"
)

// queryCounter counts statements sent to PostgreSQL. Nothing is pipelined
// today, so each one is a round trip.
type queryCounter struct{ n atomic.Int64 }

func (c *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestRoundTrips pins how many round trips to PostgreSQL a request costs,
// so that none creeps in unnoticed. These are today's figures, not the
// goals of the performance work (1 for a first request, at most 1 for a
// replay, 0 for a replay from Redis): lower them there and tighten here.
func TestRoundTrips(t *testing.T) {
	t.Parallel()
	counter := &queryCounter{}
	pool, err := postgres.Open(context.Background(), testdb.URL(t), postgres.WithQueryTracer(counter))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store := postgres.New(pool)

	rdb, err := rediscache.NewClient("redis://127.0.0.1:6379/0")
	require.NoError(t, err)
	t.Cleanup(func() { rdb.Close() })
	require.NoError(t, rdb.Ping(t.Context()).Err(), "Redis at 127.0.0.1:6379")

	tests := []struct {
		name          string
		redis         bool
		cachedKeys    bool // the API-key cache in front of the store, warm
		first, replay int64
	}{
		// API-key lookup, BEGIN with the claim's timeouts, claim, reset of
		// the timeouts, INSERT order, store response, COMMIT.
		{"postgres", false, false, 7, 4},           // replay: lookup, BEGIN, claim-or-read, ROLLBACK
		{"postgres with redis", true, false, 7, 1}, // replay: the API-key lookup only
		// A warm API-key cache (serve's default) saves the lookup.
		{"postgres, keys cached", false, true, 6, 3},
		{"postgres with redis, keys cached", true, true, 6, 0},
	}
	for _, tt := range tests {
		// Not parallel: the cases share the counter.
		t.Run(tt.name, func(t *testing.T) {
			cfg := httpapi.Config{}
			if tt.redis {
				cfg.Idempotency = rediscache.New(store, rdb, rediscache.Config{})
			}
			if tt.cachedKeys {
				cfg.Auth = auth.NewCache(store, auth.DefaultCacheSize, time.Minute)
			}
			b := setup(t, store, options{cfg: cfg})
			if tt.cachedKeys {
				resp, err := b.client.ListOrdersWithResponse(t.Context(), &api.ListOrdersParams{})
				require.NoError(t, err)
				require.Equal(t, http.StatusOK, resp.StatusCode(), "warm the key cache")
			}
			key := "round-trips-" + tt.name

			before := counter.n.Load()
			require.Equal(t, http.StatusCreated, b.createOrder(t, key, seedBody).StatusCode())
			require.Equal(t, tt.first, counter.n.Load()-before, "round trips of a first request")

			before = counter.n.Load()
			replay := b.createOrder(t, key, seedBody)
			require.Equal(t, "true", replay.HTTPResponse.Header.Get("Idempotent-Replayed"))
			require.Equal(t, tt.replay, counter.n.Load()-before, "round trips of a replay")
		})
	}
}
