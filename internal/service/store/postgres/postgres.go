// Package postgres is the durable backend: accounts, orders, payments and
// the bonus ledger in PostgreSQL through pgx/v5 and the sqlc queries in
// gen/db, beside the idempotency engine's key table (package pgstore),
// whose transactions the domain writes join. pgx errors are translated
// here, once, into the domain packages' errors, so no caller imports pgx to
// check one.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	pgxuuid "github.com/vgarvardt/pgx-google-uuid/v5"

	"github.com/oncekey/oncekey"
	"github.com/oncekey/oncekey/gen/db"
	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/internal/service/payments"
	"github.com/oncekey/oncekey/internal/service/store"
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
	return open(ctx, url, false, opts...)
}

func open(ctx context.Context, url string, lazy bool, opts ...Option) (*pgxpool.Pool, error) {
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
	if lazy {
		return pool, nil
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	return pool, nil
}

// OpenReplica is Open for a streaming replica (NewReplica): it does not
// connect until a read needs it, so that a replica that is down at start
// costs its reads a detour to the primary, not the service's start.
func OpenReplica(ctx context.Context, url string, opts ...Option) (*pgxpool.Pool, error) {
	return open(ctx, url, true, opts...)
}

// Migrate applies the idempotency engine's migrations (its key table, which
// the orders' guarded writes name), then the embedded migrations in schema/,
// then River's (the background jobs' tables). PostgreSQL session advisory
// locks serialise concurrent callers, so replicas that start together
// migrate once and the rest wait, then find nothing to do.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return MigrateKeys(ctx, pool, pgstore.Options{})
}

