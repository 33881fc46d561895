package pgstore_test

import (
	"context"
	"crypto/rand"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/pgstore/pgstoretest"
)

// callerTx is a caller's own transaction, pgx's or database/sql's, as the
// join test drives it.
type callerTx struct {
	// write inserts a row of the writes table in the transaction.
	write func(ctx context.Context, id string, scope string) error
	// join claims req in the transaction; its lease's Commit and Rollback
	// are returned as functions.
	join                 func(ctx context.Context, req idempotency.ClaimRequest) (commit, rollback func(context.Context) error, rec *idempotency.Record, err error)
	commitTx, rollbackTx func() error
}

// joinWith is callerTx.join for tx, a transaction of either kind, claimed
// in by join (Store.Join or Store.JoinSQL).
func joinWith[U any](t *testing.T, tx U, join func(context.Context, U, idempotency.ClaimRequest) (idempotency.Lease[U], *idempotency.Record, error)) func(context.Context, idempotency.ClaimRequest) (func(context.Context) error, func(context.Context) error, *idempotency.Record, error) {
	return func(ctx context.Context, req idempotency.ClaimRequest) (func(context.Context) error, func(context.Context) error, *idempotency.Record, error) {
		lease, rec, err := join(ctx, tx, req)
		if lease == nil {
			return nil, nil, rec, err
		}
		require.Equal(t, tx, lease.Unit(), "the lease's unit is the caller's transaction")
		return func(ctx context.Context) error {
			return lease.Commit(ctx, idempotency.Response{Status: http.StatusCreated, Header: http.Header{}, Body: []byte(`{"id":"w"}`)})
		}, lease.Rollback, nil, nil
	}
}

// TestJoin: a claim joined to the caller's own transaction, pgx's or
// database/sql's, commits with the caller's rows and rolls back with them:
// after a rollback neither the key nor any of the caller's rows is there,
// and the key can be claimed again; after a commit both are, and the key
// replays. A claim that finds a record or waits in vain leaves the
// transaction usable.
func TestJoin(t *testing.T) {
	t.Parallel()
	pool := pgstoretest.Pool(t)
	store, err := pgstore.New(pool, pgstore.Options{})
	require.NoError(t, err)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })

	begin := map[string]func(t *testing.T) callerTx{
		"pgx.Tx": func(t *testing.T) callerTx {
			tx, err := pool.Begin(t.Context())
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
			return callerTx{
				write: func(ctx context.Context, id, scope string) error {
					_, err := tx.Exec(ctx, "INSERT INTO writes (id, scope) VALUES ($1, $2)", id, []byte(scope))
					return err
				},
				join:       joinWith(t, tx, store.Join),
				commitTx:   func() error { return tx.Commit(context.Background()) },
				rollbackTx: func() error { return tx.Rollback(context.Background()) },
			}
		},
		"sql.Tx": func(t *testing.T) callerTx {
			tx, err := db.BeginTx(t.Context(), nil)
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback() })
			return callerTx{
				write: func(ctx context.Context, id, scope string) error {
					_, err := tx.ExecContext(ctx, "INSERT INTO writes (id, scope) VALUES ($1, $2)", id, []byte(scope))
					return err
				},
				join:       joinWith(t, tx, store.JoinSQL),
				commitTx:   tx.Commit,
				rollbackTx: tx.Rollback,
			}
		},
	}
	count := func(t *testing.T, scope string) (keys, rows int) {
		t.Helper()
		ctx := context.Background()
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_keys WHERE scope = $1", []byte(scope)).Scan(&keys))
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM writes WHERE scope = $1", []byte(scope)).Scan(&rows))
		return keys, rows
	}
	request := func() idempotency.ClaimRequest {
		return idempotency.ClaimRequest{Scope: rand.Text(), Key: "k", Fingerprint: idempotency.Fingerprint{7},
			Method: "POST", Route: "/widgets", TTL: time.Hour, Wait: 200 * time.Millisecond}
	}

	for name, open := range begin {
		t.Run(name+"/rolled back by the caller", func(t *testing.T) {
			t.Parallel()
			ctx, req := t.Context(), request()
			tx := open(t)
			require.NoError(t, tx.write(ctx, rand.Text(), req.Scope), "a row before the claim")
			commit, _, rec, err := tx.join(ctx, req)
			require.NoError(t, err)
			require.Nil(t, rec)
			require.NoError(t, tx.write(ctx, rand.Text(), req.Scope), "a row after the claim")
			require.NoError(t, commit(ctx))
			require.NoError(t, tx.rollbackTx())
			keys, rows := count(t, req.Scope)
			require.Zero(t, keys, "key rows after the caller's rollback")
			require.Zero(t, rows, "the caller's rows after its rollback")

			again := open(t)
			_, rollback, rec, err := again.join(ctx, req)
			require.NoError(t, err)
			require.Nil(t, rec, "the key is free again")
			require.NoError(t, rollback(ctx))
		})
		t.Run(name+"/committed by the caller", func(t *testing.T) {
			t.Parallel()
			ctx, req := t.Context(), request()
			tx := open(t)
			commit, _, _, err := tx.join(ctx, req)
			require.NoError(t, err)
			require.NoError(t, tx.write(ctx, rand.Text(), req.Scope))
			require.NoError(t, commit(ctx))
			require.NoError(t, tx.commitTx())
			keys, rows := count(t, req.Scope)
			require.Equal(t, 1, keys, "key rows")
			require.Equal(t, 1, rows, "the caller's rows")

			// The replay, and a claim that waits in vain on a holder, each
			// leave the caller's transaction usable.
			next := open(t)
			_, _, rec, err := next.join(ctx, req)
			require.NoError(t, err)
			require.NotNil(t, rec, "the replay")
			require.Equal(t, `{"id":"w"}`, string(rec.Response.Body))
			require.NoError(t, next.write(ctx, rand.Text(), req.Scope), "the transaction after a replay")

			held := request()
			holder := open(t)
			_, release, _, err := holder.join(ctx, held)
			require.NoError(t, err)
			_, _, _, err = next.join(ctx, held)
			require.ErrorIs(t, err, idempotency.ErrInFlight)
			require.NoError(t, next.write(ctx, rand.Text(), req.Scope), "the transaction after a claim that waited in vain")
			require.NoError(t, next.commitTx())
			require.NoError(t, release(ctx))
			_, rows = count(t, req.Scope)
			require.Equal(t, 3, rows, "the caller's rows, all committed")
		})
		t.Run(name+"/lease rolled back", func(t *testing.T) {
			t.Parallel()
			ctx, req := t.Context(), request()
			tx := open(t)
			require.NoError(t, tx.write(ctx, rand.Text(), req.Scope), "a row before the claim")
			_, rollback, _, err := tx.join(ctx, req)
			require.NoError(t, err)
			require.NoError(t, tx.write(ctx, rand.Text(), req.Scope), "a row after the claim")
			require.NoError(t, rollback(ctx))
			require.NoError(t, tx.commitTx())
			keys, rows := count(t, req.Scope)
			require.Zero(t, keys, "key rows after the lease's rollback")
			require.Equal(t, 1, rows, "the caller's row from before the claim stays; the one after it is undone")
		})
	}
}
