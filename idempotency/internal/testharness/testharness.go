// Package testharness gives the engine's tests what storetest needs of the
// stores they run it on: memstore and pgstore, with writes of their own
// through each store's unit of work, alone or with a fast path in front.
package testharness

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/storetest"
)

// Memstore is the suite's harness for a fresh memstore.
func Memstore() storetest.Harness[*memstore.Tx] {
	store, written := memstore.New(), newRows()
	return storetest.Harness[*memstore.Tx]{
		Open:  func(*testing.T) idempotency.Store[*memstore.Tx] { return store },
		Write: written.write,
		Count: written.count,
		Read:  written.read,
		Purge: store.PurgeExpired,
		Replace: func(_ context.Context, ref idempotency.Ref, final idempotency.Response) (bool, error) {
			return store.ReplaceProvisional(ref, final), nil
		},
	}
}

// rows is what the suite writes through a memstore.Tx: rows by id, each
// locked by the lease that writes it until that lease ends, as a primary
// key locks a row in PostgreSQL.
type rows struct {
	mu        sync.Mutex
	committed map[string]string        // id → scope
	locks     map[string]chan struct{} // id → closed when its writer ends
	pending   map[*memstore.Tx][]string
}

func newRows() *rows {
	return &rows{committed: map[string]string{}, locks: map[string]chan struct{}{}, pending: map[*memstore.Tx][]string{}}
}

func (r *rows) write(ctx context.Context, tx *memstore.Tx, ref idempotency.Ref, id string) error {
	for {
		r.mu.Lock()
		held, busy := r.locks[id]
		if !busy {
			break
		}
		r.mu.Unlock()
		select {
		case <-held:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	done := make(chan struct{})
	r.locks[id] = done
	r.pending[tx] = append(r.pending[tx], id)
	r.mu.Unlock()
	end := func(commit bool) func() {
		return func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			if commit {
				if _, dup := r.committed[id]; !dup {
					r.committed[id] = ref.Scope
				}
			}
			delete(r.locks, id)
			delete(r.pending, tx)
			close(done)
		}
	}
	tx.OnCommit(end(true))
	tx.OnRollback(end(false))
	return nil
}

func (r *rows) count(_ context.Context, _ *testing.T, scope string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, s := range r.committed {
		if s == scope {
			n++
		}
	}
	return n
}

func (r *rows) read(_ context.Context, tx *memstore.Tx, id string) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.pending[tx] {
		if p == id {
			return true, nil
		}
	}
	_, ok := r.committed[id]
	return ok, nil
}

// Migrate creates the key table of opts and the table the suite writes
// to, for a TestMain's database.
func Migrate(ctx context.Context, pool *pgxpool.Pool, opts ...pgstore.Options) error {
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

// PostgresTx is the suite's harness for pgstore's transactional store on
// pool's key table of that name, writing rows of the writes table.
func PostgresTx(pool *pgxpool.Pool, table string) storetest.Harness[pgx.Tx] {
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

// PostgresDeferred is the suite's harness for pgstore's deferring store:
// its rows are queued with the guard pgstore.Batch asks for.
func PostgresDeferred(pool *pgxpool.Pool, table string) storetest.Harness[*pgstore.Batch] {
	store := open(pool, table)
	h := pgHarness(pool, store, func(*testing.T) idempotency.Store[*pgstore.Batch] { return store.Deferred() }, GuardedWrite())
	h.Queued = true
	return h
}

// GuardedWrite writes a row of the writes table through a Batch: only if
// this very transaction inserted the key row of the Batch's claim.
func GuardedWrite() func(ctx context.Context, b *pgstore.Batch, ref idempotency.Ref, id string) error {
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

// Wrapped returns h with each store it opens wrapped by wrap (a cache, a
// fast path in front of it), which must keep every promise the store keeps.
func Wrapped[U any](h storetest.Harness[U], wrap func(t *testing.T, next idempotency.Store[U]) idempotency.Store[U]) storetest.Harness[U] {
	open := h.Open
	h.Open = func(t *testing.T) idempotency.Store[U] { return wrap(t, open(t)) }
	return h
}
