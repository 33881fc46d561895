// Package pgstore keeps idempotency records in PostgreSQL (pgx/v5), in the
// same transaction as the operation's own writes: a crash at any instant
// leaves either nothing (the retry runs the operation) or the operation's
// writes and its stored response (the retry replays it). Every commit it
// answers on runs with synchronous_commit at least on, whatever the
// server's default, so a commit acknowledged is a commit on disk.
//
// There is one way to claim for each need (docs/glossary-store.md):
//
//   - Store is an idempotency.Store[pgx.Tx] that claims at once: the claim
//     inserts the key row inside a transaction that the operation then
//     writes through, and Commit stores the response in it before
//     committing.
//   - Store.ClaimAtCommit is an idempotency.Store[*Batch] for operations
//     that only write: their writes are queued, and the claim, the writes
//     and the response go to PostgreSQL together at Commit, as one
//     pipeline, in one round trip; concurrent such commits share one
//     transaction and one WAL flush (group commit). Each write calls the
//     guard, Store.Guard, a function Migrate creates.
//   - Store.Join joins the claim to a transaction the handler opened itself,
//     without the engine (Store.JoinSQL for database/sql's): the key row
//     commits or rolls back with the handler's own writes.
//
// Migrate creates or upgrades the key table (Options.Table, default
// idempotency_keys) from the SQL migrations embedded in this package; a store
// on a database it has not migrated fails its first claim with
// ErrNotMigrated. The scope column is bytea unless Options.Scope makes it
// uuid or text (see ScopeType), as a database sharded by tenant needs.
// Beside the key table are its audit trail (the table's name and "_audit",
// see package keyadmin) and the pieces of bodies too large to keep in
// their record (the table's name and "_pieces", see Store.WritePiece),
// which a settle, a release and PurgeExpired keep in step with the
// records; no trigger or foreign key ties them, so a claim reads and
// writes the key table alone. A record whose body is in pieces is stored
// as a held record that ran and was not stored, its real status in it, so
// that a release that knows no pieces, rolled back onto the table,
// answers its key with ErrNotStored's 409 rather than replay an empty
// body; this one reads it as its real status.
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore/internal/access"
	"github.com/oncekey/oncekey/idempotency/pgstore/internal/keydb"
)

// DefaultTable is the key table's name unless Options.Table says otherwise.
const DefaultTable = "idempotency_keys"

// Options configures a Store and Migrate.
type Options struct {
	// Table is the key table's name (default idempotency_keys): a plain
	// lower-case identifier, for two key tables in one schema, say. The
	// guard of Batch writes names it too.
	Table string
	// MergeByScope makes group commit merge only the deferred commits of
	// one scope into a pipeline (see ClaimAtCommit). On a database sharded or
	// partitioned by the scope's tenant, every pipeline then reads and
	// writes one shard, in one local transaction; the price is less
	// merging when many tenants commit at once. Default: commits of any
	// scopes merge.
	MergeByScope bool
	// Scope is the SQL type of the scope column (default bytea): see
	// ScopeType. Migrate creates the table with it, and a Store whose
	// table's column is of another type fails its first claim.
	Scope ScopeType
}

func (o Options) table() (string, error) {
	if o.Table == "" {
		return DefaultTable, nil
	}
	if !plainIdentifier(o.Table) {
		return "", fmt.Errorf("pgstore: table name %q is not a plain lower-case identifier of at most 48 characters", o.Table)
	}
	return o.Table, nil
}

// Store keeps idempotency records in one table of a PostgreSQL database.
type Store struct {
	pool    *pgxpool.Pool
	table   string
	scope   ScopeType
	rewrite func(keydb.DBTX) keydb.DBTX
	// partitionRewriters rewrite the statements for each partition of a
	// partitioned key table (partitions).
	partitionRewriters sync.Map
	commits            *groupCommitter
	// settles merges concurrent settles and releases (groupsettle.go).
	settles *settleGroup
	// claimLone is IdempotencyKeyClaimLone for the table; lones and
	// pipelined cache each deferred write composed with it (lone) or with
	// its guard (guarded).
	claimLone        string
	lones, pipelined sync.Map
	// migrated is set once the first claim has found the key table at the
	// version this pgstore needs (checkSchema).
	migrated atomic.Bool
	// now is this process's clock (time.Now): a deferred claim's time, by
	// which its Ref names it. What expires when, and a held record's
	// lease, are on the database's clock instead; tests skew this one.
	now func() time.Time
}

// ErrNotMigrated is returned by the first claim of a Store whose key table
// is missing or older than this pgstore: Migrate has not run on that
// database, or an older pgstore's did.
var ErrNotMigrated = errors.New("pgstore: the key table is missing or out of date: run pgstore.Migrate")

