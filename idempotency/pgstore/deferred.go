package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore/internal/keydb"
)

// A claim at commit serves a write-only operation in one round trip. Claim
// hands out the lease without touching the database; the operation's
// writes are queued in its Batch instead of run; Commit sends, as one
// pipeline that PostgreSQL runs as one implicit transaction:
//
//	IdempotencyKeyPeekMany             the wait budget, and what holds each key
//	                                   (IdempotencyKeyPeekScope when all are of one scope)
//	IdempotencyKeyInsertCompletedMany  the claims and the responses, together
//	each operation's writes            each guarded by its claim (see Batch)
//
// A lone commit of at most one write is sent as one statement instead
// (IdempotencyKeyClaimLone, see lone.go): the same claim, write and peek,
// as CTEs.
//
// If a row holds the key, the insert does nothing (ON CONFLICT DO NOTHING)
// and neither do the guarded writes: nothing is written, no error is
// raised, no dead row is left, and the peek says what to answer instead (a
// replay or a 409), still in the one round trip. A concurrent holder's
// uncommitted row makes the insert wait, bounded by the budget, as the
// transactional claim's does. The rare rest (a row that expired but is not
// yet cleaned up, a holder that committed after the peek) is reported as
// *TakenError without a record, and the caller claims again, AtOnce.
//
// Concurrent commits are sent together, as one pipeline and one
// transaction (see groupCommitter): their claims as the two statements
// above, each of them for all the keys, then every operation's writes; or,
// for a few commits of at most one write each, their lone statements one
// after the other. Still one round trip each.

// ClaimAtCommit returns the store for operations that only write, whose
// writes are the statements given, which Batch.Exec then takes: their claim
// is made at their commit, with their writes, in one round trip (see
// Batch). A claim whose request asks for it AtOnce (the engine's, for a key
// it saw contended) is made in Claim instead, in a transaction, as
// Store.Claim makes it, and the Batch's writes are sent in that transaction
// at Commit. A held operation, which writes nothing but its key, claims and
// holds it in one round trip on this store given no writes.
//
// Each write is one INSERT, UPDATE or DELETE that must make no change
// unless its claim inserted the key row, and says so by calling the guard,
// Guard (idempotency_keys_guard() for the default table), in its WHERE
// clause:
//
//	INSERT INTO widgets (id, name)
//	SELECT $1, $2 WHERE idempotency_keys_guard()
//
// ClaimAtCommit refuses a write that is not such a statement (one that
// starts with WITH, ends with a semicolon, or does not call the guard), so
// that an operation is refused when it is bound, at start-up. Every write
// it takes can go, alone, in the one statement of a lone commit.
func (s *Store) ClaimAtCommit(writes ...string) (idempotency.Store[*Batch], error) {
	d := &deferredStore{Store: s, writes: make(map[string]string, len(writes))}
	for _, w := range writes {
		if err := s.checkWrite(w); err != nil {
			return nil, err
		}
		d.writes[w] = s.testingClaim(w)
	}
	return d, nil
}

// Guard is the SQL call with which a write claimed at commit makes no
// change unless its own claim inserted the key row (see ClaimAtCommit): the
// key table's name and "_guard()". Migrate creates the function, which is
// false, so that a guarded write run anywhere else changes nothing and the
// application's SQL tools (sqlc) know it; pgstore replaces each call, as it
// sends the write, with a test of the write's own claim.
func (s *Store) Guard() string { return s.table + "_guard()" }

// claimed is the relation pgstore tests a write's claim with, in place of
// the guard's call: a CTE of each statement it sends, which holds a row
// exactly when the write's own claim inserted the key row in that
// transaction. Private to pgstore: an application's write calls Guard.
func (s *Store) claimed() string { return s.table + "_claimed" }

// testingClaim is sql with each call of the guard replaced by the test of
// the write's own claim, as pgstore sends it.
func (s *Store) testingClaim(sql string) string {
	return strings.ReplaceAll(sql, s.Guard(), "EXISTS (SELECT FROM "+s.claimed()+")")
}

