package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/oncekey/oncekey/gen/db"
	"github.com/oncekey/oncekey/internal/idempotency"
)

// A deferred claim serves a write-only operation (idempotency.ClaimRequest.
// Deferred) in one round trip. Claim hands out the lease without touching
// the database; the operation's writes, made through sqlc as usual, are
// queued instead of run; Commit sends, as one pipeline that PostgreSQL runs
// as one implicit transaction:
//
//	IdempotencyKeyPeekMany             the wait budget, and what holds each key
//	IdempotencyKeyInsertCompletedMany  the claims and the responses, together
//	each operation's writes            each guarded by its claim (see OrderCreateClaimed)
//
// If a row holds the key, the insert does nothing (ON CONFLICT DO NOTHING)
// and neither do the guarded writes: nothing is written, no error is
// raised, no dead row is left, and the peek says what to answer instead (a
// replay or a 409), still in the one round trip. A concurrent holder's
// uncommitted row makes the insert wait, bounded by the budget, as the
// transactional claim's does. The rare rest (a row that expired but is not
// yet cleaned up, a holder that committed after the peek) is reported as
// *TakenError without a record, and the caller claims again in the
// transactional way.
//
// Concurrent commits are sent together, as one pipeline and one
// transaction (see groupCommitter): their claims as the two statements
// above, each of them for all the keys, then every operation's writes.
// Still one round trip each.

// claimGuard is the heart of what every write of a deferred operation must
// be conditional on: that this transaction inserted the key row (see
// OrderCreateClaimed). pipeline refuses a write without it.
const claimGuard = "k.xmin = pg_current_xact_id_if_assigned()::xid"

// errUnguardedWrite is a wiring bug: a write queued in a deferred unit of
// work that would happen even if the key was not claimed.
var errUnguardedWrite = errors.New("postgres: a deferred operation's write is not guarded by its claim (" + claimGuard + ")")

// errDeferredRead is a wiring bug: an operation marked deferrable read
// through its unit of work, which a deferred claim cannot answer before its
// commit.
var errDeferredRead = errors.New("postgres: a deferred (write-only) operation read through its unit of work; it must not be deferred")

// errQueued is what a read queued into a pipeline returns to its sqlc
// method; the rows arrive from the batch.
var errQueued = errors.New("postgres: queued in a pipeline")

// pipeline is a db.DBTX that queues statements into one batch instead of
// running them. Exec reports no rows affected: a deferred operation cannot
// depend on counts. An operation's writes must be guarded by the claim of
// (account, key); its reads are refused. The store's own statements (reads
// set) are queued as they are, their results read from the batch.
type pipeline struct {
	batch   pgx.Batch
	reads   bool
	account uuid.UUID
	key     string
}

func (p *pipeline) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if !p.reads && !strings.Contains(sql, claimGuard) {
		return pgconn.CommandTag{}, errUnguardedWrite
	}
	p.batch.Queue(sql, args...)
	return pgconn.CommandTag{}, nil
}

func (p *pipeline) Query(_ context.Context, sql string, args ...any) (pgx.Rows, error) {
	if !p.reads {
		return nil, errDeferredRead
	}
	p.batch.Queue(sql, args...)
	return nil, errQueued
}

func (p *pipeline) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	if !p.reads {
		return errRow{errDeferredRead}
	}
	p.batch.Queue(sql, args...)
	return errRow{errQueued}
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// deferredLease is a claim not yet made: the operation's writes wait in
// writes until Commit sends them with the claim.
type deferredLease struct {
	s         *Store
	req       idempotency.ClaimRequest
	claimedAt time.Time
	writes    pipeline
	done      bool
	// The response to store, encoded by Commit.
	status        int32
	headers, body []byte
}

