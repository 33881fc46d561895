package metrics_test

import (
	"context"
	"crypto/rand"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/metrics"
	"github.com/oncekey/oncekey/internal/service/store"
	"github.com/oncekey/oncekey/internal/service/store/memory"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// storeFamilies are what the store collector exports when the store answers.
var storeFamilies = []string{
	"oncekey_idempotency_keys", "oncekey_idempotency_keys_table_bytes", "oncekey_idempotency_pieces_table_bytes",
	"oncekey_idempotency_oldest_processing_age_seconds", "oncekey_cleanup_lag_seconds",
}

// freshStoreScrape scrapes a new Metrics with source registered: the
// collector caches KeyStats for 10s, so each phase of a test reads the
// store through a collector of its own instead of sleeping.
func freshStoreScrape(t *testing.T, source metrics.StatsSource) families {
	t.Helper()
	m := metrics.New()
	m.RegisterStore(source)
	return scrapeMetrics(t, m)
}

func keys(t *testing.T, f families, status string) float64 {
	t.Helper()
	return f.value(t, "oncekey_idempotency_keys", "status", status)
}

func TestStoreCollectorPostgres(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool := testdb.Fresh(t) // whole-table figures need a table of the test's own
	store := postgres.New(pool, nil)
	m := metrics.New()
	m.RegisterStore(store)
	b := setup(t, store, options{cfg: httpapi.Config{Metrics: m}})

	const committed = 5
	for range committed {
		key := uuid.NewString()
		b.createOrder(t, key, seedBody)
		b.do(t, http.StatusCreated, http.MethodPost, "/orders", seedBody, idempotency.HeaderKey, key) // replay: no new key
	}
	b.do(t, http.StatusBadRequest, http.MethodPost, "/orders", seedBody) // rejected: no key stored

	f := scrape(t, b.url)
	require.Equal(t, 1.0, f.value(t, "oncekey_db_up"), "the database answers")
	require.Equal(t, float64(committed), keys(t, f, "completed"), "one completed key per committed operation")
	require.Zero(t, keys(t, f, "processing"), "nothing is processing between requests")
	require.Greater(t, f.value(t, "oncekey_idempotency_keys_table_bytes"), 0.0, "the keys table and its indexes take space")
	require.Greater(t, f.value(t, "oncekey_idempotency_pieces_table_bytes"), 0.0, "the pieces table's indexes take space, empty as it is")
	require.Zero(t, f.value(t, "oncekey_idempotency_oldest_processing_age_seconds"), "no processing key: age 0")
	require.Zero(t, f.value(t, "oncekey_cleanup_lag_seconds"), "no expired key: lag 0")

	// A key stuck in 'processing' for ten minutes, as a crashed process
	// that somehow committed its claim would leave it.
	stuckAccount := uuid.New()
	_, err := pool.Exec(ctx, `INSERT INTO idempotency_keys
		(scope, idempotency_key, fingerprint, request_method, request_route, status, created_at, expires_at)
		VALUES (uuid_send($1), 'stuck', decode(repeat('ab', 32), 'hex'), 'POST', '/orders', 'processing', now() - interval '10 minutes', now() + interval '48 hours')`,
		stuckAccount)
	require.NoError(t, err, "insert a stuck processing key")
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), "DELETE FROM idempotency_keys WHERE scope = uuid_send($1)", stuckAccount)
		require.NoError(t, err, "delete the stuck key")
	})

	cached := scrape(t, b.url)
	require.Zero(t, keys(t, cached, "processing"), "scrapes within 10s are served from the collector's cache, not the database")

	f = freshStoreScrape(t, store)
	require.Equal(t, 1.0, keys(t, f, "processing"), "the stuck key is processing")
	require.Equal(t, float64(committed), keys(t, f, "completed"), "completed excludes processing keys")
	age := f.value(t, "oncekey_idempotency_oldest_processing_age_seconds")
	require.GreaterOrEqual(t, age, 600.0, "the stuck key has been processing for 10 minutes")
	require.Less(t, age, 660.0, "the age is in seconds")

	// A completed key that expired an hour ago and was not purged yet.
	expiredAccount := uuid.New()
	_, err = pool.Exec(ctx, `INSERT INTO idempotency_keys
		(scope, idempotency_key, fingerprint, request_method, request_route, status,
		 response_status, response_headers, response_body, created_at, completed_at, expires_at)
		VALUES (uuid_send($1), 'expired', decode(repeat('cd', 32), 'hex'), 'POST', '/orders', 'completed',
		 201, '{}', '\x7b7d'::bytea, now() - interval '49 hours', now() - interval '49 hours', now() - interval '1 hour')`,
		expiredAccount)
	require.NoError(t, err, "insert an expired key")
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), "DELETE FROM idempotency_keys WHERE scope = uuid_send($1)", expiredAccount)
		require.NoError(t, err, "delete the expired key")
	})

	f = freshStoreScrape(t, store)
	lag := f.value(t, "oncekey_cleanup_lag_seconds")
	require.GreaterOrEqual(t, lag, 3600.0, "the expired key waits for cleanup since it expired an hour ago")
	require.Less(t, lag, 3660.0, "the lag is in seconds")
	require.Equal(t, float64(committed+1), keys(t, f, "completed"), "an expired key still counts until it is deleted")

	n, err := store.PurgeExpired(ctx, 100)
	require.NoError(t, err, "purge")
	require.Equal(t, int64(1), n, "purge deletes the one expired key")
	f = freshStoreScrape(t, store)
	require.Zero(t, f.value(t, "oncekey_cleanup_lag_seconds"), "after the purge nothing is behind")
	require.Equal(t, float64(committed), keys(t, f, "completed"), "the purged key is gone")
	require.Equal(t, 1.0, keys(t, f, "processing"), "the purge leaves unexpired processing keys alone")
}

