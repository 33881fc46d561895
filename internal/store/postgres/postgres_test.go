package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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
