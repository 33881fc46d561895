package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore/internal/keydb"
)

// A deferred claim serves a write-only operation in one round trip. Claim
// hands out the lease without touching the database; the operation's
// writes are queued in its Batch instead of run; Commit sends, as one
// pipeline that PostgreSQL runs as one implicit transaction:
//
//	IdempotencyKeyPeekMany             the wait budget, and what holds each key
//	                                   (IdempotencyKeyPeekScope when all are of one scope)
//	IdempotencyKeyInsertCompletedMany  the claims and the responses, together
//	each operation's writes            each guarded by its claim (see Batch)
//
// A lone commit of at most one write whose guard is written as Guard
// writes it is sent as one statement instead (IdempotencyKeyClaimLone, see
// lone.go): the same claim, write and peek, as CTEs.
//
// If a row holds the key, the insert does nothing (ON CONFLICT DO NOTHING)
// and neither do the guarded writes: nothing is written, no error is
// raised, no dead row is left, and the peek says what to answer instead (a
// replay or a 409), still in the one round trip. A concurrent holder's
// uncommitted row makes the insert wait, bounded by the budget, as the
// transactional claim's does. The rare rest (a row that expired but is not
// yet cleaned up, a holder that committed after the peek) is reported as
// *TakenError without a record, and the caller claims again, Contended.
//
// Concurrent commits are sent together, as one pipeline and one
// transaction (see groupCommitter): their claims as the two statements
// above, each of them for all the keys, then every operation's writes; or,
// for a few commits that each fit one statement, their lone statements one
// after the other. Still one round trip each.

// Deferred returns the store for write-only operations: their claim is made
// at their commit, with their writes, in one round trip (see Batch). A
// contended claim (idempotency.ClaimRequest.Contended) is made at once, in
// a transaction, as Store.Claim makes it, and its Batch's writes are sent
// in that transaction at Commit.
func (s *Store) Deferred() idempotency.Store[*Batch] { return s.deferred }

type deferredStore struct{ s *Store }

// Batch is the unit of work of a write-only operation: the writes it queues
// are sent with the claim at Commit, and must make no change unless that
// very transaction inserted the key row of their claim. Each queued write
// says so in its SQL, as
//
//	WHERE EXISTS (SELECT 1 FROM idempotency_keys k
//	              WHERE k.scope = $scope AND k.idempotency_key = $key
//	                AND k.xmin = pg_current_xact_id_if_assigned()::xid
//	                AND k.created_at = $claimed_at)
//
// with the scope, key and time of the lease's Ref (and the table of
// Options.Table): Guard writes it. xmin is the inserting transaction; a
// pipeline has no subtransactions, and a transaction that has inserted
// nothing has no xid yet (NULL: no match). xmin is only 32 bits and comes
// round again, so the claim's time pins the row too: a key row that an
// older transaction of the same xid left matches neither. A replay, a
// mismatch or a lost race so writes nothing, with no error and no dead
// row. A lone commit of one such write, its guard written exactly so (case
// and spacing aside), goes as one statement in which the guard asks the
// claim itself whether it inserted the row. The operation reads nothing
// back: its writes report no rows affected, as they have not run yet.
type Batch struct {
	queued pgx.Batch
	table  string
	ref    idempotency.Ref
}

// Ref is the claim the queued writes are guarded by.
func (b *Batch) Ref() idempotency.Ref { return b.ref }

// Guard returns the condition a queued write must carry, with its
// parameters numbered from first (three of them: the claim's scope, key
// and time), and their values: append the values to the statement's own
// arguments.
//
//	cond, args := batch.Guard(3)
//	batch.Exec(ctx, "INSERT INTO widgets (id, name) SELECT $1, $2 WHERE "+cond, append([]any{id, name}, args...)...)
func (b *Batch) Guard(first int) (cond string, args []any) {
	cond = fmt.Sprintf(`EXISTS (SELECT 1 FROM %s k WHERE k.scope = $%d AND k.idempotency_key = $%d
		AND k.xmin = pg_current_xact_id_if_assigned()::xid AND k.created_at = $%d)`, b.table, first, first+1, first+2)
	return cond, []any{[]byte(b.ref.Scope), b.ref.Key, b.ref.ClaimedAt}
}

// Exec queues sql as given: it must carry Guard's condition itself. Its
// signature is that of sqlc's DBTX.Exec, so a DBTX whose Exec is this one
// lets sqlc's generated :exec queries write into a Batch. It never fails.
func (b *Batch) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	b.queued.Queue(sql, args...)
	return pgconn.CommandTag{}, nil
}

