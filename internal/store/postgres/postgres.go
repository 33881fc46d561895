// Package postgres is the durable store: idempotency records, orders and
// accounts in PostgreSQL through pgx/v5 and the sqlc queries in gen/db.
// pgx errors are translated here, once, into the domain packages' errors, so
// no caller imports pgx to check one.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"strings"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	pgxuuid "github.com/vgarvardt/pgx-google-uuid/v5"

	"github.com/oncekey/oncekey"
	"github.com/oncekey/oncekey/gen/db"
	"github.com/oncekey/oncekey/internal/idempotency"
)

// DefaultMaxConns is the pool size when DATABASE_URL sets no pool_max_conns.
// pgx's own default (the number of CPUs, at least 4) is too small for a
// server whose requests each hold a connection for a transaction.
const DefaultMaxConns = 20

// Option adjusts the pool's configuration.
type Option func(*pgxpool.Config)

// WithTracing traces every query as an OpenTelemetry span (through the
// global tracer provider), so a request's trace shows its database work.
func WithTracing() Option {
	return func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = otelpgx.NewTracer() }
}

// WithQueryTracer installs tracer on every connection (tests count round
// trips with it).
func WithQueryTracer(tracer pgx.QueryTracer) Option {
	return func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = tracer }
}

// Open connects a pool to url (a PostgreSQL URL or DSN; pgxpool settings
// such as pool_max_conns may be given in it) and checks that it answers.
func Open(ctx context.Context, url string, opts ...Option) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	for _, opt := range opts {
		opt(cfg)
	}
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = "oncekey"
	}
	if !strings.Contains(url, "pool_max_conns") {
		cfg.MaxConns = DefaultMaxConns
	}
	// uuid.UUID is every table's key type; without this pgx sends it
	// through database/sql's Valuer (a string, parsed back to bytes) on
	// every parameter, which the profile of a first request showed.
	cfg.AfterConnect = func(_ context.Context, conn *pgx.Conn) error {
		pgxuuid.Register(conn.TypeMap())
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("create pool: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	return pool, nil
}

// Migrate applies the embedded migrations in schema/, then River's (the
// background jobs' tables). A PostgreSQL session
// advisory lock serialises concurrent callers, so replicas that start
// together migrate once and the rest wait, then find nothing to do.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	fsys, err := fs.Sub(oncekey.Migrations, "schema")
	if err != nil {
		return fmt.Errorf("open embedded migrations: %w", err)
	}
	// Probe the lock every second (for up to five minutes) rather than
	// goose's default five, so replicas starting together wait little.
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(1, 300))
	if err != nil {
		return fmt.Errorf("create migration lock: %w", err)
	}
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	provider, err := goose.NewProvider(goose.DialectPostgres, sqlDB, fsys, goose.WithSessionLocker(locker))
	if err != nil {
		return fmt.Errorf("load migrations: %w", err)
	}
	if _, err := provider.Up(ctx); err != nil {
		return fmt.Errorf("apply migrations: %w", err)
	}
	return migrateRiver(ctx, pool)
}

// riverMigrateLockID serialises River's migrations across replicas
// ("oncekey.river" in ASCII, truncated to 8 bytes).
const riverMigrateLockID int64 = 0x6f6e63656b65792f

// migrateRiver applies River's own migrations (its job tables). They cannot
// share one transaction (a later one uses an enum value an earlier one
// adds), so a session advisory lock, held on a connection of its own while
// River migrates on others, makes replicas that start together apply them
// once: the others wait, then find nothing to do.
func migrateRiver(ctx context.Context, pool *pgxpool.Pool) error {
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return fmt.Errorf("load River migrations: %w", err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return translate(fmt.Errorf("River migrations: acquire connection: %w", err))
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", riverMigrateLockID); err != nil {
		return translate(fmt.Errorf("take River migration lock: %w", err))
	}
	defer func() {
		if _, err := conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", riverMigrateLockID); err != nil {
			// The lock must not outlive this run on a pooled connection.
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
		}
	}()
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("apply River migrations: %w", err)
	}
	return nil
}

// Store implements idempotency.Store, orders.Repository and auth.Store on
// one pool, so an order written inside a claim joins the claim's transaction.
type Store struct {
	pool    *pgxpool.Pool
	commits *groupCommitter
}

// New returns a store on pool. The schema must be migrated.
func New(pool *pgxpool.Pool) *Store {
	return &Store{pool: pool, commits: &groupCommitter{pool: pool}}
}

// Ping reports whether the database answers; it backs /readyz.
func (s *Store) Ping(ctx context.Context) error {
	return translate(s.pool.Ping(ctx))
}

type txKey struct{}

// queries returns queries bound to the unit of work in ctx (an idempotency
// lease's transaction, or a deferred lease's pipeline) or, outside one, to
// the pool.
func (s *Store) queries(ctx context.Context) *db.Queries {
	if unit, ok := ctx.Value(txKey{}).(db.DBTX); ok {
		return db.New(unit)
	}
	return db.New(s.pool)
}

// TxFrom returns the transaction of the idempotency lease in ctx, for code
// outside this package that must write in it: River inserts a payment's job
// in the transaction that creates the payment.
func TxFrom(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok
}

// translate maps driver errors that mean "the database is not there right
// now" to idempotency.ErrUnavailable (503 with Retry-After), keeping the
// original in the chain for logs.
func translate(err error) error {
	if err == nil {
		return nil
	}
	if isUnavailable(err) {
		return fmt.Errorf("%w: %w", idempotency.ErrUnavailable, err)
	}
	return err
}

func isUnavailable(err error) bool {
	var netErr net.Error
	var connectErr *pgconn.ConnectError
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, context.DeadlineExceeded),
		// The connection died mid-statement (the server crashed or was
		// shut down): what it was doing is rolled back or, at COMMIT,
		// unknown; a retry with the same key settles either way.
		errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF),
		errors.As(err, &netErr), errors.As(err, &connectErr),
		pgconn.Timeout(err), pgconn.SafeToRetry(err):
		return true
	case errors.As(err, &pgErr):
		// Class 08: connection exception; 57P0x: the server is shutting
		// down or cannot accept connections; 53300: too many connections.
		return pgErr.Code[:2] == "08" || pgErr.Code == "57P01" || pgErr.Code == "57P02" ||
			pgErr.Code == "57P03" || pgErr.Code == "53300"
	}
	return false
}