// claimable refuses a claim of scope before anything is sent: a scope the
// column cannot hold, or a key table that is not migrated (checkSchema).
func (s *Store) claimable(ctx context.Context, scope string) error {
	if err := s.scope.check(scope); err != nil {
		return err
	}
	return s.checkSchema(ctx)
}

// checkSchema fails a Store's first claim with ErrNotMigrated, naming the
// table and the versions, rather than letting every claim fail on a
// missing relation or column; and with ErrScopeType when the scope column
// is not of Options.Scope's type. Once the schema is found current it is
// not asked again; a database that cannot be reached is asked again next
// time.
func (s *Store) checkSchema(ctx context.Context) error {
	if s.migrated.Load() {
		return nil
	}
	var have int
	err := s.pool.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+pgx.Identifier{s.table + "_schema_version"}.Sanitize()).Scan(&have)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42P01": // undefined_table
		return fmt.Errorf("%w: %s_schema_version does not exist in this database", ErrNotMigrated, s.table)
	case err != nil:
		return Translate(fmt.Errorf("pgstore: read the key table's version: %w", err))
	case have < migrationCount:
		return fmt.Errorf("%w: %s is at version %d, this pgstore needs %d", ErrNotMigrated, s.table, have, migrationCount)
	}
	if err := checkScopeType(ctx, s.pool, s.table, s.scope); err != nil {
		return err
	}
	s.migrated.Store(true)
	return nil
}

// ErrScopeType is returned by Migrate and by a Store's first claim when the
// key table's scope column is not of the type Options.Scope says: the
// table was created with another, which Migrate does not change.
var ErrScopeType = errors.New("pgstore: the key table's scope column is not of Options.Scope's type")

// checkScopeType fails with ErrScopeType unless table's scope column is
// of type want.
func checkScopeType(ctx context.Context, db keydb.DBTX, table string, want ScopeType) error {
	var have string
	if err := db.QueryRow(ctx, `SELECT format_type(atttypid, NULL) FROM pg_attribute
		WHERE attrelid = to_regclass($1) AND attname = 'scope' AND NOT attisdropped`, pgx.Identifier{table}.Sanitize()).Scan(&have); err != nil {
		return Translate(fmt.Errorf("pgstore: read the key table's scope type: %w", err))
	}
	if have != string(want) {
		return fmt.Errorf("%w: %s.scope is %s, Options.Scope says %s", ErrScopeType, table, have, want)
	}
	return nil
}

// New returns a store on pool. The table must exist and be current (see
// Migrate): the first claim fails with ErrNotMigrated if it is not.
func New(pool *pgxpool.Pool, opts Options) (*Store, error) {
	table, err := opts.table()
	if err != nil {
		return nil, err
	}
	scope, err := opts.scope()
	if err != nil {
		return nil, err
	}
	s := &Store{pool: pool, table: table, scope: scope, rewrite: func(d keydb.DBTX) keydb.DBTX { return d }, now: time.Now}
	if table != DefaultTable || scope != ScopeBytea {
		r := &rewriter{to: table, scope: scope}
		s.rewrite = func(d keydb.DBTX) keydb.DBTX { return rewritten{d, r} }
	}
	s.commits = &groupCommitter{pool: pool, store: s, byScope: opts.MergeByScope}
	s.settles = &settleGroup{pool: pool, store: s, byScope: opts.MergeByScope}
	s.claimLone = claimLoneSQL(s)
	if err := checkClaimLone(s.claimLone); err != nil {
		return nil, err
	}
	return s, nil
}

// plainIdentifier reports whether name is a lower-case identifier of at
// most 48 bytes that needs no quoting: the key table's name, which pgstore
// puts in its statements (with suffixes of up to 15 bytes, within
// PostgreSQL's 63).
func plainIdentifier(name string) bool {
	if name == "" || len(name) > 48 || ('0' <= name[0] && name[0] <= '9') {
		return false
	}
	for _, c := range []byte(name) {
		if c != '_' && !('a' <= c && c <= 'z') && !('0' <= c && c <= '9') {
			return false
		}
	}
	return true
}

// queries runs the key table's statements on db.
func (s *Store) queries(db keydb.DBTX) *keydb.Queries { return keydb.New(s.rewrite(db)) }

// CleanupLock is the session advisory lock that PurgeExpired holds while it
// purges table, so that one process at a time does; another process that
// holds it (an operator pausing cleanup, say) makes PurgeExpired return
// idempotency.ErrCleanupBusy.
func CleanupLock(table string) int64 { return lockID(table + "/cleanup") }

// lockID is an advisory lock named by s: s folded into 63 bits, so that
// two key tables migrate and purge independently.
func lockID(table string) int64 {
	var h uint64 = 14695981039346656037 // FNV-1a
	for i := 0; i < len(table); i++ {
		h ^= uint64(table[i])
		h *= 1099511628211
	}
	return int64(h >> 1)
}