func TestStoreCollectorMemory(t *testing.T) {
	t.Parallel()
	store := memory.New()
	m := metrics.New()
	m.RegisterStore(store)
	repo := newFaultyRepo()
	b := setup(t, store, options{cfg: httpapi.Config{Metrics: m}, repo: repo.wrap})
	t.Cleanup(repo.unblock) // after setup's, so it runs before the server's Close

	const committed = 3
	for range committed {
		b.createOrder(t, uuid.NewString(), seedBody)
	}
	f := scrape(t, b.url)
	require.Equal(t, 1.0, f.value(t, "oncekey_db_up"), "the memory store always answers")
	require.Equal(t, float64(committed), keys(t, f, "completed"), "one completed key per committed operation")
	require.Zero(t, keys(t, f, "processing"), "nothing is processing between requests")
	require.Zero(t, f.value(t, "oncekey_idempotency_keys_table_bytes"), "memory has no table")
	require.Zero(t, f.value(t, "oncekey_idempotency_pieces_table_bytes"), "no answer in pieces")
	require.Zero(t, f.value(t, "oncekey_cleanup_lag_seconds"), "no expired key")

	// The memory store counts a key whose operation is still running.
	held := b.startHeld(t, repo, uuid.NewString())
	f = freshStoreScrape(t, store)
	require.Equal(t, 1.0, keys(t, f, "processing"), "the held request's key is processing")
	require.Positive(t, f.value(t, "oncekey_idempotency_oldest_processing_age_seconds"), "and has an age")
	require.Equal(t, float64(committed), keys(t, f, "completed"), "completed is unchanged while it runs")

	repo.unblock()
	require.Equal(t, http.StatusCreated, receive(t, held, "the held request").Status, "the held request is created")
	f = freshStoreScrape(t, store)
	require.Zero(t, keys(t, f, "processing"), "the key is no longer processing")
	require.Equal(t, float64(committed+1), keys(t, f, "completed"), "the held request's key is completed")
}

