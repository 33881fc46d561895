package pgstoretest

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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
// pool's key table of that name, writing rows of the writes table.
func TxHarness(pool *pgxpool.Pool, table string) storetest.Harness[pgx.Tx] {
	store := open(pool, table)
	h := pgHarness(pool, store, func(*testing.T) idempotency.Store[pgx.Tx] { return store },
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

// DeferredHarness is the suite's harness for pgstore's deferring store:
// its rows are queued with the guard pgstore.Batch asks for.
func DeferredHarness(pool *pgxpool.Pool, table string) storetest.Harness[*pgstore.Batch] {
	store := open(pool, table)
	h := pgHarness(pool, store, func(*testing.T) idempotency.Store[*pgstore.Batch] { return store.Deferred() }, guardedWrite())
	h.Queued = true
	return h
}

// guardedWrite writes a row of the writes table through a Batch: only if
// this very transaction inserted the key row of the Batch's claim.
func guardedWrite() func(ctx context.Context, b *pgstore.Batch, ref idempotency.Ref, id string) error {
	return func(ctx context.Context, b *pgstore.Batch, ref idempotency.Ref, id string) error {
		if b.Ref() != ref {
			return fmt.Errorf("the batch's claim is %+v, the lease's %+v", b.Ref(), ref)
		}
		cond, args := b.Guard(3)
		_, err := b.Exec(ctx, "INSERT INTO writes (id, scope) SELECT $1, $2 WHERE "+cond, append([]any{id, []byte(ref.Scope)}, args...)...)
		return err
	}
}

func open(pool *pgxpool.Pool, table string) *pgstore.Store {
	store, err := pgstore.New(pool, pgstore.Options{Table: table})
	if err != nil {
		panic(err)
	}
	return store
}

func pgHarness[U any](pool *pgxpool.Pool, store *pgstore.Store, open func(t *testing.T) idempotency.Store[U], write func(ctx context.Context, unit U, ref idempotency.Ref, id string) error) storetest.Harness[U] {
	return storetest.Harness[U]{
		Open:  open,
		Write: write,
		Count: func(ctx context.Context, t *testing.T, scope string) int {
			var n int
			require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM writes WHERE scope = $1", []byte(scope)).Scan(&n), "count writes")
			return n
		},
		Purge: store.PurgeExpired,
		Replace: func(ctx context.Context, ref idempotency.Ref, final idempotency.Response) (replaced bool, err error) {
			err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				replaced, err = store.ReplaceProvisional(ctx, tx, ref, final)
				return err
			})
			return replaced, err
		},
	}
}
