package pgstore_test

import (
	"context"
	"crypto/rand"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/pgstore/pgstoretest"
)

// statements counts the statements a pool sends, alone or in pipelines.
type statements struct{ n atomic.Int64 }

func (s *statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	s.n.Add(1)
	return ctx
}
func (s *statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (s *statements) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (s *statements) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) { s.n.Add(1) }
func (s *statements) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// queued is a deferred write of a test: its SQL, with GUARD for the
// store's guard call, and its arguments for a Batch.
type queued struct {
	sql  string
	args func(b *pgstore.Batch) []any
}

// bound returns the deferring store of store that takes queue's writes.
func bound(t *testing.T, store *pgstore.Store, queue ...queued) idempotency.Store[*pgstore.Batch] {
	t.Helper()
	var writes []string
	for _, q := range queue {
		writes = append(writes, strings.ReplaceAll(q.sql, "GUARD", store.Guard()))
	}
	d, err := store.ClaimAtCommit(writes...)
	require.NoError(t, err, "ClaimAtCommit takes the writes")
	return d
}

// exec queues q in b, for store.
func (q queued) exec(store *pgstore.Store, b *pgstore.Batch) error {
	_, err := b.Exec(context.Background(), strings.ReplaceAll(q.sql, "GUARD", store.Guard()), q.args(b)...)
	return err
}

