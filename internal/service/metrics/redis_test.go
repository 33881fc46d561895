package metrics_test

import (
	"net/http"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/redisstore"
	"github.com/oncekey/oncekey/idempotency/redisstore/redistest"
	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/metrics"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// TestRedisMetrics drives requests through the Redis fast path, once with
// Redis up and once with nothing listening, and checks hits, misses,
// errors and fallbacks.
func TestRedisMetrics(t *testing.T) {
	t.Parallel()
	url := redistest.SharedURL()
	tests := []struct {
		name     string
		url      string
		up       bool
		hits     float64
		fallback bool
	}{
		{"redis up", url, true, 2, false},
		{"redis down", "redis://127.0.0.1:1/0", false, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rdb, err := redisstore.NewClient(tt.url)
			require.NoError(t, err)
			t.Cleanup(func() { rdb.Close() })
			if tt.up {
				if err := rdb.Ping(t.Context()).Err(); err != nil {
					if os.Getenv("CI") != "" {
						t.Fatalf("Redis is required in CI: %v", err)
					}
					t.Skipf("Redis unavailable: %v", err)
				}
			}
			m := metrics.New()
			store := postgres.New(testdb.Pool(t), nil)
			fast := redisstore.New(rdb, redisstore.Config{Prefix: "metrics-test:", Observer: m, AlwaysLookUp: true})
			b := setup(t, store, options{cfg: httpapi.Config{Metrics: m, DeferredKeys: redisstore.Wrap(fast, store.DeferredKeys())}})

			b.createOrder(t, "redis-metrics", seedBody)                                                               // miss
			b.do(t, http.StatusCreated, http.MethodPost, "/orders", seedBody, idempotency.HeaderKey, "redis-metrics") // miss, read through
			b.do(t, http.StatusCreated, http.MethodPost, "/orders", seedBody, idempotency.HeaderKey, "redis-metrics") // hit
			b.do(t, http.StatusCreated, http.MethodPost, "/orders", seedBody, idempotency.HeaderKey, "redis-metrics") // hit

			f := scrape(t, b.url)
			require.Equal(t, tt.hits, f.value(t, "oncekey_redis_requests_total", "result", "hit"))
			if tt.up {
				require.Positive(t, f.value(t, "oncekey_redis_requests_total", "result", "miss"))
				require.Zero(t, f.value(t, "oncekey_redis_requests_total", "result", "error"))
				require.Zero(t, f.value(t, "oncekey_redis_fallbacks_total"))
			} else {
				require.Positive(t, f.value(t, "oncekey_redis_requests_total", "result", "error"))
				require.Positive(t, f.value(t, "oncekey_redis_fallbacks_total"), "every request fell back to PostgreSQL")
			}
			// Either way each request was answered, and one order exists.
			list, err := store.ListOrders(t.Context(), b.account, nil, 10)
			require.NoError(t, err)
			require.Len(t, list, 1)
		})
	}
}

// TestRedisBypassedMetric: with the fast path as serve wires it, claims
// made while replays are rare go straight to PostgreSQL, and are counted as
// bypassed.
func TestRedisBypassedMetric(t *testing.T) {
	t.Parallel()
	m := metrics.New()
	store := postgres.New(testdb.Pool(t), nil)
	fast := redisstore.New(redistest.Shared(t), redisstore.Config{Prefix: "metrics-test:", Observer: m})
	b := setup(t, store, options{cfg: httpapi.Config{Metrics: m, DeferredKeys: redisstore.Wrap(fast, store.DeferredKeys())}})

	b.createOrder(t, "redis-bypassed", seedBody)
	b.do(t, http.StatusCreated, http.MethodPost, "/orders", seedBody, idempotency.HeaderKey, "redis-bypassed")

	f := scrape(t, b.url)
	require.Equal(t, 2.0, f.value(t, "oncekey_redis_requests_total", "result", "bypassed"), "a first request and one replay: replays are rare")
	for _, r := range []string{"hit", "miss", "error"} {
		require.Zero(t, f.value(t, "oncekey_redis_requests_total", "result", r), "look-ups with result %s", r)
	}
}
