package pgstore

import (
	"context"
	"database/sql"
	"fmt"
	"reflect"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore/internal/keydb"
)

// Join claims req's key inside tx, a transaction the caller opened and
// will commit or roll back itself: the key row then commits or rolls back
// with the caller's own writes, as one transaction. It answers as Claim
// does (a lease, a record, or ErrInFlight after req.Wait), and leaves tx
// usable whatever it answers: the claim runs under a savepoint, so a claim
// that waited in vain or found a record is undone without aborting tx.
//
// The lease's Commit stores the response in tx and does not commit it; the
// caller commits tx next, and should answer the client only after that
// commit succeeds. Its Rollback undoes the claim and every write made in
// tx since the claim; the caller's writes from before the claim stay, for
// the caller to commit or roll back. The lease's Unit is tx.
//
// Join suits a handler that opens its own transaction, without the
// middleware, which commits before it answers (Store.Claim).
func (s *Store) Join(ctx context.Context, tx pgx.Tx, req idempotency.ClaimRequest) (idempotency.Lease[pgx.Tx], *idempotency.Record, error) {
	return join(ctx, s, tx, tx, req)
}

// JoinSQL is Join for a database/sql transaction on pgx's driver
// (github.com/jackc/pgx/v5/stdlib, as stdlib.OpenDBFromPool opens it).
func (s *Store) JoinSQL(ctx context.Context, tx *sql.Tx, req idempotency.ClaimRequest) (idempotency.Lease[*sql.Tx], *idempotency.Record, error) {
	return join(ctx, s, sqlTx{tx}, tx, req)
}

// joinSavepoint marks where a joined claim began, for its Rollback.
const joinSavepoint = "pgstore_claim"

func join[U any](ctx context.Context, s *Store, db keydb.DBTX, unit U, req idempotency.ClaimRequest) (idempotency.Lease[U], *idempotency.Record, error) {
	deadline := time.Now().Add(req.Wait)
	if err := s.claimable(ctx, req.Scope); err != nil {
		return nil, nil, err
	}
	if _, err := db.Exec(ctx, "SAVEPOINT "+joinSavepoint); err != nil {
		return nil, nil, Translate(fmt.Errorf("savepoint: %w", err))
	}
	undo := func() { _ = undoJoin(ctx, db) }
	// The caller's own timeouts, to restore once the key is claimed. The
	// caller's commit stores the outcome too: it is made durable (set
	// after the savepoint, so a claim undone leaves the caller's setting).
	var lockTimeout, statementTimeout string
	ms := waitMillis(req.Wait)
	if err := db.QueryRow(ctx, `SELECT current_setting('lock_timeout'), current_setting('statement_timeout'),
		set_config('lock_timeout', $1, true), set_config('statement_timeout', $2, true), `+durableCommit,
		strconv.FormatInt(ms, 10), strconv.FormatInt(ms+statementSlack.Milliseconds(), 10),
	).Scan(&lockTimeout, &statementTimeout, new(string), new(string), new(string)); err != nil {
		undo()
		return nil, nil, Translate(fmt.Errorf("set wait budget: %w", err))
	}
	claimedAt, rec, err := s.claimOn(ctx, db, req, deadline)
	if err != nil || rec != nil {
		undo()
		return nil, rec, err
	}
	if _, err := db.Exec(ctx, "SELECT set_config('lock_timeout', $1, true), set_config('statement_timeout', $2, true)", lockTimeout, statementTimeout); err != nil {
		undo()
		return nil, nil, Translate(fmt.Errorf("restore timeouts: %w", err))
	}
	return &joinedLease[U]{s: s, db: db, unit: unit, ref: idempotency.Ref{Scope: req.Scope, Key: req.Key, ClaimedAt: claimedAt}}, nil, nil
}

// busyOf is how a lease on db learns that its connection is busy (rows
// of its transaction still being read), for WritePiece: a pgx
// transaction says so; of any other (database/sql's) nothing can be
// learned, and nil means the lease takes no pieces.
func busyOf(db keydb.DBTX) func() bool {
	if tx, ok := db.(pgx.Tx); ok {
		return func() bool { return tx.Conn().PgConn().IsBusy() }
	}
	return nil
}

// joinedLease is a key claimed in the caller's transaction.
type joinedLease[U any] struct {
	s     *Store
	db    keydb.DBTX
	unit  U
	ref   idempotency.Ref
	ended bool
}

func (l *joinedLease[U]) Unit() U              { return l.unit }
func (l *joinedLease[U]) Ref() idempotency.Ref { return l.ref }

// WritePiece implements idempotency.Lease: the piece is written in the
// caller's transaction, and commits with the record.
func (l *joinedLease[U]) WritePiece(ctx context.Context, n int, p []byte) error {
	if l.ended {
		return errEnded
	}
	return l.s.writeClaimPiece(ctx, l.db, busyOf(l.db), l.ref, n, p)
}