// Len is how many writes are queued.
func (b *Batch) Len() int { return b.queued.Len() }

func (d *deferredStore) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Lease[*Batch], *idempotency.Record, error) {
	if req.Contended {
		lease, rec, err := d.s.claimTx(ctx, req)
		if lease == nil {
			return nil, rec, err
		}
		return &contendedLease{txLease: lease, writes: &Batch{table: d.s.table, ref: lease.ref}}, nil, nil
	}
	// The row's created_at is this time, so Ref names the claim before it
	// is made; microseconds, as PostgreSQL stores it.
	ref := idempotency.Ref{Scope: req.Scope, Key: req.Key, ClaimedAt: time.Now().Truncate(time.Microsecond)}
	return &deferredLease{s: d.s, req: req, ref: ref, writes: &Batch{table: d.s.table, ref: ref}}, nil, nil
}

// contendedLease is a deferred operation's lease claimed at once: its
// writes go in its transaction at Commit.
type contendedLease struct {
	*txLease
	writes *Batch
}

func (l *contendedLease) Unit() *Batch { return l.writes }

func (l *contendedLease) Commit(ctx context.Context, resp idempotency.Response) error {
	return l.commit(ctx, resp, &l.writes.queued)
}

// deferredLease is a claim not yet made: the operation's writes wait in
// its Batch until Commit sends them with the claim.
type deferredLease struct {
	s      *Store
	req    idempotency.ClaimRequest
	ref    idempotency.Ref
	writes *Batch
	ended  bool
	// The response to store, encoded by Commit.
	status        int32
	headers, body []byte
}

func (l *deferredLease) Unit() *Batch         { return l.writes }
func (l *deferredLease) Ref() idempotency.Ref { return l.ref }

// Rollback discards the queued writes; nothing was sent.
func (l *deferredLease) Rollback(context.Context) error {
	l.ended = true
	return nil
}

func (l *deferredLease) Commit(ctx context.Context, resp idempotency.Response) error {
	if l.ended {
		return errEnded
	}
	l.ended = true
	headers, body, err := encodeResponse(resp)
	if err != nil {
		return err
	}
	l.status, l.headers, l.body = int32(resp.Status), headers, body
	return l.s.commits.commit(ctx, l)
}

// claimResult is what PostgreSQL answered to a deferred commit's claim:
// what held the key at the peek, and whether the insert claimed it.
type claimResult struct {
	peeked   keydb.IdempotencyKeyPeekManyRow
	inserted bool
}

// readWrites reads the results of this lease's writes off br, so that the
// next lease's follow in a merged pipeline. An error means the pipeline's
// transaction failed, at this lease's write.
func (l *deferredLease) readWrites(br pgx.BatchResults) error {
	for i := range l.writes.Len() {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("write %d of the operation: %w", i+1, err)
		}
	}
	return nil
}

// readError translates an error of a deferred pipeline on table: a claim
// statement's lock wait for a key's holder that ran out means the key is
// in flight (claimError).
func readError(ctx context.Context, table string, err error) error {
	var claimErr *claimStepError
	if errors.As(err, &claimErr) {
		return claimError(ctx, table, claimErr.step, claimErr.err)
	}
	return Translate(err)
}

// claimStepError is a failure of one of the claim's own statements, where
// a lock wait that ran out means the key is in flight (see claimError).
type claimStepError struct {
	step string
	err  error
}

func (e *claimStepError) Error() string { return e.step + ": " + e.err.Error() }
func (e *claimStepError) Unwrap() error { return e.err }

// answer is what the results of a committed pipeline mean for this lease:
// nil if its key was claimed and its writes made, a *TakenError or
// ErrInFlight if the key was not free (and nothing of it was written).
func (l *deferredLease) answer(res claimResult) error {
	if res.inserted {
		return nil
	}
	// Nothing was written: the guarded writes saw no claim.
	peeked := res.peeked
	switch {
	case !peeked.Status.Valid || peeked.Expired:
		// A concurrent first request committed the key after the
		// peek's snapshot, or the row there has expired.
		return &idempotency.TakenError{}
	case peeked.Status.String != "completed":
		return idempotency.ErrInFlight
	}
	if peeked.CreatedAt == nil || peeked.ExpiresAt == nil {
		return errors.New("peeked record without timestamps")
	}
	rec, err := newRecord(peeked.Fingerprint, peeked.ResponseStatus, peeked.ResponseHeaders, peeked.ResponseBody, *peeked.CreatedAt, *peeked.ExpiresAt)
	if err != nil {
		return err
	}
	return &idempotency.TakenError{Record: rec}
}
