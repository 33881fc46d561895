package postgres

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/gen/db"
	"github.com/oncekey/oncekey/internal/ledger"
)

// Book implements ledger.Repository. The balance change and the entry are
// one unit of work, so a balance never moves without its entry: inside an
// idempotency lease they join its transaction and commit with the stored
// response or not at all; outside one they get a transaction of their own.
//
// Concurrent bookings of an account serialise on its bonus_balances row,
// which BonusCredit and BonusDebit lock until the transaction ends. A debit
// the balance does not cover updates no row, so it writes nothing and takes
// no lock: the 422 the middleware then stores commits no ledger change.
// Any other error aborts the PostgreSQL transaction, so nothing half-done
// can commit (the middleware rolls back on a 5xx; a bigint overflow of the
// balance, SQLSTATE 22003, is such an error).
func (s *Store) Book(ctx context.Context, e ledger.Entry) (ledger.Entry, error) {
	err := s.inUnitOfWork(ctx, func(q *db.Queries) error {
		balance, err := applyBooking(ctx, q, e)
		if err != nil {
			return err
		}
		e.BalanceAfter = balance
		if err := q.BonusEntryCreate(ctx, db.BonusEntryCreateParams{
			AccountID:    e.AccountID,
			ID:           e.ID,
			Kind:         e.Kind,
			Amount:       e.Amount,
			Reason:       e.Reason,
			BalanceAfter: e.BalanceAfter,
			CreatedAt:    e.CreatedAt,
		}); err != nil {
			return fmt.Errorf("insert bonus entry: %w", err)
		}
		return nil
	})
	if err != nil {
		return ledger.Entry{}, translate(err)
	}
	return e, nil
}

// applyBooking changes the balance by e and returns the balance after it.
func applyBooking(ctx context.Context, q *db.Queries, e ledger.Entry) (int64, error) {
	switch e.Kind {
	case ledger.KindCredit:
		balance, err := q.BonusCredit(ctx, db.BonusCreditParams{AccountID: e.AccountID, Amount: e.Amount})
		if err != nil {
			return 0, fmt.Errorf("credit the bonus balance: %w", err)
		}
		return balance, nil
	case ledger.KindDebit:
		// The guard is in the UPDATE itself (balance >= amount), re-checked
		// by PostgreSQL after any wait for a concurrent booking's row lock;
		// a read-then-write here could overdraw under concurrency.
		rows, err := q.BonusDebit(ctx, db.BonusDebitParams{AccountID: e.AccountID, Amount: e.Amount})
		if err != nil {
			return 0, fmt.Errorf("debit the bonus balance: %w", err)
		}
		if len(rows) == 0 {
			// Read only for the message: a credit committed since the
			// UPDATE may show here, but the refusal stands either way.
			balance, err := q.BonusBalanceGet(ctx, e.AccountID)
			if err != nil {
				return 0, fmt.Errorf("read the bonus balance: %w", err)
			}
			return 0, fmt.Errorf("%w: the debit of %d exceeds the balance of %d", ledger.ErrInsufficientFunds, e.Amount, balance)
		}
		return rows[0], nil
	default:
		return 0, fmt.Errorf("ledger: unknown entry kind %q", e.Kind)
	}
}

// Balance implements ledger.Repository. Inside a lease it reads through the
// lease's transaction, so it sees the lease's own bookings.
func (s *Store) Balance(ctx context.Context, account uuid.UUID) (int64, error) {
	balance, err := s.queries(ctx).BonusBalanceGet(ctx, account)
	if err != nil {
		return 0, translate(fmt.Errorf("read the bonus balance: %w", err))
	}
	return balance, nil
}

// CountBonusEntries returns how many entries the account's ledger holds.
// No API lists entries yet; tests count them to prove that a key booked
// exactly once, whatever the retries.
func (s *Store) CountBonusEntries(ctx context.Context, account uuid.UUID) (int, error) {
	n, err := s.queries(ctx).BonusEntryCount(ctx, account)
	if err != nil {
		return 0, translate(fmt.Errorf("count bonus entries: %w", err))
	}
	return int(n), nil
}

// inUnitOfWork runs fn on the transaction of the idempotency lease in ctx
// or, outside a lease, in a transaction of its own that commits when fn
// returns nil. Writes that must land together (a balance and its entry) go
// through it rather than through s.queries, which outside a lease would run
// each statement on its own.
func (s *Store) inUnitOfWork(ctx context.Context, fn func(q *db.Queries) error) error {
	if tx, ok := TxFrom(ctx); ok {
		return fn(db.New(tx))
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error { return fn(db.New(tx)) })
}
