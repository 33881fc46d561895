package httpapi_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/servicetest"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
	"github.com/oncekey/oncekey/internal/wire/problem"
)

// requestTimeout bounds the requests of the outage tests.
const requestTimeout = 2 * time.Second

// onThrowawayCluster is the service on the migrated database at url, a
// throwaway cluster of the test's own that it crashes and restarts, with
// short request timeouts and no log (hundreds of expected warnings).
func onThrowawayCluster(t *testing.T, url string) (*testBundle, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	pool, err := postgres.Open(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, postgres.Migrate(ctx, pool))
	return setup(t, postgres.New(pool, nil), options{cfg: httpapi.Config{
		RequestTimeout: requestTimeout, Wait: 500 * time.Millisecond, Ready: postgres.New(pool, nil).Ready,
		Logger: slog.New(slog.DiscardHandler),
	}}), pool
}

// waitAtLeast waits (up to a minute) until n reaches at least want.
func waitAtLeast(t *testing.T, n *atomic.Int64, want int64, what string) {
	t.Helper()
	require.Eventually(t, func() bool { return n.Load() >= want }, time.Minute, 5*time.Millisecond, what)
}

// poll calls done in the test's goroutine (so that done may use require)
// until it reports true, failing after timeout: a wait for what the test
// can observe, where require.Eventually's goroutine would not do.
func poll(t *testing.T, timeout time.Duration, what string, done func() bool) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(timeout)
	for !done() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("%s: not within %s", what, timeout)
		}
	}
}

// pace holds a load back for d: a client backing off between tries, the
// load running on for a while before and through a failure, an operator's
// reaction time, a database slow on purpose. What the test measures happens
// meanwhile; nothing is waited for.
func pace(d time.Duration) {
	time.Sleep(d) // pacing: the load's own rhythm, not a wait for anything
}

// outcome is one request of the load in TestDatabaseOutage.
type outcome struct {
	key     string
	reply   reply
	elapsed time.Duration
}

// PostgreSQL crashes (immediate shutdown) and comes back while orders
// stream in. Meanwhile every request fails fast with 503 and Retry-After
// (never a 500, never a hang past the request timeout) and /readyz is 503;
// afterwards the service recovers by itself. Every 201 ever sent is a
// committed order, and a retry of every refused key creates exactly one.
func TestDatabaseOutage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster := testdb.NewCluster(t)
	b, pool := onThrowawayCluster(t, cluster.URL()+"&pool_max_conns=10&connect_timeout=1")
	ready := func() int { // runs inside Eventually's goroutine: no require here
		resp, err := b.http.Get(b.url + "/readyz")
		if err != nil {
			return -1
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	var (
		mu       sync.Mutex
		outcomes []outcome
		created  atomic.Int64
		stop     atomic.Bool
		wg       sync.WaitGroup
	)
	for range 4 {
		wg.Go(func() {
			for !stop.Load() {
				key := uuid.NewString()
				began := time.Now()
				r, err := b.exchange(b.newRequest(t, http.MethodPost, "/orders", strings.NewReader(seedBody), "Idempotency-Key", key))
				if err != nil {
					r = reply{Status: -1, Body: []byte(err.Error())}
				}
				mu.Lock()
				outcomes = append(outcomes, outcome{key: key, reply: r, elapsed: time.Since(began)})
				mu.Unlock()
				if r.Status == http.StatusCreated {
					created.Add(1)
				} else {
					pace(20 * time.Millisecond) // a client backing off a little
				}
			}
		})
	}
	waitCreated := func(n int64, what string) { t.Helper(); waitAtLeast(t, &created, n, what) }
	waitCreated(50, "orders before the outage")

	cluster.Stop(t)
	require.Eventually(t, func() bool { return ready() == http.StatusServiceUnavailable }, 5*time.Second, 50*time.Millisecond, "/readyz must turn unready")
	pace(2 * time.Second) // the load keeps coming while the database is away
	before := created.Load()
	cluster.Start(t)
	require.Eventually(t, func() bool { return ready() == http.StatusOK }, 30*time.Second, 50*time.Millisecond, "/readyz must recover by itself")
	waitCreated(before+50, "orders after the database came back")
	stop.Store(true)
	servicetest.Wait(t, &wg, time.Minute, "the clients after the outage")

	var refused []string
	for _, o := range outcomes {
		require.LessOrEqual(t, o.elapsed, requestTimeout+time.Second, "key %s took %s: %s", o.key, o.elapsed, o.reply)
		switch o.reply.Status {
		case http.StatusCreated:
		case http.StatusServiceUnavailable:
			require.NotEmpty(t, o.reply.Header.Get("Retry-After"), "503 without Retry-After: %s", o.reply)
			require.Contains(t, string(o.reply.Body), "https://oncekey.dev/problems/unavailable")
			refused = append(refused, o.key)
		default:
			require.Failf(t, "only 201 or 503 may come back", "key %s: %s", o.key, o.reply)
		}
	}
	require.NotEmpty(t, refused, "the outage must have been felt")

	// Every acknowledged order is committed; every refused key, retried,
	// gets its one order.
	for _, key := range refused {
		r, err := b.exchange(b.newRequest(t, http.MethodPost, "/orders", strings.NewReader(seedBody), "Idempotency-Key", key))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, r.Status, "retry of %s after the outage: %s", key, r)
	}
	var rows, keys int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM orders WHERE account_id = $1", b.account).Scan(&rows))
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_keys WHERE scope = uuid_send($1)", b.account).Scan(&keys))
	require.Equal(t, len(outcomes), rows, "exactly one order per key sent (%d refused during the outage)", len(refused))
	require.Equal(t, len(outcomes), keys)
	t.Logf("%d requests, %d refused with 503 during the outage", len(outcomes), len(refused))
}

// A database that hangs (here: the orders table locked by another session)
// costs a request at most ONCEKEY_REQUEST_TIMEOUT: the deadline reaches the
// statement inside pgx, which PostgreSQL cancels, and the answer is 503 with
// Retry-After. Nothing is stored, so the same key runs once the lock is gone.
func TestRequestTimeoutCancelsDatabaseWork(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool := testdb.Fresh(t)
	const requestTimeout = 300 * time.Millisecond
	b := setup(t, postgres.New(pool, nil), options{cfg: httpapi.Config{RequestTimeout: requestTimeout, Wait: 100 * time.Millisecond}})

	locker, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = locker.Rollback(ctx) })
	_, err = locker.Exec(ctx, "LOCK TABLE orders IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)

	key := uuid.NewString()
	began := time.Now()
	r := b.postOrder(t, key, seedBody)
	elapsed := time.Since(began)
	requireProblem(t, r, problem.Unavailable, "an order while the table is locked")
	require.NotEmpty(t, r.Header.Get("Retry-After"))
	require.Less(t, elapsed, requestTimeout+time.Second, "the request must not hang past its timeout")

	// pgx cancels the statement with a cancel request of its own, which
	// PostgreSQL acts on a moment after the 503: wait for that, as long as
	// the lock is held an INSERT left waiting would wait for ever.
	require.Eventually(t, func() bool {
		var waiting int
		return pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting) == nil && waiting == 0
	}, 5*time.Second, 10*time.Millisecond, "the timed-out INSERT must have been cancelled in PostgreSQL, not left waiting")

	require.NoError(t, locker.Rollback(ctx))
	requireFresh(t, b.postOrder(t, key, seedBody), "the same key after the lock is gone")
	require.Equal(t, 1, b.orderCount(t))
}