// MigrateKeys is Migrate with the key table's options: its scope type
// (pgstore.Options.Scope) is chosen when the table is created, and must be
// given the same ever after.
func MigrateKeys(ctx context.Context, pool *pgxpool.Pool, keys pgstore.Options) error {
	if err := pgstore.Migrate(ctx, pool, keys); err != nil {
		return err
	}
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
		return pgstore.Translate(fmt.Errorf("River migrations: acquire connection: %w", err))
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", riverMigrateLockID); err != nil {
		return pgstore.Translate(fmt.Errorf("take River migration lock: %w", err))
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

// Jobs inserts a payment's charge job, or a refund's, in the transaction
// that creates the payment or refund (River's InsertTx; package jobs).
type Jobs interface {
	InsertCharge(ctx context.Context, tx pgx.Tx, ref payments.Ref) error
	InsertRefund(ctx context.Context, tx pgx.Tx, ref payments.RefundRef) error
}

// Store implements store.Backend on one pool: the domain writes of an
// idempotent operation join the key's transaction.
type Store struct {
	// Its reads are the primary's, always: workers read through it.
	// Replica wraps it for the HTTP layer's reads that may lag.
	reads
	pool *pgxpool.Pool
	keys *pgstore.Store
	jobs Jobs
	tx   idempotency.Store[store.Tx]
	w    idempotency.Store[store.Deferred]
}

var _ store.Backend = (*Store)(nil)

// New returns a store on pool. The schema must be migrated (Migrate).
// Without jobs, no payment or refund can be accepted.
func New(pool *pgxpool.Pool, jobs Jobs) *Store { return NewKeys(pool, jobs, pgstore.Options{}) }

// NewKeys is New with the key table's options, as MigrateKeys was given
// them: on a database sharded by account, the scope column is uuid, so
// that a key lands on its account's shard (pgstore.Options.Scope), and
// group commit merges only one account's commits (MergeByScope), so that
// each pipeline stays on one shard. The table's name is the default one,
// which the orders' guarded writes name.
func NewKeys(pool *pgxpool.Pool, jobs Jobs, opts pgstore.Options) *Store {
	opts.Table = ""
	keys, err := pgstore.New(pool, opts)
	if err != nil {
		panic(err) // an unknown scope type, refused by the command line
	}
	s := &Store{pool: pool, keys: keys, jobs: jobs}
	s.reads = reads{route: func(ctx context.Context, fn func(context.Context, *db.Queries) error) error {
		return fn(ctx, db.New(pool))
	}}
	s.tx = idempotency.MapUnit(keys, func(tx pgx.Tx, claim idempotency.Ref) store.Tx {
		return &txUnit{s: s, tx: tx, q: db.New(tx), claim: claim}
	})
	// The write-only operations' writes, declared to pgstore as it asks.
	deferred, err := keys.ClaimAtCommit(db.OrderCreateGuarded)
	if err != nil {
		panic(err) // the service's own statements, bound by every test that opens a Store
	}
	s.w = idempotency.MapUnit(deferred, func(b *pgstore.Batch, ref idempotency.Ref) store.Deferred {
		return &deferredWrites{q: db.New(deferredDBTX{b}), claim: ref}
	})
	return s
}

// Keys implements store.Backend: the operation runs in the transaction
// that claimed its key.
func (s *Store) Keys() idempotency.Store[store.Tx] { return s.tx }

// DeferredKeys implements store.Backend: the operation's writes are queued and
// go with its claim at commit, in one round trip.
func (s *Store) DeferredKeys() idempotency.Store[store.Deferred] { return s.w }

// KeyStore is the engine's key store, for operators' commands.
func (s *Store) KeyStore() *pgstore.Store { return s.keys }

// PurgeExpired implements idempotency.Store.
func (s *Store) PurgeExpired(ctx context.Context, batch int) (int64, error) {
	return s.keys.PurgeExpired(ctx, batch)
}

// KeyStats implements idempotency.Store.
func (s *Store) KeyStats(ctx context.Context) (idempotency.Stats, error) {
	return s.keys.KeyStats(ctx)
}

// ReadyTimeout bounds Ready: a load balancer asking /readyz of a server
// whose pool is exhausted must hear no within its own probe's timeout.
const ReadyTimeout = time.Second

// Ready implements store.Backend: the primary is ready when a connection
// can be had from the pool within ReadyTimeout and a write would not fail
// as read-only (SQLSTATE 25006: a primary demoted by a failover, or one
// whose full disk made it read-only).
func (s *Store) Ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, ReadyTimeout)
	defer cancel()
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		reason := "PostgreSQL cannot be reached"
		if st := s.pool.Stat(); st.AcquiredConns() >= st.MaxConns() {
			reason = fmt.Sprintf("no database connection within %s: all %d of the pool's connections are in use", ReadyTimeout, st.MaxConns())
		}
		return &store.NotReadyError{Reason: reason, Err: translate(err)}
	}
	defer conn.Release()
	readOnly, err := db.New(conn).HealthReadOnly(ctx)
	switch {
	case err != nil:
		return &store.NotReadyError{Reason: "PostgreSQL does not answer", Err: translate(err)}
	case readOnly:
		return &store.NotReadyError{Reason: "PostgreSQL is read-only (a standby, or default_transaction_read_only is on): writes would fail"}
	}
	return nil
}

// txUnit is store.Tx: the domain's reads and writes in the transaction that
// claimed the key.
type txUnit struct {
	s     *Store
	tx    pgx.Tx
	q     *db.Queries
	claim idempotency.Ref
}

// Claim implements store.Tx: the claim whose transaction u is.
func (u *txUnit) Claim() idempotency.Ref { return u.claim }

// deferredWrites is store.Deferred: the domain's writes queued in the claim's
// Batch, each guarded by the claim.
type deferredWrites struct {
	q     *db.Queries
	claim idempotency.Ref
}

// deferredDBTX lets sqlc's :exec queries queue into a Batch. Reads fail: a
// write-only unit of work has nothing to answer them with before its
// commit, and store.Deferred offers none.
type deferredDBTX struct{ *pgstore.Batch }

var errRead = errors.New("postgres: a write-only unit of work cannot read")

func (deferredDBTX) Query(context.Context, string, ...any) (pgx.Rows, error) { return nil, errRead }
func (deferredDBTX) QueryRow(context.Context, string, ...any) pgx.Row        { return errRow{errRead} }

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// utc is a nullable timestamp in UTC, as the domain keeps times.
func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// translate maps driver errors that mean "the database is not there right
// now" to idempotency.ErrUnavailable (503 with Retry-After).
func translate(err error) error { return pgstore.Translate(err) }