// TestPiecesTableBytes: oncekey_idempotency_pieces_table_bytes is the
// store's KeyStats.PiecesBytes, and grows by at least the bytes of a large
// answer's pieces as a gateway stores them, on PostgreSQL (the pieces
// table, its TOAST and indexes) and in memory (the pieces' lengths).
func TestPiecesTableBytes(t *testing.T) {
	t.Parallel()

	t.Run("the store's figure", func(t *testing.T) {
		t.Parallel()
		f := freshStoreScrape(t, fixedStats{TableBytes: 1 << 20, PiecesBytes: 3 << 30})
		require.Equal(t, float64(3<<30), f.value(t, "oncekey_idempotency_pieces_table_bytes"), "KeyStats.PiecesBytes")
		require.Equal(t, float64(1<<20), f.value(t, "oncekey_idempotency_keys_table_bytes"), "KeyStats.TableBytes, apart")
	})

	const piece = 256 << 10 // random bytes, which do not compress
	for _, be := range []struct {
		name string
		open func(t *testing.T) store.Backend
	}{
		{"memory", func(*testing.T) store.Backend { return memory.New() }},
		{"postgres", func(t *testing.T) store.Backend {
			_, pool := testdb.Fresh(t) // the table's size is the test's own
			return postgres.New(pool, nil)
		}},
	} {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			backend := be.open(t)
			before := freshStoreScrape(t, backend).value(t, "oncekey_idempotency_pieces_table_bytes")

			account := uuid.New()
			lease, rec, err := backend.Keys().Claim(ctx, idempotency.ClaimRequest{
				Scope: string(account[:]), Key: uuid.NewString(), Method: http.MethodGet, Route: "/export",
				TTL: time.Hour, Wait: time.Second,
			})
			require.NoError(t, err, "claim")
			require.Nil(t, rec, "a new key")
			require.NoError(t, lease.Commit(ctx, idempotency.Held{State: idempotency.HeldRunning, Until: time.Now().Add(time.Minute)}.Response()), "hold the key as a gateway does")
			for n := range 2 {
				p := make([]byte, piece)
				_, _ = rand.Read(p)
				ok, err := backend.Keys().WritePiece(ctx, lease.Ref(), n, p)
				require.NoError(t, err, "write piece %d", n)
				require.True(t, ok, "piece %d stored", n)
			}

			after := freshStoreScrape(t, backend).value(t, "oncekey_idempotency_pieces_table_bytes")
			require.GreaterOrEqual(t, after-before, float64(2*piece), "two pieces of %d bytes stored (before: %.0f, after: %.0f)", piece, before, after)
		})
	}
}

// fixedStats is a StatsSource that always answers st.
type fixedStats idempotency.Stats

func (s fixedStats) KeyStats(context.Context) (idempotency.Stats, error) {
	return idempotency.Stats(s), nil
}

// failingStats is a StatsSource whose database does not answer.
type failingStats struct{}

func (failingStats) KeyStats(context.Context) (idempotency.Stats, error) {
	return idempotency.Stats{}, errors.New("injected: the database does not answer")
}

func TestDBUp(t *testing.T) {
	t.Parallel()

	t.Run("0 when the stats source fails, without stale figures", func(t *testing.T) {
		t.Parallel()
		f := freshStoreScrape(t, failingStats{})
		require.Equal(t, 0.0, f.value(t, "oncekey_db_up"), "a failing source is down")
		for _, name := range storeFamilies {
			require.Nil(t, f[name], "%s is not exported while the store does not answer", name)
		}
	})

	t.Run("0 when the pool is closed", func(t *testing.T) {
		t.Parallel()
		pool, err := postgres.Open(context.Background(), testdb.URL(t))
		require.NoError(t, err, "open a pool of its own")
		pool.Close()
		f := freshStoreScrape(t, postgres.New(pool, nil))
		require.Equal(t, 0.0, f.value(t, "oncekey_db_up"), "a store whose pool is closed is down")
	})

	t.Run("1 on a working PostgreSQL store", func(t *testing.T) {
		t.Parallel()
		f := freshStoreScrape(t, postgres.New(testdb.Pool(t), nil))
		require.Equal(t, 1.0, f.value(t, "oncekey_db_up"), "the database answers")
		for _, name := range storeFamilies {
			require.NotNil(t, f[name], "%s is exported while the store answers", name)
		}
	})
}

