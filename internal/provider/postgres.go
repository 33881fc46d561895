package provider

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PostgresStore keeps charges in the table fakeprovider_charges.
//
// It uses plain pgx queries and creates its own table rather than going
// through Oncekey's sqlc queries and migrations: the sandbox is a test
// double standing in for a third party, and its schema is no part of the
// product's. The table's prefixed name lets it live in Oncekey's database.
type PostgresStore struct {
	pool *pgxpool.Pool
}

// schemaLock is the transaction-scoped advisory lock key under which the
// table is created: two CREATE TABLE IF NOT EXISTS racing on one database
// can still fail on the catalog's unique index, so starters take turns.
const schemaLock = "fakeprovider_charges schema"

const createTable = `
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
`

// NewPostgresStore creates the table if it is missing and returns a store
// on pool. Any number of processes may call it at once.
func NewPostgresStore(ctx context.Context, pool *pgxpool.Pool) (*PostgresStore, error) {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, schemaLock); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, createTable)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("provider: create table fakeprovider_charges: %w", err)
	}
	return &PostgresStore{pool: pool}, nil
}

const chargeColumns = `idempotency_key, fingerprint, id, status, decline_reason, amount, currency, reference, created_at`

// Insert implements Store. It is two statements on purpose: a single
// INSERT … ON CONFLICT DO NOTHING … RETURNING combined with a SELECT in one
// statement reads from that statement's snapshot, which may predate the
// concurrent insert it conflicted with, and so find no row at all. The
// separate SELECT gets a fresh snapshot (READ COMMITTED) that includes it;
// rows are never deleted, so it cannot vanish in between.
func (s *PostgresStore) Insert(ctx context.Context, rec Record) (Record, bool, error) {
	c := rec.Charge
	tag, err := s.pool.Exec(ctx, `
		INSERT INTO fakeprovider_charges (`+chargeColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
		ON CONFLICT (idempotency_key) DO NOTHING`,
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
	rows, err := s.pool.Query(ctx, `SELECT `+chargeColumns+` FROM fakeprovider_charges WHERE idempotency_key = $1`, key)
	if err != nil {
		return Record{}, fmt.Errorf("provider: get charge: %w", err)
	}
	rec, err := pgx.CollectExactlyOneRow(rows, scanRecord)
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, ErrNotFound
	}
	if err != nil {
		return Record{}, fmt.Errorf("provider: get charge: %w", err)
	}
	return rec, nil
}

// ListByReference implements Store. The id is compared in the C collation
// so the tie-break is byte order, the same as the memory store's.
func (s *PostgresStore) ListByReference(ctx context.Context, reference string) ([]Charge, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT `+chargeColumns+` FROM fakeprovider_charges
		WHERE reference = $1
		ORDER BY created_at, id COLLATE "C"`, reference)
	if err != nil {
		return nil, fmt.Errorf("provider: list charges: %w", err)
	}
	recs, err := pgx.CollectRows(rows, scanRecord)
	if err != nil {
		return nil, fmt.Errorf("provider: list charges: %w", err)
	}
	list := make([]Charge, 0, len(recs))
	for _, rec := range recs {
		list = append(list, rec.Charge)
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