// checkWrite refuses a write that pgstore cannot send with its guard (see
// ClaimAtCommit).
func (s *Store) checkWrite(sql string) error {
	refuse := func(why string) error {
		return fmt.Errorf("pgstore: a write claimed at commit must be one INSERT, UPDATE or DELETE that calls %s (%s): %q", s.Guard(), why, sql)
	}
	lower := strings.ToLower(sql)
	switch {
	case !startsWithWrite(sql):
		return refuse("it starts with something else")
	case strings.HasSuffix(strings.TrimSpace(sql), ";"):
		return refuse("it ends with a semicolon")
	case !strings.Contains(sql, s.Guard()):
		return refuse("it does not call the guard")
	case strings.Contains(lower, s.claimed()):
		return refuse("it names " + s.claimed() + ", which is pgstore's own")
	case strings.Contains(lower, "pgstore_"):
		return refuse("it names pgstore_…, which pgstore's own statement uses")
	}
	return nil
}

// deferredStore is the store ClaimAtCommit returns. It settles, releases,
// purges and counts as the Store it comes from.
type deferredStore struct {
	*Store
	// writes maps each statement ClaimAtCommit took to the statement
	// pgstore sends, its guard's calls replaced by the test of its claim.
	writes map[string]string
}

// Batch is the unit of work of a write-only operation: the writes it queues
// are sent with the claim at Commit, each of them one of the statements
// ClaimAtCommit took, its guard's call replaced by a test of whether this
// claim inserted the key row. Its writes report no rows affected, as they have not
// run yet; the operation reads nothing back.
//
// In a pipeline, a write goes after a CTE (the relation its guard's call
// is replaced by a test of) that asks
// the key table for the claim's own row: its scope, key and time, and
// xmin equal to the current transaction (a pipeline has no
// subtransactions, and a transaction that has inserted nothing has no xid
// yet: no match). xmin is only 32 bits and comes round again, so the
// claim's time pins the row too. A replay, a mismatch or a lost race so
// writes nothing, with no error and no dead row. A lone commit of one write
// goes as one statement, in which that relation is the claim's insert
// itself.
type Batch struct {
	queued pgx.Batch // the writes as a pipeline sends them
	writes []write   // the writes as Exec took them, for a lone commit
	d      *deferredStore
	ref    idempotency.Ref
	err    error // the first statement Exec refused
}

// write is one statement queued in a Batch, with its arguments.
type write struct {
	sql  string
	args []any
}

// Ref is the claim the queued writes are guarded by.
func (b *Batch) Ref() idempotency.Ref { return b.ref }

// Exec queues sql, which must be one of the statements ClaimAtCommit took. Its
// signature is that of sqlc's DBTX.Exec, so a DBTX whose Exec is this one
// lets sqlc's generated :exec queries write into a Batch. It refuses any
// other statement, and the lease's Commit then fails with that error,
// having sent nothing.
func (b *Batch) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	sent, ok := b.d.writes[sql]
	if !ok {
		err := fmt.Errorf("pgstore: a statement that ClaimAtCommit did not take: %q", sql)
		if b.err == nil {
			b.err = err
		}
		return pgconn.CommandTag{}, err
	}
	args = slices.Clip(args)
	b.queued.Queue(b.d.guarded(sent, len(args)), append(args, b.d.scope.arg(b.ref.Scope), b.ref.Key, b.ref.ClaimedAt)...)
	b.writes = append(b.writes, write{sql: sent, args: args})
	return pgconn.CommandTag{}, nil
}

// Len is how many writes are queued.
func (b *Batch) Len() int { return b.queued.Len() }

// guarded is a write claimed at commit, its guard's calls replaced, as a
// pipeline sends it: after a CTE of the relation that tests its claim,
// whose parameters follow the write's n.
func (s *Store) guarded(sql string, n int) string {
	key := composedKey{sql: sql, n: n}
	if v, ok := s.pipelined.Load(key); ok {
		return v.(string)
	}
	out := s.scope.sql(fmt.Sprintf("WITH %s AS (\n    SELECT true AS claimed FROM %s k\n    WHERE k.scope = CAST($%d AS bytea) AND k.idempotency_key = $%d\n      AND k.xmin = pg_current_xact_id_if_assigned()::xid AND k.created_at = $%d\n)\n",
		s.claimed(), s.table, n+1, n+2, n+3)) + sql
	s.pipelined.Store(key, out)
	return out
}