func TestPoolCollector(t *testing.T) {
	t.Parallel()
	// A pool of its own, so its counters move only with this test's requests.
	pool, err := postgres.Open(context.Background(), testdb.URL(t))
	require.NoError(t, err, "open a pool")
	t.Cleanup(pool.Close)
	m := metrics.New()
	m.RegisterPool(pool)
	b := setup(t, postgres.New(pool, nil), options{cfg: httpapi.Config{Metrics: m}})

	before := scrape(t, b.url)
	const n = 5
	for range n {
		id := b.createOrder(t, uuid.NewString(), seedBody)
		b.do(t, http.StatusOK, http.MethodGet, "/orders/"+id, "")
	}
	f := scrape(t, b.url)

	types := map[string]dto.MetricType{
		"oncekey_db_pool_acquired_conns":                 dto.MetricType_GAUGE,
		"oncekey_db_pool_idle_conns":                     dto.MetricType_GAUGE,
		"oncekey_db_pool_total_conns":                    dto.MetricType_GAUGE,
		"oncekey_db_pool_max_conns":                      dto.MetricType_GAUGE,
		"oncekey_db_pool_acquires_total":                 dto.MetricType_COUNTER,
		"oncekey_db_pool_empty_acquires_total":           dto.MetricType_COUNTER,
		"oncekey_db_pool_canceled_acquires_total":        dto.MetricType_COUNTER,
		"oncekey_db_pool_acquire_duration_seconds_total": dto.MetricType_COUNTER,
	}
	for name, typ := range types {
		require.NotNil(t, f[name], "%s is exported", name)
		require.Equal(t, typ, f[name].GetType(), "type of %s", name)
		require.GreaterOrEqual(t, f.value(t, name), 0.0, "%s", name)
	}

	maxConns := f.value(t, "oncekey_db_pool_max_conns")
	require.Equal(t, float64(pool.Config().MaxConns), maxConns, "max_conns is the pool's configured size")
	require.Equal(t, float64(postgres.DefaultMaxConns), maxConns, "Open's default pool size")

	acquires := f.value(t, "oncekey_db_pool_acquires_total") - before.value(t, "oncekey_db_pool_acquires_total")
	require.GreaterOrEqual(t, acquires, float64(2*n), "every request acquires at least one connection")

	total := f.value(t, "oncekey_db_pool_total_conns")
	require.GreaterOrEqual(t, total, 1.0, "the pool holds a connection after serving requests")
	require.LessOrEqual(t, total, maxConns, "never more connections than the limit")
	require.LessOrEqual(t, f.value(t, "oncekey_db_pool_acquired_conns")+f.value(t, "oncekey_db_pool_idle_conns"), total,
		"acquired and idle connections are among the open ones")
	require.GreaterOrEqual(t, f.value(t, "oncekey_db_pool_acquire_duration_seconds_total"),
		before.value(t, "oncekey_db_pool_acquire_duration_seconds_total"), "acquire time only grows")
}

// What operators are told of payments, readiness and a replica, at scrape
// time: payments pending and the oldest one's age (a stuck payment), the
// database's readiness for writes (0 while every pool connection is held),
// and a paused replica's growing lag.
func TestPaymentsReadinessAndReplicaCollectors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.FreshReplicated(t, testdb.Paused)
	account := uuid.New()
	for _, q := range []string{
		`INSERT INTO accounts (id, name, created_at) VALUES ($1, 'pending', now())`,
		`INSERT INTO orders (account_id, id, status, amount, currency, items, created_at) VALUES ($1, $1, 'created', 1, 'RUB', '[]', now())`,
		`INSERT INTO payments (account_id, id, order_id, amount, currency, status, idempotency_key, key_created_at, created_at)
		 VALUES ($1, $1, $1, 1, 'RUB', 'pending', 'k', now(), now() - interval '40 minutes')`,
	} {
		_, err := db.Pool.Exec(ctx, q, account)
		require.NoError(t, err, q)
	}
	replicaPool, err := postgres.OpenReplica(ctx, db.ReplicaURL)
	require.NoError(t, err)
	t.Cleanup(replicaPool.Close)
	store := postgres.New(db.Pool, nil)
	scrapeWith := func(register func(*metrics.Metrics)) families {
		t.Helper()
		m := metrics.New()
		register(m)
		return scrapeMetrics(t, m)
	}

	f := scrapeWith(func(m *metrics.Metrics) {
		m.RegisterPending(store)
		m.RegisterReadiness(store.Ready)
		m.RegisterReplica(postgres.NewReplica(store, replicaPool, postgres.ReplicaConfig{}))
	})
	require.Equal(t, 1.0, f.value(t, "oncekey_payments_pending", "kind", "payment"))
	require.Zero(t, f.value(t, "oncekey_payments_pending", "kind", "refund"))
	require.GreaterOrEqual(t, f.value(t, "oncekey_payments_oldest_pending_age_seconds", "kind", "payment"), 40*60.0)
	require.Equal(t, 1.0, f.value(t, "oncekey_db_ready"), "ready while a connection can be had")
	require.Equal(t, 1.0, f.value(t, "oncekey_replica_up"))
	require.Positive(t, f.value(t, "oncekey_replica_lag_seconds"), "the paused replica lags behind what it received")

	var held []func()
	for range db.Pool.Stat().MaxConns() {
		conn, err := db.Pool.Acquire(ctx)
		require.NoError(t, err)
		held = append(held, conn.Release)
	}
	f = scrapeWith(func(m *metrics.Metrics) { m.RegisterReadiness(store.Ready) })
	for _, release := range held {
		release()
	}
	require.Zero(t, f.value(t, "oncekey_db_ready"), "not ready with no connection to be had")
}
