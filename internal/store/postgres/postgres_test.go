package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/store/postgres"
	"github.com/oncekey/oncekey/internal/store/storetest"
	"github.com/oncekey/oncekey/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// TestConformance runs the store suite on the real database. Its
// "ConcurrentClaimWaitsForHolder/holder does not settle within the wait"
// case is the check that a claim's wait on an open holder transaction is
// bounded by lock_timeout.
func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) storetest.Store { return postgres.New(testdb.Pool(t)) })
}

// TestMigrate checks that replicas starting together may all migrate: the
// advisory lock makes one apply the schema and the others find it done.
func TestMigrate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		pool func(t *testing.T) *pgxpool.Pool
	}{
		{name: "migrated database", pool: func(t *testing.T) *pgxpool.Pool { return testdb.Pool(t) }},
		{name: "empty database", pool: emptyDatabase},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pool := tt.pool(t)
			ctx := t.Context()

			const replicas = 3
			errs := make([]error, replicas)
			var wg sync.WaitGroup
			for i := range replicas {
				wg.Go(func() { errs[i] = postgres.Migrate(ctx, pool) })
			}
			wg.Wait()
			for i, err := range errs {
				require.NoError(t, err, "migration %d of %d concurrent ones", i+1, replicas)
			}

			var applied int
			require.NoError(t, pool.QueryRow(ctx,
				"SELECT count(*) FROM goose_db_version WHERE version_id = 1 AND is_applied").Scan(&applied),
				"read goose_db_version")
			require.Equal(t, 1, applied, "times the first migration was applied")
			var tables int
			require.NoError(t, pool.QueryRow(ctx,
				`SELECT count(*) FROM pg_tables WHERE schemaname = 'public'
				   AND tablename IN ('accounts', 'api_keys', 'idempotency_keys', 'orders')`).Scan(&tables),
				"read pg_tables")
			require.Equal(t, 4, tables, "schema tables present after migrating")
		})
	}
}

// emptyDatabase creates a database with no schema on the test server and
// drops it when the test ends.
func emptyDatabase(t *testing.T) *pgxpool.Pool {
	t.Helper()
	testdb.Pool(t) // skips (or fails in CI) like every other database test when there is no server
	ctx := t.Context()
	admin, err := pgx.Connect(ctx, testdb.AdminURL())
	require.NoError(t, err, "connect to the admin database")
	t.Cleanup(func() { _ = admin.Close(context.Background()) })

	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "oncekey_migrate_test_" + hex.EncodeToString(b[:])
	_, err = admin.Exec(ctx, "CREATE DATABASE "+name)
	require.NoError(t, err, "create database %s", name)

	u, err := url.Parse(testdb.AdminURL())
	require.NoError(t, err, "parse the admin URL")
	u.Path = "/" + name
	pool, err := postgres.Open(ctx, u.String())
	require.NoError(t, err, "open database %s", name)
	// Registered last, so it runs first: close the pool, then drop.
	t.Cleanup(func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		require.NoError(t, err, "drop database %s", name)
	})
	return pool
}

// TestKeyStatsDoNotCountALargeTable checks that the statistics a metrics
// scrape reads do not count a large key table row by row, even when it was
// never analyzed (autovacuum off: PostgreSQL then knows no row estimate,
// reltuples = -1): the total comes from the statistics system's live-row
// count instead.
func TestKeyStatsDoNotCountALargeTable(t *testing.T) {
	t.Parallel()
	// Above the 100,000 below which the total is counted.
	const rows = 120_000
	// One session: the statistics of the one that runs KeyStats are flushed below.
	pool := oneSessionDatabase(t)
	ctx := t.Context()
	exec := func(sql string) {
		t.Helper()
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err, "%s", sql)
	}
	// Makes this session report its statistics now rather than within
	// the second: at the end of the statement after this one.
	flushStats := func() {
		t.Helper()
		exec("SELECT pg_stat_force_next_flush()")
		exec("SELECT 1")
	}
	exec("ALTER TABLE idempotency_keys SET (autovacuum_enabled = false)")
	exec(fmt.Sprintf(`INSERT INTO idempotency_keys (account_id, idempotency_key, fingerprint, request_method, request_route,
		status, response_status, response_headers, response_body, completed_at, expires_at)
		SELECT gen_random_uuid(), g::text, sha256(g::text::bytea), 'POST', '/orders',
		       'completed', 201, '{}', '\x7b7d', now(), now() + interval '1 hour'
		FROM generate_series(1, %d) g`, rows))
	flushStats()
	var reltuples float64
	require.NoError(t, pool.QueryRow(ctx, "SELECT reltuples FROM pg_class WHERE oid = 'idempotency_keys'::regclass").Scan(&reltuples), "reltuples")
	require.Equal(t, float64(-1), reltuples, "the table was never analyzed")
	tuplesRead := func() (read, live int64) {
		t.Helper()
		require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0), n_live_tup
			FROM pg_stat_user_tables WHERE relname = 'idempotency_keys'`).Scan(&read, &live), "table statistics")
		return read, live
	}
	before, live := tuplesRead()
	require.EqualValues(t, rows, live, "live rows in the statistics system")

	stats, err := postgres.New(pool).KeyStats(ctx)
	require.NoError(t, err, "key statistics")
	flushStats()
	after, _ := tuplesRead()
	require.EqualValues(t, rows, stats.Completed, "completed keys")
	require.Less(t, after-before, int64(rows/10), "rows of the key table read to compute its statistics")
}

// oneSessionDatabase creates a migrated database of the test's own and
// returns a pool of one connection on it, for tests that look at what a
// session keeps (its prepared statements, its statistics), and drops it
// when the test ends.
func oneSessionDatabase(t *testing.T) *pgxpool.Pool {
	t.Helper()
	dbURL, _ := testdb.Fresh(t)
	cfg, err := pgxpool.ParseConfig(dbURL)
	require.NoError(t, err, "parse %s", dbURL)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err, "pool")
	t.Cleanup(pool.Close) // registered after the drop, so it runs before
	return pool
}