// rewriter rewrites the key table's statements for a table of another
// name or scope type, once per statement.
type rewriter struct {
	to    string
	scope ScopeType
	done  sync.Map // statement → rewritten statement
}

func (r *rewriter) sql(sql string) string {
	if v, ok := r.done.Load(sql); ok {
		return v.(string)
	}
	out := r.scope.sql(strings.ReplaceAll(sql, DefaultTable, r.to))
	r.done.Store(sql, out)
	return out
}

// rewritten is a DBTX whose statements are rewritten by its rewriter.
type rewritten struct {
	keydb.DBTX
	r *rewriter
}

func (d rewritten) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return d.DBTX.Exec(ctx, d.r.sql(sql), args...)
}

func (d rewritten) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return d.DBTX.Query(ctx, d.r.sql(sql), args...)
}

func (d rewritten) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return d.DBTX.QueryRow(ctx, d.r.sql(sql), args...)
}

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
func (s *Store) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Lease[pgx.Tx], *idempotency.Record, error) {
	lease, rec, err := s.claimTx(ctx, req)
	if lease == nil {
		return nil, rec, err
	}
	return lease, nil, nil
}

// claimTx claims req's key in a transaction of its own.
func (s *Store) claimTx(ctx context.Context, req idempotency.ClaimRequest) (*txLease, *idempotency.Record, error) {
	if err := s.claimable(ctx, req.Scope); err != nil {
		return nil, nil, err
	}
	deadline := time.Now().Add(req.Wait)
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{
		// One round trip: pgx sends a BeginQuery without arguments over the
		// simple protocol, which allows the further statements. The
		// transaction's commit stores the operation's outcome: durable.
		BeginQuery: "BEGIN; SELECT " + durableCommit + "; " + waitBudget(req.Wait),
	})
	if err != nil {
		return nil, nil, Translate(fmt.Errorf("begin: %w", err))
	}
	lease, rec, err := s.claimIn(ctx, tx, req, deadline)
	if lease == nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
	}
	return lease, rec, err
}

// statementSlack is what a claim statement may take beyond its lock
// waits: on a loaded server a statement that blocks on nothing can still
// take a few hundred milliseconds (its first run on a connection is
// prepared, one more round trip), and must not be mistaken for an
// in-flight key, nor for a database that is down. The store contract
// allows a claim at most 600 ms beyond its wait (storetest).
const statementSlack = 300 * time.Millisecond

// durableCommit, selected in a transaction, makes its commit durable
// whatever the session's or the server's synchronous_commit: it is raised
// to on (the commit waits for its WAL flush, and for a synchronous standby
// where one is configured), and remote_apply, stronger, is kept. Each
// transaction whose commit the protocol answers on (a claim with its
// outcome, a hold, a settle, a release) runs it; the key table's own
// statements do the same in SQL (keydb). With synchronous_commit off, a
// commit is acknowledged before it is on disk: a PostgreSQL crash a moment
// later forgets a hold whose operation ran, and its key runs again
// (TestDurableCommits).
const durableCommit = `set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'remote_apply' THEN 'remote_apply' ELSE 'on' END, true)`

// waitMillis is a wait in whole milliseconds for lock_timeout, at least 1:
// 0 would mean no bound at all.
func waitMillis(d time.Duration) int64 { return max(d.Milliseconds(), 1) }

// waitBudget bounds a claim statement: each lock wait by d, the statement
// as a whole (which may wait on several holders in turn) by d plus slack.
func waitBudget(d time.Duration) string {
	ms := waitMillis(d)
	return fmt.Sprintf("SET LOCAL lock_timeout = %d; SET LOCAL statement_timeout = %d", ms, ms+statementSlack.Milliseconds())
}

func (s *Store) claimIn(ctx context.Context, tx pgx.Tx, req idempotency.ClaimRequest, deadline time.Time) (*txLease, *idempotency.Record, error) {
	claimedAt, rec, err := s.claimOn(ctx, tx, req, deadline)
	if err != nil || rec != nil {
		return nil, rec, err
	}
	// The wait budget was for the claim; the operation's own statements and
	// lock waits (row locks on a balance, say) must not inherit it.
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout TO DEFAULT; SET LOCAL statement_timeout TO DEFAULT"); err != nil {
		return nil, nil, Translate(fmt.Errorf("reset claim timeouts: %w", err))
	}
	return &txLease{s: s, tx: tx, ref: idempotency.Ref{Scope: req.Scope, Key: req.Key, ClaimedAt: claimedAt}}, nil, nil
}