// Commit stores resp in the caller's transaction, which the caller then
// commits.
func (l *joinedLease[U]) Commit(ctx context.Context, resp idempotency.Response) error {
	if l.ended {
		return errEnded
	}
	if err := l.s.complete(ctx, l.db, l.ref, resp); err != nil {
		_ = l.Rollback(ctx)
		return err
	}
	if _, err := l.db.Exec(ctx, "RELEASE SAVEPOINT "+joinSavepoint); err != nil {
		_ = l.Rollback(ctx)
		return Translate(fmt.Errorf("release savepoint: %w", err))
	}
	l.ended = true
	return nil
}

// Rollback undoes the claim and what was written in the caller's
// transaction since; the transaction stays open.
func (l *joinedLease[U]) Rollback(ctx context.Context) error {
	if l.ended {
		return nil
	}
	l.ended = true
	return undoJoin(ctx, l.db)
}

// undoJoin returns the caller's transaction on db to where the joined claim
// began: the key row, the writes since and the claim's wait budget (a SET
// LOCAL after a savepoint ends with it) are undone; the transaction stays
// open. It runs even when ctx has ended, as a rollback must.
func undoJoin(ctx context.Context, db keydb.DBTX) error {
	_, err := db.Exec(context.WithoutCancel(ctx), "ROLLBACK TO SAVEPOINT "+joinSavepoint+"; RELEASE SAVEPOINT "+joinSavepoint)
	if err != nil {
		return Translate(fmt.Errorf("rollback to savepoint: %w", err))
	}
	return nil
}

// sqlTx runs pgstore's statements in a database/sql transaction on pgx's
// driver, which passes the arguments to pgx as they are and returns pgx's
// errors, so that they read as they do on a pgx.Tx.
type sqlTx struct{ tx *sql.Tx }

func (d sqlTx) Exec(ctx context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	res, err := d.tx.ExecContext(ctx, query, args...)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	// Only the count is read (RowsAffected), whatever the verb.
	return pgconn.NewCommandTag("UPDATE " + strconv.FormatInt(n, 10)), nil
}

func (d sqlTx) Query(ctx context.Context, query string, args ...any) (pgx.Rows, error) {
	rows, err := d.tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return &sqlRows{rows: rows}, nil
}

func (d sqlTx) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	return d.tx.QueryRowContext(ctx, query, args...)
}

// sqlRows is the part of pgx.Rows that sqlc's generated code uses, over
// database/sql's rows.
type sqlRows struct {
	rows *sql.Rows
	pgx.Rows
}

func (r *sqlRows) Next() bool { return r.rows.Next() }
func (r *sqlRows) Err() error { return r.rows.Err() }
func (r *sqlRows) Close()     { _ = r.rows.Close() }

// Scan reads a row as pgx would: a NULL leaves the zero value (database/sql
// refuses to store one in a json.RawMessage or a time.Time), and a value
// goes to a sql.Scanner (pgtype's types are) or to a destination of its
// type or one it converts to.
func (r *sqlRows) Scan(dest ...any) error {
	values := make([]any, len(dest))
	ptrs := make([]any, len(dest))
	for i := range values {
		ptrs[i] = &values[i]
	}
	if err := r.rows.Scan(ptrs...); err != nil {
		return err
	}
	for i, v := range values {
		if err := assign(dest[i], v); err != nil {
			return fmt.Errorf("column %d: %w", i, err)
		}
	}
	return nil
}

// assign stores the driver's value v in dest, a pointer.
func assign(dest, v any) error {
	if s, ok := dest.(sql.Scanner); ok {
		return s.Scan(v)
	}
	d := reflect.ValueOf(dest)
	if d.Kind() != reflect.Pointer || d.IsNil() {
		return fmt.Errorf("destination %T is not a pointer", dest)
	}
	target := d.Elem()
	if v == nil {
		target.SetZero()
		return nil
	}
	if target.Kind() == reflect.Pointer { // a nullable column: *time.Time
		p := reflect.New(target.Type().Elem())
		if err := assign(p.Interface(), v); err != nil {
			return err
		}
		target.Set(p)
		return nil
	}
	val := reflect.ValueOf(v)
	switch {
	case val.Type().AssignableTo(target.Type()):
		target.Set(val)
	case val.Type().ConvertibleTo(target.Type()) && (val.Kind() == target.Kind() || numeric(val.Kind()) && numeric(target.Kind()) || textual(val.Type()) && textual(target.Type())):
		target.Set(val.Convert(target.Type())) // an int8 into an int32, json as text into a json.RawMessage
	default:
		return fmt.Errorf("cannot store %T in %T", v, dest)
	}
	return nil
}

func (r *sqlRows) CommandTag() pgconn.CommandTag { return pgconn.CommandTag{} }

func numeric(k reflect.Kind) bool { return k >= reflect.Int && k <= reflect.Float64 }

// textual is a string or a byte slice.
func textual(t reflect.Type) bool {
	return t.Kind() == reflect.String || t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8
}
