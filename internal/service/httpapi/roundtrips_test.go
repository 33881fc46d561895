package httpapi_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency/recordcache"
	"github.com/oncekey/oncekey/idempotency/redisstore"
	"github.com/oncekey/oncekey/idempotency/redisstore/redistest"
	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// TestRoundTrips pins how many round trips to PostgreSQL a request costs
// (and how many statements a first request sends), authentication
// included, and how many to Redis, so that none creeps in unnoticed: a
// first request 1 to PostgreSQL (its claim, order and response in one
// statement) and to Redis none while replays are rare, 1 (its look-up) in
// a storm of retries; a replay at most 1 to PostgreSQL, and a replay served
// from the in-process record cache or from Redis 0. With Redis, a record is
// cached when PostgreSQL first answers a looked-up replay of it (the
// look-up and the write), not at commit. Counted on a warm connection pool:
// a connection's first use of a statement also prepares it, once.
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

	rdb := redistest.Shared(t) // REDIS_URL, a client of the test's own
	redisTrips := &redisRoundTrips{}
	rdb.AddHook(redisTrips)

	// trips are the round trips of a first request, of its first replay
	// and of a replay after that, to PostgreSQL or to Redis.
	type trips struct{ first, replay, again int64 }
	tests := []struct {
		name        string
		redis       bool
		cachedKeys  bool // the API-key cache in front of the store, warm
		recordCache bool // the in-process cache of completed records
		storm       bool // replays were most of the recent requests
		pg, onRedis trips
	}{
		// The API-key look-up, then the statement; a replay's statement
		// finds the record and writes nothing.
		{name: "postgres", pg: trips{2, 2, 2}},
		// While replays are rare Redis is not looked up at all.
		{name: "postgres with redis", redis: true, pg: trips{2, 2, 2}},
		// In a storm of retries every request is looked up: the first
		// replay reads the record through from PostgreSQL into Redis; after
		// that, only the API-key look-up.
		{name: "postgres with redis, storm", redis: true, storm: true, pg: trips{2, 2, 1}, onRedis: trips{1, 2, 1}},
		// A warm API-key cache (serve's default) saves the look-up. A
		// replay on a replica that has not seen the key yet (so not in its
		// record cache) costs the one statement.
		{name: "postgres, keys cached", cachedKeys: true, pg: trips{1, 1, 1}},
		{name: "postgres with redis, keys cached", redis: true, cachedKeys: true, pg: trips{1, 1, 1}},
		{name: "postgres with redis, keys cached, storm", redis: true, cachedKeys: true, storm: true, pg: trips{1, 1, 0}, onRedis: trips{1, 2, 1}},
		// serve's default wiring: the replica that ran the request answers
		// its replays from its own record cache.
		{name: "postgres, keys and records cached", cachedKeys: true, recordCache: true, pg: trips{1, 0, 0}},
		{name: "postgres with redis, keys and records cached", redis: true, cachedKeys: true, recordCache: true, pg: trips{1, 0, 0}},
	}
	for _, tt := range tests {
		// Not parallel: the cases share the counters.
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
			if tt.storm {
				for i := range 20 {
					require.Equal(t, "true", b.createOrder(t, warm, seedBody).HTTPResponse.Header.Get("Idempotent-Replayed"), "storm replay %d", i)
				}
			}
			key := "round-trips-" + tt.name

			pgBefore, redisBefore, statements := counter.RoundTrips.Load(), redisTrips.n.Load(), counter.Statements.Load()
			require.Equal(t, http.StatusCreated, b.createOrder(t, key, seedBody).StatusCode())
			require.Equal(t, tt.pg.first, counter.RoundTrips.Load()-pgBefore, "PostgreSQL round trips of a first request")
			require.Equal(t, tt.onRedis.first, redisTrips.n.Load()-redisBefore, "Redis round trips of a first request")
			// One statement: the key row with the response, the order
			// guarded by it and what held the key, as CTEs; and the
			// API-key look-up when it is not cached.
			require.Equal(t, tt.pg.first, counter.Statements.Load()-statements, "statements of a first request")

			for _, replay := range []struct {
				what      string
				pg, redis int64
			}{{"its first replay", tt.pg.replay, tt.onRedis.replay}, {"a replay after that", tt.pg.again, tt.onRedis.again}} {
				pgBefore, redisBefore = counter.RoundTrips.Load(), redisTrips.n.Load()
				r := b.createOrder(t, key, seedBody)
				require.Equal(t, "true", r.HTTPResponse.Header.Get("Idempotent-Replayed"), replay.what)
				require.Equal(t, replay.pg, counter.RoundTrips.Load()-pgBefore, "PostgreSQL round trips of %s", replay.what)
				require.Equal(t, replay.redis, redisTrips.n.Load()-redisBefore, "Redis round trips of %s", replay.what)
			}
		})
	}
}

// redisRoundTrips counts a Redis client's round trips: a command sent
// alone is one, and so is a pipeline.
type redisRoundTrips struct{ n atomic.Int64 }

func (c *redisRoundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *redisRoundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

func (c *redisRoundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmds)
	}
}
