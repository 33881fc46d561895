// Package pgstoretest gives tests PostgreSQL databases of their own on a real
// server: one per test binary, shared by its tests, and fresh ones for a test
// that needs a database to itself. Each is created with a random name,
// migrated (MigrateSuite unless the caller says otherwise) and dropped
// when the tests end, so tests never share state with other packages or with
// earlier runs. A test process that died before dropping its databases is
// known by the id in their names, and the next run drops them.
//
// The server is DATABASE_URL (TEST_DATABASE_URL, where set, first; default
// postgres://postgres@127.0.0.1:5432/postgres). When it cannot be reached,
// the tests that ask for a database are skipped, except when CI is set, where
// they fail: a suite that silently skips its database tests in CI proves
// nothing.
package pgstoretest

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
)

// DefaultAdminURL is where the tests find PostgreSQL unless
// TEST_DATABASE_URL or DATABASE_URL says otherwise.
const DefaultAdminURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// AdminURL is the URL of the server's maintenance database, on which the
// test databases are created: TEST_DATABASE_URL, else DATABASE_URL (so
// that the variable that points a service at its server points its tests
// there too), else DefaultAdminURL. The test databases are made beside
// the URL's database, never in it.
func AdminURL() string {
	for _, name := range []string{"TEST_DATABASE_URL", "DATABASE_URL"} {
		if u := os.Getenv(name); u != "" {
			return u
		}
	}
	return DefaultAdminURL
}

// Options says how a test binary's databases are migrated and opened.
type Options struct {
	// Migrate prepares a new database (default: MigrateSuite, pgstore's
	// default key table and the table storetest's writes go to).
	Migrate func(context.Context, *pgxpool.Pool) error
	// Open opens a pool on a database's URL (default: pgxpool.New with at
	// most ten connections, so that several test binaries at once stay
	// within the server's connection limit).
	Open func(ctx context.Context, url string) (*pgxpool.Pool, error)
	// After, optional, runs once the tests have, before the shared
	// database is dropped: to stop servers the tests started, say.
	After func()
}

func (o Options) migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if o.Migrate == nil {
		return MigrateSuite(ctx, pool)
	}
	return o.Migrate(ctx, pool)
}

func (o Options) open(ctx context.Context, dbURL string) (*pgxpool.Pool, error) {
	if o.Open != nil {
		return o.Open(ctx, dbURL)
	}
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 10
	return pgxpool.NewWithConfig(ctx, cfg)
}

var (
	opts    Options
	once    sync.Once
	shared  database
	initErr error
)

// database is one database this package created.
type database struct {
	name, url string
	pool      *pgxpool.Pool
}

// Main runs a package's tests with opts, then drops the shared database if
// one was made. Call it from TestMain.
func Main(m *testing.M, o Options) {
	opts = o
	code := m.Run()
	if o.After != nil {
		o.After()
	}
	if shared.name != "" {
		if shared.pool != nil {
			shared.pool.Close()
		}
		if err := dropDatabase(AdminURL(), shared.name); err != nil {
			fmt.Fprintf(os.Stderr, "pgstoretest: drop %s: %v\n", shared.name, err)
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}

// URL is the URL of the test binary's shared, migrated database, made on
// first use.
func URL(t testing.TB) string {
	t.Helper()
	Require(t)
	return shared.url
}

// Pool is a pool on the test binary's shared database. Its tests keep apart
// by their own scopes and keys.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	Require(t)
	return shared.pool
}

// Require makes the shared database if it is not made yet, and skips t (or
// fails it, when CI is set) when the server cannot be reached.
func Require(t testing.TB) {
	t.Helper()
	once.Do(func() { shared, initErr = create(AdminURL(), true) })
	if initErr != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("pgstoretest: PostgreSQL is required in CI: %v", initErr)
		}
		t.Skipf("pgstoretest: PostgreSQL unavailable (set CI=1 to make this fatal): %v", initErr)
	}
}

// Fresh makes a migrated database of t's own, for a test that needs a table
// to itself (counting rows, purging everything expired); it is dropped when
// t ends.
func Fresh(t testing.TB) (dbURL string, pool *pgxpool.Pool) {
	t.Helper()
	Require(t)
	return FreshOn(t, AdminURL(), true)
}

// Empty makes an empty database of t's own (nothing migrated), for tests
// of migrating itself; it is dropped when t ends.
func Empty(t testing.TB) (dbURL string, pool *pgxpool.Pool) {
	t.Helper()
	Require(t)
	return FreshOn(t, AdminURL(), false)
}

// FreshOn makes a database of t's own on the server of adminURL (another
// server than AdminURL's: a primary with replicas, say), migrated
// or not, and drops it when t ends.
func FreshOn(t testing.TB, adminURL string, migrate bool) (dbURL string, pool *pgxpool.Pool) {
	t.Helper()
	db, err := create(adminURL, migrate)
	if db.name != "" {
		t.Cleanup(func() {
			if db.pool != nil {
				db.pool.Close()
			}
			if err := dropDatabase(adminURL, db.name); err != nil {
				t.Errorf("pgstoretest: drop %s: %v", db.name, err)
			}
		})
	}
	if err != nil {
		t.Fatalf("pgstoretest: %v", err)
	}
	return db.url, db.pool
}

// Database makes a database of its own on AdminURL's server,
// migrated with MigrateSuite, for programs that have no *testing.T (a
// package's runnable examples); drop drops it. Unlike Fresh, it neither
// skips nor fails anything: an unreachable server is its error.
func Database() (pool *pgxpool.Pool, drop func(), err error) {
	db, err := create(AdminURL(), true)
	drop = func() {
		if db.pool != nil {
			db.pool.Close()
		}
		if db.name != "" {
			_ = dropDatabase(AdminURL(), db.name)
		}
	}
	if err != nil {
		drop()
		return nil, nil, err
	}
	return db.pool, drop, nil
}

// namePrefix starts the name of every database this package makes,
// followed by the process's id.
const namePrefix = "idemtest_"

var sweepOnce sync.Once

// create makes a database with a random name on the server of adminURL,
// migrated or not. Its name is returned as soon as it exists, so that the
// caller drops it even when a later step fails.
func create(adminURL string, migrate bool) (db database, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return db, fmt.Errorf("connect to %s: %w", redact(adminURL), err)
	}
	defer admin.Close(ctx)

	sweepOnce.Do(func() { sweep(ctx, admin) })
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := fmt.Sprintf("%s%d_%s", namePrefix, os.Getpid(), hex.EncodeToString(b[:]))
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return db, fmt.Errorf("create database %s: %w", name, err)
	}
	db.name = name
	u, err := url.Parse(adminURL)
	if err != nil {
		return db, fmt.Errorf("parse %s: %w", redact(adminURL), err)
	}
	u.Path = "/" + name
	db.url = u.String()
	if db.pool, err = opts.open(ctx, db.url); err != nil {
		return db, err
	}
	if migrate {
		if err := opts.migrate(ctx, db.pool); err != nil {
			return db, fmt.Errorf("migrate %s: %w", name, err)
		}
	}
	return db, nil
}

// sweep drops the databases that test processes of this machine left when
// they died: each name carries its process's id, and a process that no
// longer runs will not drop them. A process of that id that still runs (the
// id reused) keeps them.
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

func dropDatabase(adminURL, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return err
	}
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	return err
}

// redact is a URL with its user information left out, for errors.
func redact(u string) string {
	if i := strings.Index(u, "@"); i >= 0 {
		if j := strings.Index(u, "://"); j >= 0 && j < i {
			return u[:j+3] + "…" + u[i:]
		}
	}
	return u
}
