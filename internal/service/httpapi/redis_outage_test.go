package httpapi_test

import (
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency/redisstore"
	"github.com/oncekey/oncekey/idempotency/redisstore/redistest"
	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/metrics"
	"github.com/oncekey/oncekey/internal/service/servicetest"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// Redis failing (killed, or paused so that it holds connections without
// answering) costs requests speed only for a moment: once a few commands
// have failed, the breaker leaves Redis alone and requests cost what they
// cost without Redis. Measured side by side under one load: a server with
// the Redis fast path and one without, on one database; from 1s after the
// failure, the p99 of the first must stay within 2 × the p99 of the second.
func TestRedisOutageCostsNoLatency(t *testing.T) {
	t.Parallel()
	for _, fault := range []struct {
		name   string
		signal syscall.Signal
	}{
		{"killed", syscall.SIGKILL},
		{"paused", syscall.SIGSTOP},
	} {
		t.Run(fault.name, func(t *testing.T) {
			store := postgres.New(testdb.Pool(t), nil)
			redis := redistest.Start(t)
			rdb, err := redisstore.NewClient(redis.URL)
			require.NoError(t, err)
			t.Cleanup(func() { rdb.Close() })
			m := metrics.New()
			fast := redisstore.New(rdb, redisstore.Config{Prefix: "outage:", Observer: m})
			withRedis := setup(t, store, options{cfg: httpapi.Config{Metrics: m,
				Keys: redisstore.Wrap(fast, store.Keys()), DeferredKeys: redisstore.Wrap(fast, store.DeferredKeys())}})
			without := setup(t, store, options{})

			const (
				clients = 4 // per server
				before  = time.Second
				settle  = time.Second // measured from this long after the failure
				after   = 3 * time.Second
			)
			start := time.Now()
			failAt := start.Add(before)
			end := failAt.Add(settle + after)
			loads := []*outageLoad{{b: withRedis}, {b: without}}
			var wg sync.WaitGroup
			for _, load := range loads {
				for range clients {
					wg.Go(func() { load.run(t, end) })
				}
			}
			pace(time.Until(failAt)) // the load runs for a while before the failure
			require.NoError(t, redis.Process.Signal(fault.signal), "%s redis-server", fault.name)
			servicetest.Wait(t, &wg, end.Sub(start)+30*time.Second, "the load through the Redis outage")

			from := failAt.Add(settle)
			// A p99 of nothing is 0: without enough requests after the
			// failure the comparison below would prove nothing.
			const minSamples = 100
			for i, load := range loads {
				require.GreaterOrEqual(t, load.count(from), minSamples, "requests measured after the failure on server %d", i)
			}
			p99With, p99Without := loads[0].p99(from), loads[1].p99(from)
			t.Logf("Redis %s: p99 %s with the fast path, %s without (from %s after the failure; %d and %d requests)",
				fault.name, p99With, p99Without, settle, loads[0].count(from), loads[1].count(from))
			require.LessOrEqual(t, p99With, 2*p99Without, "p99 from %s after Redis was %s, against the p99 without Redis", settle, fault.name)
			for _, load := range loads {
				require.Empty(t, load.failures, "every request answered as without a fault")
			}
			require.Equal(t, loads[0].firsts, withRedis.orderCount(t), "one order per first request")
			require.Equal(t, 1.0, metricValue(t, m, "oncekey_redis_breaker_open"), "the breaker is open while Redis is %s", fault.name)
			require.Positive(t, metricValue(t, m, "oncekey_redis_requests_total", "result", "skipped"), "requests left Redis alone")
		})
	}
}

// outageLoad is one server's share of the load: each client sends a first
// request with a fresh key, then its replay, over and over.
type outageLoad struct {
	b        *testBundle
	mu       sync.Mutex
	started  []time.Time
	took     []time.Duration
	firsts   int
	failures []string
}

func (l *outageLoad) run(t *testing.T, end time.Time) {
	client := &http.Client{Timeout: 10 * time.Second}
	for time.Now().Before(end) {
		key := uuid.NewString()
		for i, want := range []string{"", "true"} {
			req := l.b.newRequest(t, http.MethodPost, "/orders", strings.NewReader(seedBody), "Idempotency-Key", key)
			began := time.Now()
			r, err := servicetest.Exchange(client, req)
			took := time.Since(began)
			l.mu.Lock()
			l.started, l.took = append(l.started, began), append(l.took, took)
			switch {
			case err != nil:
				l.failures = append(l.failures, err.Error())
			case r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != want:
				l.failures = append(l.failures, r.String())
			case i == 0:
				l.firsts++
			}
			l.mu.Unlock()
		}
	}
}

// p99 is the 99th percentile latency of the requests started from from on.
func (l *outageLoad) p99(from time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var took []time.Duration
	for i, began := range l.started {
		if !began.Before(from) {
			took = append(took, l.took[i])
		}
	}
	if len(took) == 0 {
		return 0
	}
	slices.Sort(took)
	return took[len(took)*99/100]
}

func (l *outageLoad) count(from time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, began := range l.started {
		if !began.Before(from) {
			n++
		}
	}
	return n
}