// TestLoneCommit checks a lone deferred commit: one statement when it has
// at most one write (see IdempotencyKeyClaimLone), the pipeline when it has
// more, and the same outcome either way: the write made once, or nothing
// written and the key's holder reported.
func TestLoneCommit(t *testing.T) {
	t.Parallel()
	// insert is a write of the row's id as $1 and its scope as $2.
	insert := func(sql string) queued {
		return queued{sql: sql, args: func(b *pgstore.Batch) []any { return []any{rand.Text(), []byte(b.Ref().Scope)} }}
	}
	// withN is a write as sqlc sends it, named, on lines, taking n.
	withN := func(n int) queued {
		return queued{
			sql:  "-- name: WriteN :exec\nINSERT INTO writes (id, scope, n)\nSELECT $1, $2, $3\nWHERE GUARD",
			args: func(b *pgstore.Batch) []any { return []any{rand.Text(), []byte(b.Ref().Scope), n} },
		}
	}
	tests := []struct {
		name  string
		table string
		queue []queued
		// before prepares the key: "replay" stores a record under it,
		// "held" holds it in an open transaction; or the database:
		// "locked" locks the written table in an open transaction,
		// "starved" holds the pool's every connection.
		before     string
		statements int64
		writes     int
		noKey      bool // no key row is left (or none visible)
		check      func(t *testing.T, err error)
	}{
		{name: "a guarded write", queue: []queued{withN(2)}, statements: 1, writes: 1},
		{name: "a write in one line", queue: []queued{insert("INSERT INTO writes (id, scope) SELECT $1, $2 WHERE GUARD")}, statements: 1, writes: 1},
		{name: "no write", statements: 1},
		{name: "a key table of another name", table: renamedTable, queue: []queued{withN(1)}, statements: 1, writes: 1},
		{
			name: "a replay writes nothing", before: "replay", queue: []queued{withN(1)}, statements: 1, writes: 1,
			check: func(t *testing.T, err error) {
				var taken *idempotency.TakenError
				require.ErrorAs(t, err, &taken, "a replay")
				require.NotNil(t, taken.Record, "the replayed record")
				require.Equal(t, "stored", string(taken.Record.Response.Body), "the replayed body")
			},
		},
		{
			name: "a key held elsewhere is in flight", before: "held", queue: []queued{withN(1)}, statements: 1, noKey: true,
			check: func(t *testing.T, err error) {
				require.ErrorIs(t, err, idempotency.ErrInFlight, "a key held by an open transaction")
			},
		},
		{
			// Nobody holds the key: a wait that ran out on another lock is
			// no key in flight, whatever the statement claims with it.
			name: "a write blocked by a lock on its table is unavailable, not in flight", before: "locked",
			queue: []queued{withN(1)}, statements: 1, noKey: true,
			check: func(t *testing.T, err error) {
				require.ErrorIs(t, err, idempotency.ErrUnavailable, "a lock on the written table")
				require.NotErrorIs(t, err, idempotency.ErrInFlight)
			},
		},
		{
			name: "a pool with no connection to give is unavailable, not in flight", before: "starved",
			queue: []queued{withN(1)}, statements: 0, noKey: true,
			check: func(t *testing.T, err error) {
				require.ErrorIs(t, err, idempotency.ErrUnavailable, "no connection within the request's deadline")
				require.NotErrorIs(t, err, idempotency.ErrInFlight)
			},
		},
		{
			name: "a failing write leaves nothing", queue: []queued{withN(-1)}, statements: 1, noKey: true,
			check: func(t *testing.T, err error) {
				var pgErr *pgconn.PgError
				require.ErrorAs(t, err, &pgErr, "a row breaking a CHECK")
				require.Equal(t, "23514", pgErr.Code, "the write's error")
			},
		},
		{
			name:       "a write quoting a parameter-like text",
			queue:      []queued{insert("INSERT INTO writes (id, scope) SELECT 'a''$9' || $1, $2 WHERE GUARD")},
			statements: 1, writes: 1,
		},
		{
			name:       "a write after a block comment",
			queue:      []queued{insert("/* odd */ INSERT INTO writes (id, scope) SELECT $1, $2 WHERE GUARD")},
			statements: 1, writes: 1,
		},
		{
			name: "a write with a CTE of its own",
			queue: []queued{insert("INSERT INTO writes (id, scope) WITH v AS (SELECT $1::text AS id, $2::bytea AS scope) " +
				"SELECT id, scope FROM v WHERE GUARD")},
			statements: 1, writes: 1,
		},
		// More than one write goes in the pipeline: peek, claim, writes.
		{name: "two writes", queue: []queued{withN(1), withN(2)}, statements: 4, writes: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			counted := &statements{}
			cfg, err := pgxpool.ParseConfig(pgstoretest.URL(t))
			require.NoError(t, err, "parse the database URL")
			cfg.ConnConfig.Tracer = counted
			if tt.before == "starved" {
				cfg.MaxConns = 1
			}
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err, "open a pool")
			t.Cleanup(pool.Close)
			store, err := pgstore.New(pool, pgstore.Options{Table: tt.table})
			require.NoError(t, err, "open the store")
			warm(t, bound(t, store))

			scope, key := "lone-"+rand.Text(), "key-"+rand.Text()
			req := idempotency.ClaimRequest{Scope: scope, Key: key, Method: http.MethodPost, Route: "/writes", TTL: time.Hour, Wait: 5 * time.Second}
			// commit commits body through a new claim of key within deadline.
			commit := func(deadline time.Duration, body string, queue []queued) error {
				ctx, cancel := context.WithTimeout(ctx, deadline)
				defer cancel()
				lease, rec, err := bound(t, store, queue...).Claim(ctx, req)
				require.NoError(t, err, "claim")
				require.Nil(t, rec, "a deferred claim finds nothing before its commit")
				for _, q := range queue {
					require.NoError(t, q.exec(store, lease.Unit()), "queue a write")
				}
				return lease.Commit(ctx, idempotency.Response{Status: http.StatusCreated, Header: http.Header{}, Body: []byte(body)})
			}
			release := func() {} // what before holds, let go once the commit is done (or the test ends)
			switch tt.before {
			case "replay":
				// Setting up, not under test: a cold connection on a busy
				// machine may take longer than a request's deadline.
				require.NoError(t, commit(10*time.Second, "stored", []queued{withN(1)}), "store the record replayed")
			case "held":
				req.Wait = 200 * time.Millisecond
				lease, _, err := store.Claim(ctx, req)
				require.NoError(t, err, "claim the key in a transaction")
				t.Cleanup(func() { _ = lease.Rollback(context.Background()) })
			case "locked":
				req.Wait = 200 * time.Millisecond
				locker, err := pgx.Connect(ctx, pgstoretest.URL(t))
				require.NoError(t, err)
				t.Cleanup(func() { _ = locker.Close(context.Background()) })
				tx, err := locker.Begin(ctx)
				require.NoError(t, err)
				_, err = tx.Exec(ctx, "LOCK TABLE writes IN ACCESS EXCLUSIVE MODE")
				require.NoError(t, err, "lock the written table")
				release = sync.OnceFunc(func() { _ = tx.Rollback(context.Background()) })
				t.Cleanup(release)
			case "starved":
				req.Wait = 200 * time.Millisecond // shorter than the request's deadline, as a service's is
				conn, err := pool.Acquire(ctx)
				require.NoError(t, err, "take the pool's one connection")
				release = sync.OnceFunc(conn.Release)
				t.Cleanup(release)
			}

			// A request's deadline where the commit waits on a holder (what
			// the bound is about); else one that a busy machine's slowest
			// statement fits in.
			deadline := 10 * time.Second
			if tt.before == "held" || tt.before == "locked" || tt.before == "starved" {
				deadline = requestDeadline
			}
			before := counted.n.Load()
			start := time.Now()
			err = commit(deadline, "first", tt.queue)
			for retries := 0; tt.before == "held" && errors.Is(err, idempotency.ErrUnavailable) && retries < 3; retries++ {
				// The server answers its own lock_timeout after the 200ms
				// wait; on a starved machine that answer can arrive after
				// the request's one-second deadline, which the store rightly
				// reports as unavailable (the server was too slow to say).
				// Only the in-flight answer is under test here: a bounded
				// retry.
				before, start = counted.n.Load(), time.Now()
				err = commit(deadline, "first", tt.queue)
			}
			release()
			require.Equal(t, tt.statements, counted.n.Load()-before, "statements of the commit")
			if tt.check != nil {
				tt.check(t, err)
			} else {
				require.NoError(t, err, "commit")
			}
			if deadline == requestDeadline {
				require.Less(t, time.Since(start), 2*time.Second, "the commit is bounded by its wait")
			}

			var writes int
			require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM writes WHERE scope = $1", []byte(scope)).Scan(&writes), "count writes")
			require.Equal(t, tt.writes, writes, "rows written")
			table := tt.table
			if table == "" {
				table = pgstore.DefaultTable
			}
			var keys int
			require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE scope = $1 AND idempotency_key = $2",
				[]byte(scope), key).Scan(&keys), "count key rows")
			require.Equal(t, !tt.noKey, keys == 1, "the key row stored (%d rows)", keys)
		})
	}
}

