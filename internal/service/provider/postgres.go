package provider

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PostgresStore keeps charges in the table fakeprovider_charges and refunds
// in fakeprovider_refunds.
//
// It uses plain pgx queries and creates its own tables rather than going
// through Oncekey's sqlc queries and migrations: the sandbox is a test
// double standing in for a third party, and its schema is no part of the
// product's. The tables' prefixed names let them live in Oncekey's database.
type PostgresStore struct {
	pool *pgxpool.Pool
}

// schemaLock is the transaction-scoped advisory lock key under which the
// tables are created: two CREATE TABLE IF NOT EXISTS racing on one database
// can still fail on the catalog's unique index, so starters take turns. It
// keeps the name it had when there was one table, so that an older and a
// newer sandbox starting together still take turns.
const schemaLock = "fakeprovider_charges schema"

// createTables makes both tables. A database made before refunds existed
// has the charges table already; the refunds table is simply added to it.
// A refund's charge_id references the charge, and is indexed for the sum
// InsertRefund takes under the charge's lock.
const createTables = `
CREATE TABLE IF NOT EXISTS fakeprovider_charges (
	idempotency_key text PRIMARY KEY,
	fingerprint     text NOT NULL,
	id              text NOT NULL UNIQUE,
	status          text NOT NULL CHECK (status IN ('succeeded', 'declined')),
	decline_reason  text NOT NULL DEFAULT '',
	amount          bigint NOT NULL CHECK (amount > 0),
	currency        text NOT NULL,
	reference       text NOT NULL,
	created_at      timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS fakeprovider_charges_reference_idx
	ON fakeprovider_charges (reference, created_at);
CREATE TABLE IF NOT EXISTS fakeprovider_refunds (
	idempotency_key text PRIMARY KEY,
	fingerprint     text NOT NULL,
	id              text NOT NULL UNIQUE,
	status          text NOT NULL CHECK (status IN ('succeeded', 'declined')),
	decline_reason  text NOT NULL DEFAULT '',
	charge_id       text NOT NULL REFERENCES fakeprovider_charges (id),
	amount          bigint NOT NULL CHECK (amount > 0),
	currency        text NOT NULL,
	reference       text NOT NULL,
	created_at      timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS fakeprovider_refunds_reference_idx
	ON fakeprovider_refunds (reference, created_at);
CREATE INDEX IF NOT EXISTS fakeprovider_refunds_charge_id_idx
	ON fakeprovider_refunds (charge_id);
`

// NewPostgresStore creates the tables if they are missing and returns a
// store on pool. Any number of processes may call it at once.
func NewPostgresStore(ctx context.Context, pool *pgxpool.Pool) (*PostgresStore, error) {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, schemaLock); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, createTables)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("provider: create tables fakeprovider_charges and fakeprovider_refunds: %w", err)
	}
	return &PostgresStore{pool: pool}, nil
}

const (
	chargeColumns = `idempotency_key, fingerprint, id, status, decline_reason, amount, currency, reference, created_at`
	refundColumns = `idempotency_key, fingerprint, id, status, decline_reason, charge_id, amount, currency, reference, created_at`

	selectCharge = `SELECT ` + chargeColumns + ` FROM fakeprovider_charges WHERE idempotency_key = $1`
	selectRefund = `SELECT ` + refundColumns + ` FROM fakeprovider_refunds WHERE idempotency_key = $1`
	listCharges  = `SELECT ` + chargeColumns + ` FROM fakeprovider_charges WHERE reference = $1 ORDER BY created_at, id COLLATE "C"`
	listRefunds  = `SELECT ` + refundColumns + ` FROM fakeprovider_refunds WHERE reference = $1 ORDER BY created_at, id COLLATE "C"`
	insertRefund = `INSERT INTO fakeprovider_refunds (` + refundColumns + `) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT (idempotency_key) DO NOTHING`
	lockCharge   = `SELECT id, status, amount, currency FROM fakeprovider_charges WHERE id = $1 FOR UPDATE`
	sumRefunded  = `SELECT coalesce(sum(amount), 0) FROM fakeprovider_refunds WHERE charge_id = $1 AND status = 'succeeded'`
	insertCharge = `INSERT INTO fakeprovider_charges (` + chargeColumns + `) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (idempotency_key) DO NOTHING`
)

