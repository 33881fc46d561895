package httpapi_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency/recordcache"
	"github.com/oncekey/oncekey/idempotency/redisstore"
	"github.com/oncekey/oncekey/idempotency/redisstore/redistest"
	"github.com/oncekey/oncekey/internal/auth"
	"github.com/oncekey/oncekey/internal/httpapi"
	"github.com/oncekey/oncekey/internal/store/postgres"
	"github.com/oncekey/oncekey/internal/testdb"
)

// TestRoundTrips pins how many round trips to PostgreSQL a request costs
// (and how many statements a first request sends),
// authentication included, so that none creeps in unnoticed: a first
// request 1 (its claim, order and response in one pipeline), a replay at
// most 1, and a replay served from the in-process record cache or from
// Redis 0. Counted on a warm connection pool: a connection's first use of
// a statement also prepares it, once.
func TestRoundTrips(t *testing.T) {
	t.Parallel()
	counter := &postgres.Counter{}
	// One connection, so the warm-up prepares what the measured requests use.
	url := testdb.URL(t)
	if strings.Contains(url, "?") {
		url += "&pool_max_conns=1"
	} else {
		url += "?pool_max_conns=1"
	}
	pool, err := postgres.Open(context.Background(), url, postgres.WithQueryTracer(counter))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store := postgres.New(pool, nil)

	rdb := redistest.Shared(t) // REDIS_URL

	tests := []struct {
		name          string
		redis         bool
		cachedKeys    bool // the API-key cache in front of the store, warm
		recordCache   bool // the in-process cache of completed records
		first, replay int64
	}{
		// The API-key look-up, then the pipeline; a replay's pipeline finds
		// the record and writes nothing.
		{name: "postgres", first: 2, replay: 2},
		{name: "postgres with redis", redis: true, first: 2, replay: 1}, // replay: the API-key look-up only
		// A warm API-key cache (serve's default) saves the look-up. A
		// replay on a replica that has not seen the key yet (so not in its
		// record cache) costs the one pipeline.
		{name: "postgres, keys cached", cachedKeys: true, first: 1, replay: 1},
		{name: "postgres with redis, keys cached", redis: true, cachedKeys: true, first: 1, replay: 0},
		// serve's default wiring.
		{name: "postgres, keys and records cached", cachedKeys: true, recordCache: true, first: 1, replay: 0},
		{name: "postgres with redis, keys and records cached", redis: true, cachedKeys: true, recordCache: true, first: 1, replay: 0},
	}
	for _, tt := range tests {
		// Not parallel: the cases share the counter.
		t.Run(tt.name, func(t *testing.T) {
			cfg := httpapi.Config{}
			keys := store.DeferredKeys()
			if tt.redis {
				keys = redisstore.Wrap(redisstore.New(rdb, redisstore.Config{Prefix: "roundtrips:"}), keys)
			}
			if tt.recordCache {
				cache, err := recordcache.New(recordcache.DefaultSize, nil)
				require.NoError(t, err)
				keys = recordcache.Wrap(cache, keys)
			}
			cfg.DeferredKeys = keys
			if tt.cachedKeys {
				cfg.Auth = auth.NewCache(store, auth.DefaultCacheSize, time.Minute)
			}
			b := setup(t, store, options{cfg: cfg})
			// Warm the connection's statement cache and the API-key cache.
			warm := "round-trips-warm-" + tt.name
			require.Equal(t, http.StatusCreated, b.createOrder(t, warm, seedBody).StatusCode(), "warm-up")
			require.Equal(t, "true", b.createOrder(t, warm, seedBody).HTTPResponse.Header.Get("Idempotent-Replayed"), "warm-up replay")
			key := "round-trips-" + tt.name

			before, statements := counter.RoundTrips.Load(), counter.Statements.Load()
			require.Equal(t, http.StatusCreated, b.createOrder(t, key, seedBody).StatusCode())
			require.Equal(t, tt.first, counter.RoundTrips.Load()-before, "round trips of a first request")
			// One statement: the key row with the response, the order
			// guarded by it and what held the key, as CTEs; and the
			// API-key look-up when it is not cached.
			wantStatements := tt.first
			require.Equal(t, wantStatements, counter.Statements.Load()-statements, "statements of a first request")

			before = counter.RoundTrips.Load()
			replay := b.createOrder(t, key, seedBody)
			require.Equal(t, "true", replay.HTTPResponse.Header.Get("Idempotent-Replayed"))
			require.Equal(t, tt.replay, counter.RoundTrips.Load()-before, "round trips of a replay")
		})
	}
}
