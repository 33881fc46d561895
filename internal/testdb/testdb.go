// Package testdb gives each test binary its own freshly migrated PostgreSQL
// database on the real server, and drops it afterwards. Tests never share
// state with other packages or with earlier runs.
//
// The server is TEST_DATABASE_URL (default postgres://postgres@127.0.0.1:5432/postgres).
// When it cannot be reached the tests are skipped — except when CI is set,
// where they fail loudly: a suite that silently skips its database tests in
// CI proves nothing.
package testdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/internal/store/postgres"
)

// DefaultAdminURL is where the tests find PostgreSQL unless TEST_DATABASE_URL says otherwise.
const DefaultAdminURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

var (
	once    sync.Once
	dbURL   string
	dbName  string
	pool    *pgxpool.Pool
	initErr error
)

// AdminURL is the URL of the server's maintenance database.
func AdminURL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultAdminURL
}

// migrateDB is how this test binary's databases are migrated.
var migrateDB = postgres.Migrate

// Main runs the package's tests and drops the package's database, if one was
// created, afterwards. Call it from TestMain.
func Main(m *testing.M) {
	MainWith(m, postgres.Migrate)
}

// MainWith is Main for a package whose databases are migrated by fn
// instead of with Oncekey's schema: the idempotency engine's own tests,
// whose database holds nothing else.
func MainWith(m *testing.M, fn func(context.Context, *pgxpool.Pool) error) {
	migrateDB = fn
	code := m.Run()
	stopShared()
	if dbName != "" {
		if pool != nil {
			pool.Close()
		}
		if err := dropDatabase(dbName); err != nil {
			fmt.Fprintf(os.Stderr, "testdb: drop %s: %v\n", dbName, err)
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}

// URL returns the URL of this test binary's migrated database, creating it
// on first use.
func URL(t testing.TB) string {
	t.Helper()
	setup(t)
	return dbURL
}

// Pool returns a pool on this test binary's database (shared by its tests;
// tests keep apart by using their own accounts).
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	setup(t)
	return pool
}

func setup(t testing.TB) {
	t.Helper()
	once.Do(func() { initErr = create() })
	if initErr != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("testdb: PostgreSQL is required in CI: %v", initErr)
		}
		t.Skipf("testdb: PostgreSQL unavailable (set CI=1 to make this fatal): %v", initErr)
	}
}

func create() (err error) {
	dbName, dbURL, pool, err = newDatabase()
	return err
}

// newDatabase creates a database with a random name on the server and
// migrates it. name is returned as soon as the database exists, so that the
// caller drops it even when a later step fails.
func newDatabase() (name, dbURL string, pool *pgxpool.Pool, err error) {
	return createDatabase(AdminURL(), true)
}

// createDatabase creates a database with a random name on the server of
// adminURL, migrated or not.
func createDatabase(adminURL string, migrate bool) (name, dbURL string, pool *pgxpool.Pool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return "", "", nil, fmt.Errorf("connect to %s: %w", redact(adminURL), err)
	}
	defer admin.Close(ctx)

	sweepOnce.Do(func() { sweep(ctx, admin) })
	var b [6]byte
	_, _ = rand.Read(b[:])
	candidate := fmt.Sprintf("%s%d_%s", namePrefix, os.Getpid(), hex.EncodeToString(b[:]))
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+candidate); err != nil {
		return "", "", nil, fmt.Errorf("create database %s: %w", candidate, err)
	}
	name = candidate
	if dbURL, err = onDatabase(adminURL, name); err != nil {
		return name, "", nil, err
	}

	pool, err = postgres.Open(ctx, dbURL)
	if err != nil {
		return name, dbURL, nil, err
	}
	if !migrate {
		return name, dbURL, pool, nil
	}
	if err := migrateDB(ctx, pool); err != nil {
		return name, dbURL, pool, fmt.Errorf("migrate %s: %w", name, err)
	}
	return name, dbURL, pool, nil
}

// onDatabase is adminURL with its database replaced by name.
func onDatabase(adminURL, name string) (string, error) {
	u, err := url.Parse(adminURL)
	if err != nil {
		return "", fmt.Errorf("parse %s: %w", redact(adminURL), err)
	}
	u.Path = "/" + name
	return u.String(), nil
}

func dropDatabase(name string) error { return dropDatabaseOn(AdminURL(), name) }

// namePrefix starts the name of every database a test makes, followed by
// the process's id: a process that died before dropping its databases (a
// fuzz worker the fuzzer killed, a test binary killed at its timeout) is
// known by it.
const namePrefix = "oncekey_test_"

var sweepOnce sync.Once

// sweep drops the databases that test processes of this machine left when
// they died: each name carries its process's id, and a process that no
// longer runs will not drop them. Best effort: a database in use by a
// process of that id that is not a test (the id reused) is left alone.
func sweep(ctx context.Context, admin *pgx.Conn) {
	rows, err := admin.Query(ctx, "SELECT datname FROM pg_database WHERE datname LIKE $1", namePrefix+"%")
	if err != nil {
		return
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return
	}
	for _, name := range names {
		pid, _, ok := strings.Cut(strings.TrimPrefix(name, namePrefix), "_")
		if _, err := strconv.Atoi(pid); !ok || err != nil {
			continue
		}
		if _, err := os.Stat("/proc/" + pid); err == nil {
			continue // still running
		}
		_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	}
}

func dropDatabaseOn(adminURL, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return err
	}
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	return err
}

func redact(u string) string {
	if i := strings.Index(u, "@"); i >= 0 {
		if j := strings.Index(u, "://"); j >= 0 && j < i {
			return u[:j+3] + "…" + u[i:]
		}
	}
	return u
}

// Fresh creates a migrated database of the test's own, for tests that need
// a table to themselves (counting rows, purging everything expired), and
// drops it when the test ends.
func Fresh(t testing.TB) (dbURL string, pool *pgxpool.Pool) {
	t.Helper()
	return fresh(t, true)
}

// Empty creates an empty database of the test's own (nothing migrated), for
// tests of migrating itself, and drops it when the test ends.
func Empty(t testing.TB) (dbURL string, pool *pgxpool.Pool) {
	t.Helper()
	return fresh(t, false)
}

func fresh(t testing.TB, migrate bool) (dbURL string, pool *pgxpool.Pool) {
	t.Helper()
	setup(t) // skips or fails like every other database test
	return freshOn(t, AdminURL(), migrate)
}

// freshOn creates a database of the test's own on the server of adminURL,
// and drops it when the test ends.
func freshOn(t testing.TB, adminURL string, migrate bool) (dbURL string, pool *pgxpool.Pool) {
	t.Helper()
	name, dbURL, pool, err := createDatabase(adminURL, migrate)
	if name != "" {
		t.Cleanup(func() {
			if pool != nil {
				pool.Close()
			}
			if err := dropDatabaseOn(adminURL, name); err != nil {
				t.Errorf("testdb: drop %s: %v", name, err)
			}
		})
	}
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	return dbURL, pool
}