// claimOn claims req's key on db, a transaction whose wait budget is set
// for the first attempt, until deadline: it returns the time of the row it
// inserted, or the completed record that holds the key, or an error
// (ErrInFlight when a holder kept the key for the whole wait).
func (s *Store) claimOn(ctx context.Context, db keydb.DBTX, req idempotency.ClaimRequest, deadline time.Time) (time.Time, *idempotency.Record, error) {
	q := s.queries(db)
	params := keydb.IdempotencyKeyClaimParams{
		Scope:          s.scope.arg(req.Scope),
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
				return time.Time{}, nil, idempotency.ErrInFlight
			}
			if _, err := db.Exec(ctx, waitBudget(left)); err != nil {
				return time.Time{}, nil, claimError(ctx, s.table, "set wait budget", err)
			}
		}
		rows, err := q.IdempotencyKeyClaim(ctx, params)
		if err != nil {
			return time.Time{}, nil, claimError(ctx, s.table, "claim", err)
		}
		if len(rows) == 0 {
			// The INSERT waited for a concurrent holder that then committed;
			// this statement's snapshot predates that commit. Read again.
			continue
		}
		row := rows[0]
		switch {
		case row.Claimed:
			return row.CreatedAt, nil, nil
		case row.Expired:
			// An expired key is absent: free it and claim again.
			if _, err := q.IdempotencyKeyDeleteIfExpired(ctx, keydb.IdempotencyKeyDeleteIfExpiredParams{
				Scope: s.scope.arg(req.Scope), IdempotencyKey: req.Key,
			}); err != nil {
				return time.Time{}, nil, claimError(ctx, s.table, "free expired key", err)
			}
			continue
		case row.Status != "completed":
			// Unreachable for the rows this package writes, which are never
			// committed as processing; kept for multi-step operations that
			// will hold a key processing across transactions.
			return time.Time{}, nil, idempotency.ErrInFlight
		default:
			rec, err := newRecord(row.Fingerprint, row.ResponseStatus, row.ResponseHeaders, row.ResponseBody, row.ResponsePieces, row.ResponseSize, row.CreatedAt, row.ExpiresAt, row.ReadAt)
			return time.Time{}, rec, err
		}
	}
	return time.Time{}, nil, fmt.Errorf("claim: key kept changing under %d attempts", claimAttempts)
}

// claimError translates a failure of a claim statement on table. A lock
// wait on a key row that ran out (lock_timeout, 55P03, or
// statement_timeout, 57014, when ctx itself has not ended) means that
// another request held the key for the whole wait budget: ErrInFlight,
// whether the INSERT or the DELETE of an expired row was waiting. Any
// other wait that ran out (a lock on the operation's own tables, a server
// too starved to finish in time) is not the key's holder, and is
// ErrUnavailable: a 202 "in progress" for a key nobody holds would be
// untrue.
func claimError(ctx context.Context, table, step string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "55P03" || (pgErr.Code == "57014" && ctx.Err() == nil)) && waitedForKey(pgErr, table) {
		return idempotency.ErrInFlight
	}
	return Translate(fmt.Errorf("%s: %w", step, err))
}

// waitedForKey reports whether a statement was cut short while it waited
// for a row of the key table (or of a partition of it named after it):
// PostgreSQL names the relation of such a wait in the error's context,
// "while inserting index tuple (0,1) in relation "idempotency_keys"".
func waitedForKey(err *pgconn.PgError, table string) bool {
	return strings.Contains(err.Where, ` in relation "`+table+`"`) || strings.Contains(err.Where, ` in relation "`+table+`_`)
}

// txLease is a claimed key and the open transaction the operation runs in.
type txLease struct {
	s     *Store
	tx    pgx.Tx
	ref   idempotency.Ref
	ended bool
}

func (l *txLease) Unit() pgx.Tx         { return l.tx }
func (l *txLease) Ref() idempotency.Ref { return l.ref }

func (l *txLease) Commit(ctx context.Context, resp idempotency.Response) error {
	return l.commit(ctx, resp, nil)
}

// commit stores resp, sends the queued writes of a deferred operation
// first if there are any, and commits.
func (l *txLease) commit(ctx context.Context, resp idempotency.Response, writes *pgx.Batch) error {
	if l.ended {
		return errEnded
	}
	l.ended = true
	if writes != nil && writes.Len() > 0 {
		if err := l.tx.SendBatch(ctx, writes).Close(); err != nil {
			_ = l.tx.Rollback(ctx)
			return Translate(fmt.Errorf("write: %w", err))
		}
	}
	if err := l.s.complete(ctx, l.tx, l.ref, resp); err != nil {
		_ = l.tx.Rollback(ctx)
		return err
	}
	if err := l.tx.Commit(ctx); err != nil {
		return Translate(fmt.Errorf("commit: %w", err))
	}
	return nil
}

func (l *txLease) Rollback(ctx context.Context) error {
	if l.ended {
		return nil
	}
	l.ended = true
	if err := l.tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return Translate(err)
	}
	return nil
}

var errEnded = errors.New("pgstore: lease already committed or rolled back")

