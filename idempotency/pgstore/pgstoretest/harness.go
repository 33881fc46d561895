package pgstoretest

import (
	"context"
	cryptorand "crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/storetest"
)

// MigrateSuite creates the key table of opts and the table the suite writes
// to, for a TestMain's database.
func MigrateSuite(ctx context.Context, pool *pgxpool.Pool, opts ...pgstore.Options) error {
	if len(opts) == 0 {
		opts = []pgstore.Options{{}}
	}
	for _, o := range opts {
		if err := pgstore.Migrate(ctx, pool, o); err != nil {
			return err
		}
	}
	_, err := pool.Exec(ctx, `CREATE TABLE writes (
		id    text  PRIMARY KEY,
		scope bytea NOT NULL,
		n     int   NOT NULL DEFAULT 1 CHECK (n > 0)
	)`)
	return err
}

// TxHarness is the suite's harness for pgstore's transactional store on
// pool's key table of opts, writing rows of the writes table.
func TxHarness(pool *pgxpool.Pool, opts pgstore.Options) storetest.Harness[pgx.Tx] {
	store := open(pool, opts)
	h := pgHarness(pool, store, opts.Scope, func(*testing.T) idempotency.Store[pgx.Tx] { return store },
		func(ctx context.Context, tx pgx.Tx, ref idempotency.Ref, id string) error {
			_, err := tx.Exec(ctx, "INSERT INTO writes (id, scope) VALUES ($1, $2)", id, []byte(ref.Scope))
			return err
		})
	h.Read = func(ctx context.Context, tx pgx.Tx, id string) (bool, error) {
		var seen bool
		err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM writes WHERE id = $1)", id).Scan(&seen)
		return seen, err
	}
	return h
}

// DeferredHarness is the suite's harness for pgstore's store that claims at
// commit: its rows are queued by GuardedWrite, the one write ClaimAtCommit
// takes.
func DeferredHarness(pool *pgxpool.Pool, opts pgstore.Options) storetest.Harness[*pgstore.Batch] {
	store := open(pool, opts)
	deferred, err := store.ClaimAtCommit(GuardedWrite(store))
	if err != nil {
		panic(err)
	}
	h := pgHarness(pool, store, opts.Scope, func(*testing.T) idempotency.Store[*pgstore.Batch] { return deferred },
		func(ctx context.Context, b *pgstore.Batch, ref idempotency.Ref, id string) error {
			if b.Ref() != ref {
				return fmt.Errorf("the batch's claim is %+v, the lease's %+v", b.Ref(), ref)
			}
			_, err := b.Exec(ctx, GuardedWrite(store), id, []byte(ref.Scope))
			return err
		})
	h.Queued = true
	return h
}

// GuardedWrite is the write claimed at commit of the suite's rows, $1 their
// id and $2 their scope: a row of the writes table only if the write's own
// claim inserted the key row of store's table.
func GuardedWrite(store *pgstore.Store) string {
	return "INSERT INTO writes (id, scope) SELECT $1, $2 WHERE " + store.Guard()
}

// JoinedHarness is the suite's harness for pgstore joined to a pgx
// transaction of the caller's own (Store.Join): each claim opens a
// transaction, joins it, and commits it after the lease's Commit, as a
// handler that owns its transaction does.
func JoinedHarness(pool *pgxpool.Pool, opts pgstore.Options) storetest.Harness[pgx.Tx] {
	store := open(pool, opts)
	h := TxHarness(pool, opts)
	h.Open = func(*testing.T) idempotency.Store[pgx.Tx] {
		return callerTx[pgx.Tx]{
			Store:    store,
			begin:    func(ctx context.Context) (pgx.Tx, error) { return pool.Begin(ctx) },
			join:     store.Join,
			commit:   func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) },
			rollback: func(ctx context.Context, tx pgx.Tx) error { return ignore(tx.Rollback(ctx), pgx.ErrTxClosed) },
		}
	}
	return h
}

