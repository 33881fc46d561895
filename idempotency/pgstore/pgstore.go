package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/oncekey/oncekey/gen/db"
	"github.com/oncekey/oncekey/internal/idempotency"
)

// claimAttempts bounds the claim loop. Each extra attempt follows a race
// that moved the row under us (a concurrent first request committed, or an
// expired key was freed); more than a few in a row means something is wrong.
const claimAttempts = 5

// Claim implements idempotency.Store.
//
// The claim row is inserted inside the transaction that will run the
// operation and stays uncommitted until Commit stores the response, so other
// sessions never see a half-done operation. A concurrent request with the
// same key blocks in its INSERT on that uncommitted row; lock_timeout bounds
// the block to req.Wait, after which it gets ErrInFlight. If the holder
// commits, the waiter reads the completed record; if it rolls back (or its
// process dies and PostgreSQL aborts the transaction), the waiter's INSERT
// succeeds and it runs the operation itself. No key is ever left stuck.
//
// The whole claim, however many holders it waits behind, is bounded by
// req.Wait (plus statementSlack): statement_timeout bounds each attempt's
// statement as a whole (lock_timeout alone bounds each lock wait, and one
// INSERT can wait on several holders in turn), and each retry gets only the
// time left.
//
// A deferred claim (req.Deferred) is made at Commit instead; see
// deferredLease.
func (s *Store) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Lease, *idempotency.Record, error) {
	if req.Deferred {
		return s.claimDeferred(req), nil, nil
	}
	deadline := time.Now().Add(req.Wait)
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{
		// One round trip: pgx sends a BeginQuery without arguments over the
		// simple protocol, which allows the further statements.
		BeginQuery: "BEGIN; " + waitBudget(req.Wait),
	})
	if err != nil {
		return nil, nil, translate(fmt.Errorf("begin: %w", err))
	}
	lease, rec, err := s.claimIn(ctx, tx, req, deadline)
	if lease == nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
	}
	return lease, rec, err
}

// statementSlack is what a claim statement may take beyond its lock
// waits: on a loaded server a statement that blocks on nothing can still
// take some milliseconds, and must not be mistaken for an in-flight key.
const statementSlack = 200 * time.Millisecond

// waitBudget bounds a claim statement: each lock wait by d, the statement
// as a whole (which may wait on several holders in turn) by d plus slack.
func waitBudget(d time.Duration) string {
	ms := max(d.Milliseconds(), 1)
	return fmt.Sprintf("SET LOCAL lock_timeout = %d; SET LOCAL statement_timeout = %d", ms, ms+statementSlack.Milliseconds())
}

func (s *Store) claimIn(ctx context.Context, tx pgx.Tx, req idempotency.ClaimRequest, deadline time.Time) (idempotency.Lease, *idempotency.Record, error) {
	q := db.New(tx)
	params := db.IdempotencyKeyClaimParams{
		AccountID:      req.Account,
		IdempotencyKey: req.Key,
		Fingerprint:    req.Fingerprint[:],
		RequestMethod:  req.Method,
		RequestRoute:   req.Route,
		TtlSeconds:     req.TTL.Seconds(),
	}
	for attempt := range claimAttempts {
		if attempt > 0 {
			left := time.Until(deadline)
			if left <= 0 {
				return nil, nil, idempotency.ErrInFlight
			}
			if _, err := tx.Exec(ctx, waitBudget(left)); err != nil {
				return nil, nil, claimError(ctx, "set wait budget", err)
			}
		}
		rows, err := q.IdempotencyKeyClaim(ctx, params)
		if err != nil {
			return nil, nil, claimError(ctx, "claim", err)
		}
		if len(rows) == 0 {
			// The INSERT waited for a concurrent holder that then committed;
			// this statement's snapshot predates that commit. Read again.
			continue
		}
		row := rows[0]
		switch {
		case row.Claimed:
			// The wait budget was for the claim; the operation's own
			// statements and lock waits (row locks in a ledger, say) must
			// not inherit it.
			if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout TO DEFAULT; SET LOCAL statement_timeout TO DEFAULT"); err != nil {
				return nil, nil, translate(fmt.Errorf("reset claim timeouts: %w", err))
			}
			return &lease{tx: tx, account: req.Account, key: req.Key, claimedAt: row.CreatedAt}, nil, nil
		case row.Expired:
			// An expired key is absent: free it and claim again.
			if _, err := q.IdempotencyKeyDeleteIfExpired(ctx, db.IdempotencyKeyDeleteIfExpiredParams{
				AccountID: req.Account, IdempotencyKey: req.Key,
			}); err != nil {
				return nil, nil, claimError(ctx, "free expired key", err)
			}
			continue
		case row.Status != "completed":
			// Unreachable for synchronous operations, whose rows are never
			// committed as processing; kept for multi-step operations that
			// will hold a key processing across transactions.
			return nil, nil, idempotency.ErrInFlight
		default:
			rec, err := recordFromRow(row)
			return nil, rec, err
		}
	}
	return nil, nil, fmt.Errorf("claim: key kept changing under %d attempts", claimAttempts)
}

// claimError translates a failure of a claim statement. lock_timeout
// (55P03) or statement_timeout (57014, when ctx itself has not ended)
// expiring means another session held the key for the whole wait budget,
// whether the INSERT or the DELETE of an expired row was waiting.
func claimError(ctx context.Context, step string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "55P03" || (pgErr.Code == "57014" && ctx.Err() == nil)) {
		return idempotency.ErrInFlight
	}
	return translate(fmt.Errorf("%s: %w", step, err))
}