// requestDeadline is the deadline of a commit under test that waits on a
// holder of its key or its table, a request's.
const requestDeadline = time.Second

// TestLoneCommitSlowStatement checks the client-side bound of a lone
// commit's statement: a statement that answers well beyond its wait (a busy
// server, a cold connection) is not an outage, and one that does not answer
// in time is, without a 503 being mistaken for an in-flight key.
func TestLoneCommitSlowStatement(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		sleep float64 // seconds the write takes in PostgreSQL
		check func(t *testing.T, err error)
		keys  int
	}{
		{
			name: "a slow answer is an answer", sleep: 0.6, keys: 1,
			check: func(t *testing.T, err error) { require.NoError(t, err, "a statement 0.6 s beyond a 0.1 s wait") },
		},
		{
			name: "no answer within the bound is unavailable", sleep: 4,
			check: func(t *testing.T, err error) {
				require.ErrorIs(t, err, idempotency.ErrUnavailable, "a statement that outlives its bound")
				require.NotErrorIs(t, err, idempotency.ErrInFlight)
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool := pgstoretest.Pool(t)
			store, err := pgstore.New(pool, pgstore.Options{})
			require.NoError(t, err, "open the store")
			slow := queued{
				sql: "INSERT INTO writes (id, scope) SELECT $1, $2 WHERE GUARD AND pg_sleep($3)::text = ''",
				args: func(b *pgstore.Batch) []any {
					return []any{rand.Text(), []byte(b.Ref().Scope), tt.sleep}
				},
			}
			deferred := bound(t, store, slow)
			warm(t, deferred)

			scope := "slow-" + rand.Text()
			req := idempotency.ClaimRequest{Scope: scope, Key: rand.Text(), Method: http.MethodPost, Route: "/writes", TTL: time.Hour, Wait: 100 * time.Millisecond}
			reqCtx, cancel := context.WithTimeout(ctx, 10*time.Second) // the request's own deadline is far
			defer cancel()
			lease, _, err := deferred.Claim(reqCtx, req)
			require.NoError(t, err, "claim")
			require.NoError(t, slow.exec(store, lease.Unit()), "queue the slow write")
			start := time.Now()
			err = lease.Commit(reqCtx, idempotency.Response{Status: http.StatusCreated, Header: http.Header{}, Body: []byte("{}")})
			tt.check(t, err)
			require.Less(t, time.Since(start), 3500*time.Millisecond, "the commit is bounded by its wait and slack, not the request's deadline")

			if tt.keys == 1 {
				var writes int
				require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM writes WHERE scope = $1", []byte(scope)).Scan(&writes), "count writes")
				require.Equal(t, 1, writes, "rows written")
			}
		})
	}
}