// WritePiece implements idempotency.Lease: the piece is written in the
// claim's transaction, and commits with its record.
func (l *txLease) WritePiece(ctx context.Context, n int, p []byte) error {
	if l.ended {
		return errEnded
	}
	return l.s.writeClaimPiece(ctx, l.tx, busyOf(l.tx), l.ref, n, p)
}

// errBusy is what WritePiece answers while the claim's connection is busy:
// the operation is reading rows of its transaction as it writes its
// answer. Not now: a statement sent on a busy pgx connection would not
// only fail, it would end the rows being read (pgconn replaces their
// reader before it finds the connection locked).
var errBusy = fmt.Errorf("pgstore: the claim's transaction is busy: %w", errors.ErrUnsupported)

// errNoBusy is what WritePiece answers on a transaction whose connection
// cannot say whether it is busy (database/sql's): it takes no pieces, and
// the body stays in the record.
var errNoBusy = fmt.Errorf("pgstore: a claim on a database/sql transaction keeps its body in its record: %w", errors.ErrUnsupported)

// writeClaimPiece writes piece n of the body of the response that ref's
// claim, on db and not yet committed, will store; busy says whether db's
// connection is busy (nil: it cannot say).
func (s *Store) writeClaimPiece(ctx context.Context, db keydb.DBTX, busy func() bool, ref idempotency.Ref, n int, p []byte) error {
	switch {
	case n < 1 || n > math.MaxInt32:
		return fmt.Errorf("pgstore: a claim's pieces count from 1, got %d", n)
	case busy == nil:
		return errNoBusy
	case busy():
		return errBusy
	}
	if p == nil {
		p = []byte{} // an empty piece, not NULL
	}
	if err := s.queries(db).IdempotencyKeyWriteClaimPiece(ctx, keydb.IdempotencyKeyWriteClaimPieceParams{
		Scope:          s.scope.arg(ref.Scope),
		IdempotencyKey: ref.Key,
		KeyCreatedAt:   ref.ClaimedAt,
		N:              int32(n),
		Data:           p,
	}); err != nil {
		return Translate(fmt.Errorf("write piece %d of a key's body: %w", n, err))
	}
	return nil
}

// complete stores resp in the key row of ref, claimed on db and not yet
// committed; a body in pieces was written on db before
// (writeClaimPiece).
func (s *Store) complete(ctx context.Context, db keydb.DBTX, ref idempotency.Ref, resp idempotency.Response) error {
	status, headers, body, err := encodeResponse(resp)
	if err != nil {
		return err
	}
	if resp.Pieces > 0 {
		n, err := s.queries(db).IdempotencyKeyCompletePieces(ctx, keydb.IdempotencyKeyCompletePiecesParams{
			Scope:           s.scope.arg(ref.Scope),
			IdempotencyKey:  ref.Key,
			ResponseHeaders: headers,
			ResponseBody:    body,
			ResponsePieces:  int32(resp.Pieces), // encodeResponse bounds it
			ResponseSize:    resp.Size,
		})
		if err == nil && n != 1 {
			err = fmt.Errorf("completed %d rows, want 1", n)
		}
		if err != nil {
			return Translate(fmt.Errorf("store response: %w", err))
		}
		return nil
	}
	n, err := s.queries(db).IdempotencyKeyComplete(ctx, keydb.IdempotencyKeyCompleteParams{
		Scope:           s.scope.arg(ref.Scope),
		IdempotencyKey:  ref.Key,
		ResponseStatus:  pgtype.Int4{Int32: status, Valid: true},
		ResponseHeaders: headers,
		ResponseBody:    body,
	})
	if err == nil && n != 1 {
		err = fmt.Errorf("completed %d rows, want 1", n)
	}
	if err != nil {
		return Translate(fmt.Errorf("store response: %w", err))
	}
	return nil
}

// ReplaceProvisional replaces the provisional response (a long operation's
// 202) stored under ref's claim with final, in tx: the caller's own final
// writes and the response its key replays from then on commit together.
// It reports false, changing nothing, when the record is gone (purged, or
// claimed again after it expired) or no longer provisional.
func (s *Store) ReplaceProvisional(ctx context.Context, tx pgx.Tx, ref idempotency.Ref, final idempotency.Response) (bool, error) {
	return s.replace(ctx, tx, ref, http.StatusAccepted, final)
}

// Settle implements idempotency.Store: it replaces the held record
// stored under ref's claim with resp, in a statement of its own, sent
// with the settles and releases that arrive meanwhile as one transaction
// (see groupsettle.go).
func (s *Store) Settle(ctx context.Context, ref idempotency.Ref, resp idempotency.Response) (bool, error) {
	return s.settles.run(ctx, ref, &resp)
}