// JoinedSQLHarness is JoinedHarness for database/sql transactions
// (Store.JoinSQL) on pgx's driver over pool.
func JoinedSQLHarness(pool *pgxpool.Pool, opts pgstore.Options) storetest.Harness[*sql.Tx] {
	store := open(pool, opts)
	db := stdlib.OpenDBFromPool(pool)
	h := pgHarness(pool, store, opts.Scope, func(t *testing.T) idempotency.Store[*sql.Tx] {
		return callerTx[*sql.Tx]{
			Store:    store,
			begin:    func(ctx context.Context) (*sql.Tx, error) { return db.BeginTx(ctx, nil) },
			join:     store.JoinSQL,
			commit:   func(_ context.Context, tx *sql.Tx) error { return tx.Commit() },
			rollback: func(_ context.Context, tx *sql.Tx) error { return ignore(tx.Rollback(), sql.ErrTxDone) },
		}
	}, func(ctx context.Context, tx *sql.Tx, ref idempotency.Ref, id string) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO writes (id, scope) VALUES ($1, $2)", id, []byte(ref.Scope))
		return err
	})
	h.Read = func(ctx context.Context, tx *sql.Tx, id string) (bool, error) {
		var seen bool
		err := tx.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM writes WHERE id = $1)", id).Scan(&seen)
		return seen, err
	}
	return h
}

// ignore is err unless it is done: a rollback of a transaction that has
// already ended is no failure here.
func ignore(err, done error) error {
	if errors.Is(err, done) {
		return nil
	}
	return err
}

// callerTx is a store as a caller of Join uses pgstore: its Claim opens the
// caller's transaction and joins it; the lease's Commit stores the
// response and then the caller commits; its Rollback rolls back both. It
// settles, purges and counts as the Store it joins.
type callerTx[U any] struct {
	*pgstore.Store
	begin            func(context.Context) (U, error)
	join             func(context.Context, U, idempotency.ClaimRequest) (idempotency.Lease[U], *idempotency.Record, error)
	commit, rollback func(context.Context, U) error
}

func (c callerTx[U]) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Lease[U], *idempotency.Record, error) {
	tx, err := c.begin(ctx)
	if err != nil {
		return nil, nil, err
	}
	lease, rec, err := c.join(ctx, tx, req)
	if lease == nil {
		_ = c.rollback(context.WithoutCancel(ctx), tx)
		return nil, rec, err
	}
	return callerLease[U]{Lease: lease, c: c}, nil, nil
}

type callerLease[U any] struct {
	idempotency.Lease[U]
	c callerTx[U]
}

func (l callerLease[U]) Commit(ctx context.Context, resp idempotency.Response) error {
	if err := l.Lease.Commit(ctx, resp); err != nil {
		_ = l.c.rollback(context.WithoutCancel(ctx), l.Unit())
		return err
	}
	return l.c.commit(ctx, l.Unit())
}

func (l callerLease[U]) Rollback(ctx context.Context) error {
	err := l.Lease.Rollback(ctx)
	if rerr := l.c.rollback(context.WithoutCancel(ctx), l.Unit()); err == nil {
		err = rerr
	}
	return err
}

func open(pool *pgxpool.Pool, opts pgstore.Options) *pgstore.Store {
	store, err := pgstore.New(pool, opts)
	if err != nil {
		panic(err)
	}
	return store
}

// newScope returns fresh scopes that a key table whose scopes are of type
// t holds: a UUID's 16 bytes for uuid, UTF-8 beyond ASCII for text, and
// nil (the suite's own) for bytea.
func newScope(t pgstore.ScopeType) func() string {
	switch t {
	case pgstore.ScopeUUID:
		return func() string {
			var b [16]byte
			_, _ = cryptorand.Read(b[:])
			return string(b[:])
		}
	case pgstore.ScopeText:
		return func() string { return "storetest-é-" + cryptorand.Text() }
	}
	return nil
}

func pgHarness[U any](pool *pgxpool.Pool, store *pgstore.Store, scope pgstore.ScopeType, open func(t *testing.T) idempotency.Store[U], write func(ctx context.Context, unit U, ref idempotency.Ref, id string) error) storetest.Harness[U] {
	return storetest.Harness[U]{
		Open:     open,
		Write:    write,
		NewScope: newScope(scope),
		Count: func(ctx context.Context, t *testing.T, scope string) int {
			var n int
			require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM writes WHERE scope = $1", []byte(scope)).Scan(&n), "count writes")
			return n
		},
		Replace: func(ctx context.Context, ref idempotency.Ref, final idempotency.Response) (replaced bool, err error) {
			err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				replaced, err = store.ReplaceProvisional(ctx, tx, ref, final)
				return err
			})
			return replaced, err
		},
	}
}
