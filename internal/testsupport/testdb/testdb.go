// Package testdb gives each test binary of the service its own PostgreSQL
// database, migrated with Oncekey's schema, on the real server, and drops it
// afterwards: pgstoretest's databases (the engine's own test harness, which
// Oncekey uses as any adopter would), opened and migrated as the service
// opens and migrates its own, plus replicas, clusters and partitioned
// variants for the tests that need them.
//
// The server is DATABASE_URL (TEST_DATABASE_URL, where set, first; default
// postgres://postgres@127.0.0.1:5432/postgres).
// When it cannot be reached the tests are skipped — except when CI is set,
// where they fail loudly: a suite that silently skips its database tests in
// CI proves nothing.
package testdb

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/idempotency/pgstore/pgstoretest"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
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
//
// It also silences slog's default logger, which the service's parts fall
// back on when a test gives them none: it belongs to no test, so go test
// would print every passing test's lines with a failing package's output
// (thousands, one per request). A test that wants its service's log gives
// it a logger of its own (servicetest.Logger: shown when the test fails).
func MainWith(m *testing.M, fn func(context.Context, *pgxpool.Pool) error) {
	slog.SetDefault(slog.New(slog.DiscardHandler))
	pgstoretest.Main(m, pgstoretest.Options{
		Migrate: fn,
		Open:    openPool,
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

// PoolSize is the most connections a pool this package opens may hold
// (serve's default is 20). make test holds at most TEST_PG_CONNECTIONS of
// PostgreSQL's connections (see the Makefile) with TEST_P test binaries at
// a time, each running TEST_PARALLEL tests at a time: a pool per running
// test and the binary's shared one, at PoolSize each, keep a binary within
// its share. A test that opens a pool of its own caps it too (PoolURL).
const PoolSize = 6

// PoolURL is dbURL with its pool capped at size connections
// (pool_max_conns), for a test that opens a pool of its own on a database
// of this package (PoolSize), or starts a process that does.
func PoolURL(dbURL string, size int) string {
	sep := "?"
	if strings.Contains(dbURL, "?") {
		sep = "&"
	}
	return dbURL + sep + "pool_max_conns=" + strconv.Itoa(size)
}

// openPool opens a pool as the service does (postgres.Open), of at most
// PoolSize connections, which it closes once they have been idle for a
// second: a test's pool that has served a burst would otherwise keep its
// connections from every other test for half an hour.
func openPool(ctx context.Context, dbURL string) (*pgxpool.Pool, error) {
	return postgres.Open(ctx, PoolURL(dbURL, PoolSize), func(cfg *pgxpool.Config) {
		cfg.MaxConnIdleTime = time.Second
		cfg.HealthCheckPeriod = 500 * time.Millisecond
	})
}