func (s *Store) claimDeferred(req idempotency.ClaimRequest) *deferredLease {
	// The row's created_at is this time, so ClaimedAt names the claim
	// before it is made; microseconds, as PostgreSQL stores it.
	return &deferredLease{
		s: s, req: req, claimedAt: time.Now().Truncate(time.Microsecond),
		writes: pipeline{account: req.Account, key: req.Key},
	}
}

func (l *deferredLease) ClaimedAt() time.Time { return l.claimedAt }

func (l *deferredLease) Context(ctx context.Context) context.Context {
	return context.WithValue(ctx, txKey{}, &l.writes)
}

// Rollback discards the queued writes; nothing was sent.
func (l *deferredLease) Rollback(context.Context) error {
	l.done = true
	return nil
}

func (l *deferredLease) Commit(ctx context.Context, resp idempotency.Response) error {
	if l.done {
		return errors.New("lease already settled")
	}
	l.done = true
	headers, body, err := encodeResponse(resp)
	if err != nil {
		return err
	}
	l.status, l.headers, l.body = int32(resp.Status), headers, body
	return l.s.commits.commit(ctx, l)
}

// deferredResults is what PostgreSQL answered to a deferred commit's
// claim: what held the key at the peek, and whether the insert claimed it.
type deferredResults struct {
	peeked   db.IdempotencyKeyPeekManyRow
	inserted bool
}

// readWrites reads the results of this lease's writes off br, so that the
// next lease's follow in a merged pipeline. An error means the pipeline's
// transaction failed, at this lease's write.
func (l *deferredLease) readWrites(br pgx.BatchResults) error {
	for i := range l.writes.batch.Len() {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("write %d of the operation: %w", i+1, err)
		}
	}
	return nil
}

// readError translates an error of a deferred pipeline: a claim statement's lock wait or
// statement timeout that ran out means the key is in flight (claimError).
func readError(ctx context.Context, err error) error {
	var claimErr *claimStepError
	if errors.As(err, &claimErr) {
		return claimError(ctx, claimErr.step, claimErr.err)
	}
	return translate(err)
}

// claimStepError is a failure of one of the claim's own statements, where
// a lock wait that ran out means the key is in flight (see claimError).
type claimStepError struct {
	step string
	err  error
}

func (e *claimStepError) Error() string { return e.step + ": " + e.err.Error() }
func (e *claimStepError) Unwrap() error { return e.err }

// outcome is what the results of a committed pipeline mean for this lease:
// nil if its key was claimed and its writes made, a *TakenError or
// ErrInFlight if the key was not free (and nothing of it was written).
func (l *deferredLease) outcome(res deferredResults) error {
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
	rec, err := peekedRecord(peeked)
	if err != nil {
		return err
	}
	return &idempotency.TakenError{Record: rec}
}

func peekedRecord(row db.IdempotencyKeyPeekManyRow) (*idempotency.Record, error) {
	if row.CreatedAt == nil || row.ExpiresAt == nil {
		return nil, errors.New("peeked record without timestamps")
	}
	return newRecord(row.Fingerprint, row.ResponseStatus, row.ResponseHeaders, row.ResponseBody, *row.CreatedAt, *row.ExpiresAt)
}

// newRecord builds a completed record from its stored columns.
func newRecord(fingerprint []byte, status pgtype.Int4, headers, body []byte, createdAt, expiresAt time.Time) (*idempotency.Record, error) {
	rec := &idempotency.Record{
		Response:  idempotency.Response{Status: int(status.Int32), Body: body, Header: http.Header{}},
		CreatedAt: createdAt,
		ExpiresAt: expiresAt,
	}
	if len(fingerprint) != len(rec.Fingerprint) {
		return nil, fmt.Errorf("stored fingerprint has %d bytes", len(fingerprint))
	}
	copy(rec.Fingerprint[:], fingerprint)
	if len(headers) > 0 {
		if err := json.Unmarshal(headers, &rec.Response.Header); err != nil {
			return nil, fmt.Errorf("decode stored headers: %w", err)
		}
	}
	return rec, nil
}
