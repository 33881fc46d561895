// Package testdb gives each test binary of the service its own PostgreSQL
// database, migrated with Oncekey's schema, on the real server, and drops it
// afterwards: pgstoretest's databases (the engine's own test harness, which
// Oncekey uses as any adopter would), opened and migrated as the service
// opens and migrates its own, plus replicas, clusters and partitioned
// variants for the tests that need them.
//
// The server is TEST_DATABASE_URL (default postgres://postgres@127.0.0.1:5432/postgres).
// When it cannot be reached the tests are skipped — except when CI is set,
// where they fail loudly: a suite that silently skips its database tests in
// CI proves nothing.
package testdb

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/idempotency/pgstore/pgstoretest"
	"github.com/oncekey/oncekey/internal/store/postgres"
)

// AdminURL is the URL of the server's maintenance database.
func AdminURL() string { return pgstoretest.AdminURL() }

// Main runs the package's tests on databases migrated with Oncekey's
// schema, and drops them afterwards. Call it from TestMain.
func Main(m *testing.M) {
	MainWith(m, postgres.Migrate)
}

// MainWith is Main for a package whose databases are migrated by fn
// instead of with Oncekey's schema.
func MainWith(m *testing.M, fn func(context.Context, *pgxpool.Pool) error) {
	pgstoretest.Main(m, pgstoretest.Options{
		Migrate: fn,
		Open:    func(ctx context.Context, url string) (*pgxpool.Pool, error) { return postgres.Open(ctx, url) },
		After:   stopShared,
	})
}

// URL returns the URL of this test binary's migrated database, creating it
// on first use.
func URL(t testing.TB) string {
	t.Helper()
	return pgstoretest.URL(t)
}

// Pool returns a pool on this test binary's database (shared by its tests;
// tests keep apart by using their own accounts).
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return pgstoretest.Pool(t)
}

func setup(t testing.TB) {
	t.Helper()
	pgstoretest.Require(t)
}

// Fresh creates a migrated database of the test's own, for tests that need
// a table to themselves (counting rows, purging everything expired), and
// drops it when the test ends.
func Fresh(t testing.TB) (dbURL string, pool *pgxpool.Pool) {
	t.Helper()
	return pgstoretest.Fresh(t)
}

// Empty creates an empty database of the test's own (nothing migrated), for
// tests of migrating itself, and drops it when the test ends.
func Empty(t testing.TB) (dbURL string, pool *pgxpool.Pool) {
	t.Helper()
	return pgstoretest.Empty(t)
}

// freshOn creates a database of the test's own on the server of adminURL,
// and drops it when the test ends.
func freshOn(t testing.TB, adminURL string, migrate bool) (dbURL string, pool *pgxpool.Pool) {
	t.Helper()
	return pgstoretest.FreshOn(t, adminURL, migrate)
}
