package postgres

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/gen/db"
	"github.com/oncekey/oncekey/internal/service/ledger"
)

// Book implements ledger.Booker in the unit's transaction, so that the
// balance change, the entry and the stored response commit together or not
// at all.
func (u *txUnit) Book(ctx context.Context, e ledger.Entry) (ledger.Entry, error) {
	return book(ctx, u.q, e)
}

// Book implements ledger.Booker in a transaction of its own: a balance
// never moves without its entry.
func (s *Store) Book(ctx context.Context, e ledger.Entry) (out ledger.Entry, err error) {
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		out, err = book(ctx, db.New(tx), e)
		return err
	})
	return out, translate(err)
}

// book changes the balance and writes the entry through q, which must be a
// transaction's.
//
// Concurrent bookings of an account serialise on its bonus_balances row,
// which BonusCredit and BonusDebit lock until the transaction ends. A debit
// the balance does not cover updates no row, so it writes nothing and takes
// no lock: the 422 the middleware then stores commits no ledger change.
// Any other error aborts the PostgreSQL transaction, so nothing half-done
// can commit (the middleware rolls back on a 5xx; a bigint overflow of the
// balance, SQLSTATE 22003, is such an error).
func book(ctx context.Context, q *db.Queries, e ledger.Entry) (ledger.Entry, error) {
	balance, err := applyBooking(ctx, q, e)
	if err != nil {
		return ledger.Entry{}, translate(err)
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
		return ledger.Entry{}, translate(fmt.Errorf("insert bonus entry: %w", err))
	}
	return e, nil
}

// applyBooking changes the balance by e and returns the balance after it.
func applyBooking(ctx context.Context, q *db.Queries, e ledger.Entry) (int64, error) {
	switch e.Kind {
	case ledger.KindCredit:
		rows, err := q.BonusCredit(ctx, db.BonusCreditParams{AccountID: e.AccountID, Amount: e.Amount, MaxBalance: ledger.MaxBalance})
		if err != nil {
			return 0, fmt.Errorf("credit the bonus balance: %w", err)
		}
		if len(rows) == 0 {
			balance, err := q.BonusBalanceGet(ctx, e.AccountID)
			if err != nil {
				return 0, fmt.Errorf("read the bonus balance: %w", err)
			}
			return 0, fmt.Errorf("%w: the credit of %d would take the balance of %d beyond %d", ledger.ErrBalanceLimit, e.Amount, balance, ledger.MaxBalance)
		}
		return rows[0], nil
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

// Balance implements ledger.Repository.
func (r reads) Balance(ctx context.Context, account uuid.UUID) (int64, error) {
	var balance int64
	err := r.route(ctx, func(ctx context.Context, q *db.Queries) (err error) {
		balance, err = q.BonusBalanceGet(ctx, account)
		return err
	})
	if err != nil {
		return 0, translate(fmt.Errorf("read the bonus balance: %w", err))
	}
	return balance, nil
}

// CountBonusEntries returns how many entries the account's ledger holds.
// No API lists entries yet; tests count them to prove that a key booked
// exactly once, whatever the retries.
func (s *Store) CountBonusEntries(ctx context.Context, account uuid.UUID) (int, error) {
	n, err := db.New(s.pool).BonusEntryCount(ctx, account)
	if err != nil {
		return 0, translate(fmt.Errorf("count bonus entries: %w", err))
	}
	return int(n), nil
}
