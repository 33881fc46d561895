package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/pgstore/keyadmin"
	"github.com/oncekey/oncekey/internal/service/jobs"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
	"github.com/oncekey/oncekey/internal/service/store/storetest"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// TestConformance runs the backend suite on the real database, with River
// taking the jobs it enqueues (nobody works them).
func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) storetest.Store {
		pool := testdb.Pool(t)
		runner, err := jobs.New(pool, jobs.Config{})
		require.NoError(t, err, "River")
		return postgres.New(pool, runner)
	})
}

// TestConformanceOnPartitionedSchema runs the backend suite on the schema
// with every per-account table hash-partitioned by its account, as a
// database sharded by account would hold them: with the key table's scope
// the account's bytes, and the account's uuid itself.
func TestConformanceOnPartitionedSchema(t *testing.T) {
	t.Parallel()
	for _, scope := range []pgstore.ScopeType{pgstore.ScopeBytea, pgstore.ScopeUUID} {
		t.Run(string(scope), func(t *testing.T) {
			t.Parallel()
			_, pool := testdb.FreshPartitioned(t, scope)
			storetest.Run(t, func(t *testing.T) storetest.Store {
				runner, err := jobs.New(pool, jobs.Config{})
				require.NoError(t, err, "River")
				return postgres.NewKeys(pool, runner, pgstore.Options{Scope: scope})
			})
		})
	}
}

// TestOperatorStatementsPerPartition runs the purge, the key statistics,
// the stuck keys and the expired count on a key table partitioned by
// account: each runs partition by partition (every DELETE names one
// partition), and together they give what they give on one table.
func TestOperatorStatementsPerPartition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, admin := testdb.FreshPartitioned(t, pgstore.ScopeBytea)
	statements := &testdb.Statements{}
	pool, err := postgres.Open(ctx, url, postgres.WithQueryTracer(statements))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	keys := postgres.New(pool, nil).KeyStore()

	const accounts = 16
	for i := range accounts {
		scope := uuid.New()
		_, err := admin.Exec(ctx, `INSERT INTO idempotency_keys (scope, idempotency_key, fingerprint, request_method, request_route, status,
				response_status, response_headers, response_body, created_at, completed_at, expires_at)
			SELECT uuid_send($1), 'expired-' || n, sha256(n::text::bytea), 'POST', '/orders', 'completed',
				201, '{}', '{}', now() - interval '3 days', now() - interval '3 days', now() - interval '1 day'
			FROM generate_series(1, 3) n`, scope)
		require.NoError(t, err)
		_, err = admin.Exec(ctx, `INSERT INTO idempotency_keys (scope, idempotency_key, fingerprint, request_method, request_route, status, created_at, expires_at)
			VALUES (uuid_send($1), 'stuck', sha256('x'), 'POST', '/payments', 'processing', now() - make_interval(mins => $2), now() + interval '1 day')`,
			scope, 10+i)
		require.NoError(t, err)
	}

	expired, err := keyadmin.CountExpired(ctx, keys)
	require.NoError(t, err)
	require.EqualValues(t, 3*accounts, expired)
	stats, err := keys.KeyStats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, accounts, stats.Processing)
	require.EqualValues(t, 3*accounts, stats.Completed)
	require.Positive(t, stats.TableBytes)
	require.InDelta(t, (10+accounts-1)*60, stats.OldestProcessingAge.Seconds(), 5, "the oldest of all partitions")
	stuck, err := keyadmin.Stuck(ctx, keys, 5*time.Minute, 4)
	require.NoError(t, err)
	require.Len(t, stuck, 4)
	for i := 1; i < len(stuck); i++ {
		require.True(t, stuck[i-1].CreatedAt.Before(stuck[i].CreatedAt), "oldest first across partitions")
	}
	require.Greater(t, time.Since(stuck[0].CreatedAt), time.Duration(10+accounts-2)*time.Minute, "the oldest of all")

	deleted, err := keys.PurgeExpired(ctx, 2)
	require.NoError(t, err)
	require.EqualValues(t, 3*accounts, deleted)
	expired, err = keyadmin.CountExpired(ctx, keys)
	require.NoError(t, err)
	require.Zero(t, expired)
	purged := statements.Matching("-- name: IdempotencyKeyPurgeExpired ")
	require.Len(t, purged, 8, "one purge statement per partition")
	// The pieces of large answers are swept once, on the key table as a
	// whole, after the partitions.
	require.Len(t, statements.Matching("-- name: IdempotencyKeySweepPieces "), 1, "one sweep of the pieces")
	for _, sql := range purged {
		require.Regexp(t, `DELETE FROM "public"\."idempotency_keys_p[0-7]" k`, sql, "each partition's name quoted")
	}
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

// TestKeyTableIsTheEngines checks that the key table Oncekey's migrations
// leave (created in 00001, converted in 00004) is the one the idempotency
// engine's own migrations create: the same columns, constraints and
// indexes, so the engine's statements and Oncekey's claim guards meet the
// table they were written for.
func TestKeyTableIsTheEngines(t *testing.T) {
	t.Parallel()
	oncekeys := testdb.Pool(t)
	_, engines := testdb.Empty(t)
	require.NoError(t, pgstore.Migrate(t.Context(), engines, pgstore.Options{}), "the engine's migrations alone")
	require.Equal(t, tableLayout(t, engines), tableLayout(t, oncekeys), "the key table after Oncekey's migrations")
}

// tableLayout describes the key table's columns, constraints and indexes.
func tableLayout(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(t.Context(), `
		SELECT format('column %s %s %s %s', column_name, data_type, is_nullable, coalesce(column_default, ''))
		FROM information_schema.columns WHERE table_name = 'idempotency_keys'
		UNION ALL
		SELECT format('constraint %s %s', conname, pg_get_constraintdef(oid))
		FROM pg_constraint WHERE conrelid = 'idempotency_keys'::regclass
		UNION ALL
		SELECT format('index %s', indexdef) FROM pg_indexes WHERE tablename = 'idempotency_keys'
		ORDER BY 1`)
	require.NoError(t, err, "describe the key table")
	layout, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err, "describe the key table")
	return layout
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