func recordFromRow(row db.IdempotencyKeyClaimRow) (*idempotency.Record, error) {
	return newRecord(row.Fingerprint, row.ResponseStatus, row.ResponseHeaders, row.ResponseBody, row.CreatedAt, row.ExpiresAt)
}

// lease is a claimed key and the open transaction the operation runs in.
type lease struct {
	tx        pgx.Tx
	account   uuid.UUID
	key       string
	claimedAt time.Time
	done      bool
}

func (l *lease) ClaimedAt() time.Time { return l.claimedAt }

func (l *lease) Context(ctx context.Context) context.Context {
	return context.WithValue(ctx, txKey{}, l.tx)
}

func (l *lease) Commit(ctx context.Context, resp idempotency.Response) error {
	if l.done {
		return errors.New("lease already settled")
	}
	l.done = true
	headers, body, err := encodeResponse(resp)
	if err != nil {
		_ = l.tx.Rollback(ctx)
		return err
	}
	n, err := db.New(l.tx).IdempotencyKeyComplete(ctx, db.IdempotencyKeyCompleteParams{
		AccountID:       l.account,
		IdempotencyKey:  l.key,
		ResponseStatus:  pgtype.Int4{Int32: int32(resp.Status), Valid: true},
		ResponseHeaders: headers,
		ResponseBody:    body,
	})
	if err == nil && n != 1 {
		err = fmt.Errorf("completed %d rows, want 1", n)
	}
	if err != nil {
		_ = l.tx.Rollback(ctx)
		return translate(fmt.Errorf("store response: %w", err))
	}
	if err := l.tx.Commit(ctx); err != nil {
		return translate(fmt.Errorf("commit: %w", err))
	}
	return nil
}

// encodeResponse returns a response's headers and body as the key row
// stores them.
func encodeResponse(resp idempotency.Response) (headers, body []byte, err error) {
	headers, err = json.Marshal(resp.Header)
	if err != nil {
		return nil, nil, fmt.Errorf("encode headers: %w", err)
	}
	body = resp.Body
	if body == nil {
		// pgx sends a nil []byte as NULL, which the completed-row CHECK
		// rejects; a response without a body (204, or a handler that wrote
		// nothing) is stored as empty bytes.
		body = []byte{}
	}
	return headers, body, nil
}

func (l *lease) Rollback(ctx context.Context) error {
	if l.done {
		return nil
	}
	l.done = true
	if err := l.tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return translate(err)
	}
	return nil
}

// cleanupLockID is the advisory lock that makes one replica at a time run
// cleanup ("oncekey.cleanup" in ASCII, truncated to 8 bytes).
const cleanupLockID int64 = 0x6f6e63656b65792e

// PurgeExpired deletes expired keys in batches of at most batch rows until
// none is left, and returns how many it deleted. Each batch is its own short
// statement, so a large backlog never becomes one huge DELETE holding locks
// and bloating WAL. A session advisory lock, held on the connection that
// runs the batches, lets only one replica purge at a time; the others get
// idempotency.ErrCleanupBusy. If that connection dies, PostgreSQL releases
// the lock with it.
func (s *Store) PurgeExpired(ctx context.Context, batch int) (int64, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return 0, translate(fmt.Errorf("purge: acquire connection: %w", err))
	}
	defer conn.Release()
	var locked bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", cleanupLockID).Scan(&locked); err != nil {
		return 0, translate(fmt.Errorf("purge: take cleanup lock: %w", err))
	}
	if !locked {
		return 0, idempotency.ErrCleanupBusy
	}
	defer func() {
		if _, err := conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", cleanupLockID); err != nil {
			// The lock must not outlive this run on a pooled connection.
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
		}
	}()

	q := db.New(replanned{conn})
	var total int64
	for {
		n, err := q.IdempotencyKeyPurgeExpired(ctx, int32(batch))
		total += n
		if err != nil {
			return total, translate(fmt.Errorf("purge expired keys: %w", err))
		}
		if n < int64(batch) {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
}

// replanned runs statements unprepared (one round trip still, as pgx's
// QueryExecModeExec), so that PostgreSQL plans each run for the table as it
// is then. Only for statements whose cached plan would go wrong as the
// table grows and that run rarely enough for planning to cost nothing: the
// purge's batches, the statistics of a metrics scrape
// (TestStatementsProbeTheIndex).
type replanned struct{ db.DBTX }

// Exec runs sql unprepared.
func (r replanned) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return r.DBTX.Exec(ctx, sql, append([]any{pgx.QueryExecModeExec}, args...)...)
}

// QueryRow runs sql unprepared.
func (r replanned) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return r.DBTX.QueryRow(ctx, sql, append([]any{pgx.QueryExecModeExec}, args...)...)
}

// KeyStats implements idempotency.StatsSource.
func (s *Store) KeyStats(ctx context.Context) (idempotency.Stats, error) {
	// Unprepared: a statement without parameters keeps the plan of its
	// first run on a connection, made perhaps on an empty table.
	row, err := db.New(replanned{s.pool}).IdempotencyKeyStats(ctx)
	if err != nil {
		return idempotency.Stats{}, translate(fmt.Errorf("key stats: %w", err))
	}
	return idempotency.Stats{
		Processing:          row.Processing,
		Completed:           max(row.Total-row.Processing, 0),
		TableBytes:          row.TableBytes,
		OldestProcessingAge: seconds(row.OldestProcessingAgeSeconds),
		CleanupLag:          seconds(row.CleanupLagSeconds),
	}, nil
}

func seconds(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