// querier is what the reads need of a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Insert implements Store. It is two statements on purpose: a single
// INSERT … ON CONFLICT DO NOTHING … RETURNING combined with a SELECT in one
// statement reads from that statement's snapshot, which may predate the
// concurrent insert it conflicted with, and so find no row at all. The
// separate SELECT gets a fresh snapshot (READ COMMITTED) that includes it;
// rows are never deleted, so it cannot vanish in between.
func (s *PostgresStore) Insert(ctx context.Context, rec Record) (Record, bool, error) {
	c := rec.Charge
	tag, err := s.pool.Exec(ctx, insertCharge,
		rec.Key, rec.Fingerprint, c.ID, c.Status, c.DeclineReason, c.Amount, c.Currency, c.Reference, c.CreatedAt)
	if err != nil {
		return Record{}, false, fmt.Errorf("provider: insert charge: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return rec, true, nil
	}
	old, err := s.Get(ctx, rec.Key)
	if err != nil {
		return Record{}, false, err
	}
	return old, false, nil
}

// Get implements Store.
func (s *PostgresStore) Get(ctx context.Context, key string) (Record, error) {
	return getOne(ctx, s.pool, "charge", selectCharge, key, scanRecord)
}

// ListByReference implements Store. The id is compared in the C collation
// so the tie-break is byte order, the same as the memory store's.
func (s *PostgresStore) ListByReference(ctx context.Context, reference string) ([]Charge, error) {
	return listAll(ctx, s.pool, "charges", listCharges, reference, func(row pgx.CollectableRow) (Charge, error) {
		rec, err := scanRecord(row)
		return rec.Charge, err
	})
}

// InsertRefund implements Store in one READ COMMITTED transaction:
//
//  1. the key's refund, if it has one, is the answer (a replay);
//  2. the charge's row is locked FOR UPDATE, which queues every refund of
//     that charge behind this one until it commits;
//  3. the key is looked up again, since a request with the same key may
//     have committed while this one waited for the lock: without this, its
//     replay would be refused as exceeding the charge it used up itself;
//  4. the charge's succeeded refunds are summed (each statement sees what
//     committed before it, so the sum includes every refund the lock
//     queued this one behind) and checkRefundable decides;
//  5. the refund is inserted ON CONFLICT DO NOTHING, as a charge is: a
//     request with the key but another charge_id is not queued behind the
//     same lock, and if it got in first, its refund is the answer.
func (s *PostgresStore) InsertRefund(ctx context.Context, rec RefundRecord) (RefundRecord, bool, error) {
	var (
		out      RefundRecord
		inserted bool
	)
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		old, err := getRefund(ctx, tx, rec.Key)
		if !errors.Is(err, ErrNotFound) {
			out = old
			return err
		}
		var ch Charge
		err = tx.QueryRow(ctx, lockCharge, rec.Refund.ChargeID).Scan(&ch.ID, &ch.Status, &ch.Amount, &ch.Currency)
		if errors.Is(err, pgx.ErrNoRows) {
			return chargeNotFound(rec.Refund.ChargeID)
		}
		if err != nil {
			return fmt.Errorf("provider: lock charge: %w", err)
		}
		old, err = getRefund(ctx, tx, rec.Key)
		if !errors.Is(err, ErrNotFound) {
			out = old
			return err
		}
		var refunded int64
		if err := tx.QueryRow(ctx, sumRefunded, ch.ID).Scan(&refunded); err != nil {
			return fmt.Errorf("provider: sum refunds: %w", err)
		}
		if err := checkRefundable(ch, refunded, rec.Refund.Amount); err != nil {
			return err
		}
		rec.Refund.Currency = ch.Currency
		r := rec.Refund
		tag, err := tx.Exec(ctx, insertRefund,
			rec.Key, rec.Fingerprint, r.ID, r.Status, r.DeclineReason, r.ChargeID, r.Amount, r.Currency, r.Reference, r.CreatedAt)
		if err != nil {
			return fmt.Errorf("provider: insert refund: %w", err)
		}
		if tag.RowsAffected() == 1 {
			out, inserted = rec, true
			return nil
		}
		out, err = getRefund(ctx, tx, rec.Key)
		return err
	})
	if err != nil {
		return RefundRecord{}, false, err
	}
	return out, inserted, nil
}

// GetRefund implements Store.
func (s *PostgresStore) GetRefund(ctx context.Context, key string) (RefundRecord, error) {
	return getRefund(ctx, s.pool, key)
}

func getRefund(ctx context.Context, q querier, key string) (RefundRecord, error) {
	return getOne(ctx, q, "refund", selectRefund, key, scanRefundRecord)
}

// ListRefundsByReference implements Store, in ListByReference's order.
func (s *PostgresStore) ListRefundsByReference(ctx context.Context, reference string) ([]Refund, error) {
	return listAll(ctx, s.pool, "refunds", listRefunds, reference, func(row pgx.CollectableRow) (Refund, error) {
		rec, err := scanRefundRecord(row)
		return rec.Refund, err
	})
}

// getOne runs query, which selects at most one row by key, and scans it;
// ErrNotFound when there is none. noun names what is read in errors.
func getOne[R any](ctx context.Context, q querier, noun, query, key string, scan pgx.RowToFunc[R]) (R, error) {
	var zero R
	rows, err := q.Query(ctx, query, key)
	if err != nil {
		return zero, fmt.Errorf("provider: get %s: %w", noun, err)
	}
	rec, err := pgx.CollectExactlyOneRow(rows, scan)
	if errors.Is(err, pgx.ErrNoRows) {
		return zero, ErrNotFound
	}
	if err != nil {
		return zero, fmt.Errorf("provider: get %s: %w", noun, err)
	}
	return rec, nil
}

// listAll runs query with arg and scans every row; an empty, non-nil slice
// when there are none. noun names what is read in errors.
func listAll[T any](ctx context.Context, q querier, noun, query, arg string, scan pgx.RowToFunc[T]) ([]T, error) {
	rows, err := q.Query(ctx, query, arg)
	if err != nil {
		return nil, fmt.Errorf("provider: list %s: %w", noun, err)
	}
	list, err := pgx.CollectRows(rows, scan)
	if err != nil {
		return nil, fmt.Errorf("provider: list %s: %w", noun, err)
	}
	if list == nil {
		list = []T{}
	}
	return list, nil
}

func scanRecord(row pgx.CollectableRow) (Record, error) {
	var rec Record
	c := &rec.Charge
	err := row.Scan(&rec.Key, &rec.Fingerprint, &c.ID, &c.Status, &c.DeclineReason, &c.Amount, &c.Currency, &c.Reference, &c.CreatedAt)
	c.CreatedAt = c.CreatedAt.UTC()
	return rec, err
}

func scanRefundRecord(row pgx.CollectableRow) (RefundRecord, error) {
	var rec RefundRecord
	r := &rec.Refund
	err := row.Scan(&rec.Key, &rec.Fingerprint, &r.ID, &r.Status, &r.DeclineReason, &r.ChargeID, &r.Amount, &r.Currency, &r.Reference, &r.CreatedAt)
	r.CreatedAt = r.CreatedAt.UTC()
	return rec, err
}