// replace replaces the response of status from stored under ref's claim,
// with the count and size of its body's pieces when it is in pieces; the
// pieces written beyond that count (all of them, for a body kept in the
// record) go in the same statement.
func (s *Store) replace(ctx context.Context, db keydb.DBTX, ref idempotency.Ref, from int, resp idempotency.Response) (bool, error) {
	status, headers, body, err := encodeResponse(resp)
	if err != nil {
		return false, err
	}
	if from == http.StatusAccepted && resp.Pieces <= 0 {
		// A 202 has no pieces to drop: the UPDATE alone.
		n, err := s.queries(db).IdempotencyKeyReplaceAccepted(ctx, keydb.IdempotencyKeyReplaceAcceptedParams{
			Scope:           s.scope.arg(ref.Scope),
			IdempotencyKey:  ref.Key,
			KeyCreatedAt:    ref.ClaimedAt,
			ResponseStatus:  pgtype.Int4{Int32: status, Valid: true},
			ResponseHeaders: headers,
			ResponseBody:    body,
		})
		if err != nil {
			return false, Translate(fmt.Errorf("replace the response of status %d: %w", from, err))
		}
		return n == 1, nil
	}
	n, err := s.queries(db).IdempotencyKeyReplaceProvisional(ctx, keydb.IdempotencyKeyReplaceProvisionalParams{
		Scope:             s.scope.arg(ref.Scope),
		IdempotencyKey:    ref.Key,
		KeyCreatedAt:      ref.ClaimedAt,
		ResponseStatus:    pgtype.Int4{Int32: status, Valid: true},
		ResponseHeaders:   headers,
		ResponseBody:      body,
		ResponsePieces:    int32(max(resp.Pieces, 0)),
		ResponseSize:      resp.Size,
		ProvisionalStatus: int32(from),
	})
	if err != nil {
		return false, Translate(fmt.Errorf("replace the response of status %d: %w", from, err))
	}
	return n == 1, nil
}

// Release implements idempotency.Store: it deletes the held record
// stored under ref's claim, freeing the key, and the pieces written for
// it, merged with concurrent settles and releases as Settle is.
func (s *Store) Release(ctx context.Context, ref idempotency.Ref) (bool, error) {
	return s.settles.run(ctx, ref, nil)
}

// release deletes the held record stored under ref's claim, on db.
func (s *Store) release(ctx context.Context, db keydb.DBTX, ref idempotency.Ref) (bool, error) {
	n, err := s.queries(db).IdempotencyKeyRelease(ctx, keydb.IdempotencyKeyReleaseParams{
		Scope:          s.scope.arg(ref.Scope),
		IdempotencyKey: ref.Key,
		KeyCreatedAt:   ref.ClaimedAt,
	})
	if err != nil {
		return false, Translate(fmt.Errorf("release a held key: %w", err))
	}
	return n == 1, nil
}

// PurgeExpired implements idempotency.Store: it deletes expired keys in
// batches of at most batch rows until none is left, and returns how many
// it deleted. Each batch is its own short statement, so a large backlog
// never becomes one huge DELETE holding locks and bloating WAL. A session
// advisory lock, held on the connection that runs the batches, lets only
// one replica purge at a time; the others get idempotency.ErrCleanupBusy.
// If that connection dies, PostgreSQL releases the lock with it.
func (s *Store) PurgeExpired(ctx context.Context, batch int) (int64, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return 0, Translate(fmt.Errorf("purge: acquire connection: %w", err))
	}
	defer conn.Release()
	lock := CleanupLock(s.table)
	var locked bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", lock).Scan(&locked); err != nil {
		return 0, Translate(fmt.Errorf("purge: take cleanup lock: %w", err))
	}
	if !locked {
		return 0, idempotency.ErrCleanupBusy
	}
	defer func() {
		if _, err := conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", lock); err != nil {
			// The lock must not outlive this run on a pooled connection.
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
		}
	}()

	parts, err := s.partitions(ctx, conn)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, part := range parts {
		q := part.queries(replanned{conn})
		for {
			n, err := q.IdempotencyKeyPurgeExpired(ctx, int32(batch))
			total += n
			if err != nil {
				return total, Translate(fmt.Errorf("purge expired keys: %w", err))
			}
			if n < int64(batch) {
				break
			}
			if err := ctx.Err(); err != nil {
				return total, err
			}
		}
	}
	return total, s.sweepPieces(ctx, conn, batch)
}