// composedKey names a deferred write composed for n arguments.
type composedKey struct {
	sql string
	n   int
}

// Claim implements idempotency.Store: the claim is made at the lease's
// Commit, unless req asks for it AtOnce: then it is made now, in a
// transaction, as Store.Claim makes it, and the Batch's writes are sent in
// that transaction at Commit.
func (d *deferredStore) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Lease[*Batch], *idempotency.Record, error) {
	if req.AtOnce {
		lease, rec, err := d.claimTx(ctx, req)
		if lease == nil {
			return nil, rec, err
		}
		return &atOnceLease{txLease: lease, writes: &Batch{d: d, ref: lease.ref}}, nil, nil
	}
	if err := d.claimable(ctx, req.Scope); err != nil {
		return nil, nil, err
	}
	// The row's created_at is this time, so Ref names the claim before it
	// is made; microseconds, as PostgreSQL stores it.
	ref := idempotency.Ref{Scope: req.Scope, Key: req.Key, ClaimedAt: d.now().Truncate(time.Microsecond)}
	return &deferredLease{s: d.Store, req: req, scope: d.scope.sent(req.Scope), ref: ref, writes: &Batch{d: d, ref: ref}}, nil, nil
}

// atOnceLease is the lease of a write-only operation claimed at once
// (ClaimRequest.AtOnce): its writes go in its transaction at Commit.
type atOnceLease struct {
	*txLease
	writes *Batch
}

func (l *atOnceLease) Unit() *Batch { return l.writes }

func (l *atOnceLease) Commit(ctx context.Context, resp idempotency.Response) error {
	if l.writes.err != nil {
		_ = l.Rollback(ctx)
		return l.writes.err
	}
	return l.commit(ctx, resp, &l.writes.queued)
}

// deferredLease is a claim not yet made: the operation's writes wait in
// its Batch until Commit sends them with the claim.
type deferredLease struct {
	s   *Store
	req idempotency.ClaimRequest
	// scope is req.Scope as pgstore sends it, and as the key's row reads
	// it back (ScopeType.sent): what group commit tells keys apart by.
	scope  string
	ref    idempotency.Ref
	writes *Batch
	ended  bool
	// The response to store, encoded by Commit.
	status        int32
	headers, body []byte
}

func (l *deferredLease) Unit() *Batch         { return l.writes }
func (l *deferredLease) Ref() idempotency.Ref { return l.ref }

// errNoPieces is what a claim made at commit answers WritePiece: there is
// no claim yet to write pieces beside, and the body stays in the record.
var errNoPieces = fmt.Errorf("pgstore: a claim made at commit keeps its body in its record: %w", errors.ErrUnsupported)

// errPiecesAtCommit refuses the commit of a claim made at commit of a
// response whose body is in pieces: it took none (errNoPieces).
var errPiecesAtCommit = errors.New("pgstore: a claim made at commit stores its body in its record, not in pieces")

// WritePiece implements idempotency.Lease: a claim made at commit takes no
// pieces (errNoPieces).
func (l *deferredLease) WritePiece(context.Context, int, []byte) error { return errNoPieces }

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
	if l.writes.err != nil {
		return l.writes.err
	}
	if resp.Pieces > 0 {
		return errPiecesAtCommit
	}
	status, headers, body, err := encodeResponse(resp)
	if err != nil {
		return err
	}
	l.status, l.headers, l.body = status, headers, body
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
	rec, err := newRecord(peeked.Fingerprint, peeked.ResponseStatus, peeked.ResponseHeaders, peeked.ResponseBody, peeked.ResponsePieces, peeked.ResponseSize, *peeked.CreatedAt, *peeked.ExpiresAt, peeked.ReadAt)
	if err != nil {
		return err
	}
	return &idempotency.TakenError{Record: rec}
}
