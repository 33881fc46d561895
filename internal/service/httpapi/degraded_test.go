package httpapi_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/jobs"
	"github.com/oncekey/oncekey/internal/service/payments"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
	"github.com/oncekey/oncekey/internal/wire/problem"
)

// degraded is a service whose database is about to stop serving, with an
// order to read and to pay. API keys are cached, so that authentication
// does not need the database and the requests reach their claims.
type degraded struct {
	*testBundle
	pool  *pgxpool.Pool // the service's
	order string
}

// onDegradable starts the service on url (a migrated database) with the
// request timeout given, and creates an order.
func onDegradable(t *testing.T, url string, requestTimeout time.Duration) *degraded {
	t.Helper()
	pool, err := postgres.Open(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	// Payments are accepted (their jobs inserted) and never charged: no
	// worker runs.
	runner, err := jobs.New(pool, jobs.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	pg := postgres.New(pool, runner)
	b := setup(t, pg, options{cfg: httpapi.Config{
		RequestTimeout: requestTimeout, Wait: 300 * time.Millisecond, Payments: payments.NewService(pg),
		Auth: auth.NewCache(pg, auth.DefaultCacheSize, time.Hour),
	}})
	order := requireFresh(t, b.postOrder(t, uuid.NewString(), seedBody), "an order while the database serves")
	return &degraded{testBundle: b, pool: pool, order: order.Id}
}

// attempt is one request of an idempotent operation under a key of its own.
type attempt struct{ what, path, body, key string }

// attempts are a request of each kind of claim a degraded database must
// refuse honestly.
func (d *degraded) attempts() []attempt {
	return []attempt{
		{"POST /orders (a deferred claim)", "/orders", seedBody, uuid.NewString()},
		{"POST /payments (a claim in a transaction)", "/payments", paymentBody(d.order), uuid.NewString()},
		{"POST /bonus/credits", "/bonus/credits", `{"amount":5,"reason":"x"}`, uuid.NewString()},
	}
}

func (d *degraded) send(t *testing.T, a attempt) reply {
	t.Helper()
	return d.do(t, d.newRequest(t, http.MethodPost, a.path, strings.NewReader(a.body), "Idempotency-Key", a.key))
}

// requireUnavailable checks that r is a 503 with Retry-After: never a 500,
// and never 202 request-in-progress for a key nobody holds.
func requireUnavailable(t *testing.T, r reply, what string) {
	t.Helper()
	require.NotEqual(t, http.StatusAccepted, r.Status, "%s: a 202 says another request holds the key; none does: %s", what, r)
	requireProblem(t, r, problem.Unavailable, what)
	require.NotEmpty(t, r.Header.Get("Retry-After"), "%s: 503 without Retry-After", what)
}

// readiness is /readyz's status, for Eventually.
func (d *degraded) readiness(t *testing.T) int {
	r, err := d.exchange(d.newRequest(t, http.MethodGet, "/readyz", nil))
	if err != nil {
		return -1
	}
	return r.Status
}

// requireNotReady checks that /readyz answers 503 within its own deadline
// and says why.
func (d *degraded) requireNotReady(t *testing.T, reason string) {
	t.Helper()
	began := time.Now()
	r := d.get(t, "/readyz")
	elapsed := time.Since(began)
	det := requireProblem(t, r, problem.Unavailable, "/readyz")
	require.Contains(t, det.Detail, reason, "/readyz says why")
	require.NotEmpty(t, r.Header.Get("Retry-After"))
	require.Less(t, elapsed, postgres.ReadyTimeout+500*time.Millisecond, "/readyz answers within its own deadline")
}

// requireRunOnce checks that attempts refused while the database could not
// serve run now, under the same keys: nothing of them was stored.
func (d *degraded) requireRunOnce(t *testing.T, refused []attempt) {
	t.Helper()
	for _, a := range refused {
		r := d.send(t, a)
		require.Contains(t, []int{http.StatusCreated, http.StatusAccepted}, r.Status, "%s: the refused key runs now: %s", a.what, r)
		require.Empty(t, r.Header.Get("Idempotent-Replayed"), "%s: nothing was stored while refused", a.what)
	}
}

// A read-only primary (a full disk's protection mode sets
// default_transaction_read_only; a demoted primary is in recovery, the same
// SQLSTATE 25006) answers every write 503 with Retry-After and /readyz 503
// saying so, while reads still work. Nothing is consumed: once it is
// writable again, the same keys run.
func TestReadOnlyDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster := testdb.NewCluster(t)
	pool, err := postgres.Open(ctx, cluster.URL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, postgres.Migrate(ctx, pool))
	d := onDegradable(t, cluster.URL(), 5*time.Second)

	cluster.Exec(t, "ALTER SYSTEM SET default_transaction_read_only = on")
	cluster.Exec(t, "SELECT pg_reload_conf()")
	require.Eventually(t, func() bool { return d.readiness(t) == http.StatusServiceUnavailable }, 10*time.Second, 20*time.Millisecond,
		"/readyz turns unready once the primary is read-only")
	d.requireNotReady(t, "read-only")
	refused := d.attempts()
	for _, a := range refused {
		requireUnavailable(t, d.send(t, a), a.what)
	}
	require.Equal(t, http.StatusOK, d.get(t, "/orders/"+d.order).Status, "reads still work")

	cluster.Exec(t, "ALTER SYSTEM RESET default_transaction_read_only")
	cluster.Exec(t, "SELECT pg_reload_conf()")
	require.Eventually(t, func() bool { return d.readiness(t) == http.StatusOK }, 10*time.Second, 20*time.Millisecond,
		"/readyz recovers by itself")
	d.requireRunOnce(t, refused)
}

// With every connection of the pool held (behind a lock, by a slow query, a
// leak), a request with a brand-new key is 503 with Retry-After once its
// deadline passes, never 202 request-in-progress, and /readyz is 503
// within its own short deadline, naming the pool. Nothing is consumed.
func TestStarvedPool(t *testing.T) {
	t.Parallel()
	url, _ := testdb.Fresh(t)
	const requestTimeout = 700 * time.Millisecond
	d := onDegradable(t, url+"&pool_max_conns=2", requestTimeout)

	var held []*pgxpool.Conn
	for range d.pool.Stat().MaxConns() {
		conn, err := d.pool.Acquire(context.Background())
		require.NoError(t, err, "hold a connection of the service's pool")
		held = append(held, conn)
	}
	released := false
	release := func() {
		if !released {
			released = true
			for _, c := range held {
				c.Release()
			}
		}
	}
	t.Cleanup(release)

	refused := d.attempts()
	for _, a := range refused {
		began := time.Now()
		r := d.send(t, a)
		requireUnavailable(t, r, a.what)
		require.Less(t, time.Since(began), requestTimeout+time.Second, "%s: bounded by the request's deadline", a.what)
	}
	requireUnavailable(t, d.get(t, "/orders/"+d.order), "a read")
	d.requireNotReady(t, "all 2 of the pool's connections are in use")

	release()
	require.Equal(t, http.StatusOK, d.readiness(t), "ready again")
	d.requireRunOnce(t, refused)
}

// Behind a lock on the orders table, with a statement timeout on every
// session: a new key is 503 with Retry-After (the lock timeout of its claim
// ran out on the orders table, not on its key), a payment that waits on the
// order's row is cut short by the statement timeout and is 503 as well, and
// nothing is consumed.
func TestLockedTableIsNoKeyInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool := testdb.Fresh(t)
	d := onDegradable(t, url+"&statement_timeout=500", 5*time.Second)

	locker, err := pool.Begin(ctx)
	require.NoError(t, err)
	unlocked := false
	unlock := func() {
		if !unlocked {
			unlocked = true
			_ = locker.Rollback(ctx)
		}
	}
	t.Cleanup(unlock)
	_, err = locker.Exec(ctx, "LOCK TABLE orders IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)

	refused := d.attempts()[:2] // an order, and a payment of one
	for _, a := range refused {
		began := time.Now()
		requireUnavailable(t, d.send(t, a), a.what)
		require.Less(t, time.Since(began), 2*time.Second, "%s: cut short by the lock or statement timeout", a.what)
	}
	unlock()
	d.requireRunOnce(t, refused)
}