// sweepPieces deletes, batch by batch, the pieces that no record needs any
// more: those of the records just purged, and any other left beside a
// record that is gone or was settled with fewer (see
// IdempotencyKeySweepPieces). It runs on the key table as a whole, not per
// partition: the pieces table is one table, and a partition's statements
// are rewritten by the partition's name, which would rename it too.
// Nothing is added to the key purge's statements, so purging keys whose
// bodies were never in pieces costs what it did.
func (s *Store) sweepPieces(ctx context.Context, conn keydb.DBTX, batch int) error {
	q := s.queries(replanned{conn})
	for {
		n, err := q.IdempotencyKeySweepPieces(ctx, int32(batch))
		if err != nil {
			return Translate(fmt.Errorf("sweep the pieces of purged keys: %w", err))
		}
		if n < int64(batch) {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// WritePiece implements idempotency.Store: it stores piece n of the body
// of the held record under ref's claim, or replaces it, in a statement of
// its own whose commit is durable, and reports false, writing nothing,
// when that record is gone or no longer held. The record's row is locked
// while the piece is written, so that no settle or release passes it.
func (s *Store) WritePiece(ctx context.Context, ref idempotency.Ref, n int, p []byte) (bool, error) {
	if n < 0 || n > math.MaxInt32 {
		return false, nil
	}
	if p == nil {
		p = []byte{} // an empty piece, not NULL
	}
	if n == 0 {
		// The first piece, written again while the body passes: the
		// holder is alive (see the contract).
		if _, err := s.queries(s.pool).IdempotencyKeyRenewHold(ctx, keydb.IdempotencyKeyRenewHoldParams{
			Scope:          s.scope.arg(ref.Scope),
			IdempotencyKey: ref.Key,
			KeyCreatedAt:   ref.ClaimedAt,
		}); err != nil {
			return false, Translate(fmt.Errorf("renew a held key's lease: %w", err))
		}
	}
	rows, err := s.queries(s.pool).IdempotencyKeyWritePiece(ctx, keydb.IdempotencyKeyWritePieceParams{
		Scope:          s.scope.arg(ref.Scope),
		IdempotencyKey: ref.Key,
		KeyCreatedAt:   ref.ClaimedAt,
		N:              int32(n),
		Data:           p,
	})
	if err != nil {
		return false, Translate(fmt.Errorf("write piece %d of a held key's body: %w", n, err))
	}
	return rows == 1, nil
}

// ReadPiece implements idempotency.Store: piece n of the body of the
// record under ref's claim, while it is held or once it is settled with
// more than n pieces; nil when there is none.
func (s *Store) ReadPiece(ctx context.Context, ref idempotency.Ref, n int) ([]byte, error) {
	if n < 0 || n > math.MaxInt32 {
		return nil, nil
	}
	data, err := s.queries(s.pool).IdempotencyKeyReadPiece(ctx, keydb.IdempotencyKeyReadPieceParams{
		Scope:          s.scope.arg(ref.Scope),
		IdempotencyKey: ref.Key,
		KeyCreatedAt:   ref.ClaimedAt,
		N:              int32(n),
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, Translate(fmt.Errorf("read piece %d of a key's body: %w", n, err))
	case data == nil:
		return []byte{}, nil // an empty piece is a piece
	}
	return data, nil
}

func init() {
	access.Pool = func(s any) *pgxpool.Pool { return s.(*Store).pool }
	access.Table = func(s any) access.Queries { return s.(*Store).queries }
	access.ScopeArg = func(s any, scope string) ([]byte, error) {
		t := s.(*Store).scope
		return t.arg(scope), t.check(scope)
	}
	access.ScopeRead = func(s any, b []byte) string { return s.(*Store).scope.read(b) }
	access.Settle = func(ctx context.Context, s any, db keydb.DBTX, ref idempotency.Ref, resp idempotency.Response) (bool, error) {
		return s.(*Store).replace(ctx, db, ref, idempotency.StatusHeld, resp)
	}
	access.Release = func(ctx context.Context, s any, db keydb.DBTX, ref idempotency.Ref) (bool, error) {
		return s.(*Store).release(ctx, db, ref)
	}
	access.Response = decodeResponse
	access.Partitions = func(ctx context.Context, s any) ([]access.Queries, error) {
		store := s.(*Store)
		parts, err := store.partitions(ctx, store.pool)
		if err != nil {
			return nil, err
		}
		out := make([]access.Queries, len(parts))
		for i, p := range parts {
			out[i] = p.queries
		}
		return out, nil
	}
}

// keyTable is the key table, or one partition of it, to run statements on.
type keyTable struct {
	name    string // quoted as an identifier, schema-qualified if a partition
	queries func(keydb.DBTX) *keydb.Queries
}

// partitions returns each partition of the key table (or the table itself
// when it is not partitioned): the operator's statements (purge,
// statistics, stuck keys) run partition by partition, each reading one
// partition's indexes, as they would have to shard by shard on a database
// sharded by tenant. A partition's name comes from the catalog, where
// whoever created it chose it, so it goes into SQL quoted.
func (s *Store) partitions(ctx context.Context, db keydb.DBTX) ([]keyTable, error) {
	rows, err := db.Query(ctx, `SELECT n.nspname, c.relname FROM pg_partition_tree($1::regclass) t
		JOIN pg_class c ON c.oid = t.relid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE t.isleaf AND t.level > 0 ORDER BY n.nspname, c.relname`, s.table)
	if err != nil {
		return nil, Translate(fmt.Errorf("list the key table's partitions: %w", err))
	}
	names, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (string, error) {
		var schema, name string
		err := row.Scan(&schema, &name)
		return pgx.Identifier{schema, name}.Sanitize(), err
	})
	if err != nil {
		return nil, Translate(fmt.Errorf("list the key table's partitions: %w", err))
	}
	if len(names) == 0 {
		return []keyTable{{name: pgx.Identifier{s.table}.Sanitize(), queries: s.queries}}, nil
	}
	out := make([]keyTable, 0, len(names))
	for _, name := range names {
		v, _ := s.partitionRewriters.LoadOrStore(name, &rewriter{to: name, scope: s.scope})
		r := v.(*rewriter)
		out = append(out, keyTable{name: name, queries: func(d keydb.DBTX) *keydb.Queries { return keydb.New(rewritten{d, r}) }})
	}
	return out, nil
}

// replanned runs statements unprepared (one round trip still, as pgx's
// QueryExecModeExec), so that PostgreSQL plans each run for the table as it
// is then. Only for statements whose cached plan would go wrong as the
// table grows and that run rarely enough for planning to cost nothing: the
// purge's batches, the statistics of a metrics scrape
// (TestStatementsProbeTheIndex).
type replanned struct{ keydb.DBTX }

func (r replanned) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return r.DBTX.Exec(ctx, sql, append([]any{pgx.QueryExecModeExec}, args...)...)
}

func (r replanned) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return r.DBTX.QueryRow(ctx, sql, append([]any{pgx.QueryExecModeExec}, args...)...)
}

// KeyStats implements idempotency.Store.
func (s *Store) KeyStats(ctx context.Context) (idempotency.Stats, error) {
	// Unprepared: a statement without parameters keeps the plan of its
	// first run on a connection, made perhaps on an empty table.
	parts, err := s.partitions(ctx, s.pool)
	if err != nil {
		return idempotency.Stats{}, err
	}
	var st idempotency.Stats
	for _, part := range parts {
		row, err := part.queries(replanned{s.pool}).IdempotencyKeyStats(ctx, part.name)
		if err != nil {
			return idempotency.Stats{}, Translate(fmt.Errorf("key stats: %w", err))
		}
		st.Processing += row.Processing
		st.Completed += max(row.Total-row.Processing, 0)
		st.TableBytes += row.TableBytes
		st.OldestProcessingAge = max(st.OldestProcessingAge, seconds(row.OldestProcessingAgeSeconds))
		st.CleanupLag = max(st.CleanupLag, seconds(row.CleanupLagSeconds))
		st.Held += row.HeldRunning
		st.Unknown += row.HeldUnknown
	}
	// The pieces table is one table whatever the key table's partitions:
	// read on the key table's name, not per partition (see sweepPieces).
	if st.PiecesBytes, err = s.queries(replanned{s.pool}).IdempotencyKeyPiecesBytes(ctx); err != nil {
		return idempotency.Stats{}, Translate(fmt.Errorf("pieces table size: %w", err))
	}
	return st, nil
}

func seconds(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }

// Translate maps driver errors that mean "the database is not there right
// now" to idempotency.ErrUnavailable (503 with Retry-After, and a retry
// with the same key), keeping the original in the chain for logs. The
// store's own errors are translated already; an application may translate
// its statements' errors with it too.
func Translate(err error) error {
	if err == nil {
		return nil
	}
	if unavailable(err) {
		return fmt.Errorf("%w: %w", idempotency.ErrUnavailable, err)
	}
	return err
}

func unavailable(err error) bool {
	var netErr net.Error
	var connectErr *pgconn.ConnectError
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, context.DeadlineExceeded),
		// The connection died mid-statement (the server crashed or was
		// shut down): what it was doing is rolled back or, at COMMIT,
		// unknown; a retry with the same key settles either way.
		errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF),
		errors.As(err, &netErr), errors.As(err, &connectErr),
		pgconn.Timeout(err), pgconn.SafeToRetry(err):
		return true
	case errors.As(err, &pgErr):
		return unavailableCode(pgErr.Code)
	}
	return false
}

// unavailableCode reports whether a statement that failed with this
// SQLSTATE may succeed if sent again a little later, having changed
// nothing: the database could not serve it now, whatever it asked.
func unavailableCode(code string) bool {
	switch code[:2] {
	case "08", // connection exception
		"53": // insufficient resources: too many connections, disk full, out of memory
		return true
	}
	switch code {
	case "57P01", "57P02", "57P03", // the server is shutting down, or cannot accept connections yet
		"25006", // read-only: a standby (a demoted primary), or a full disk's protection mode
		"57014", // canceled: statement_timeout, or a cancel request
		"55P03", // lock_timeout ran out (a wait for a key's holder is ErrInFlight: see claimError)
		"40001", // serialization failure
		"40P01", // deadlock: PostgreSQL rolled one of the two back
		"58030": // I/O error
		return true
	}
	return false
}
