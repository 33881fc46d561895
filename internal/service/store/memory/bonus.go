package memory

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/internal/service/ledger"
)

// Book implements ledger.Booker, as a unit of work of its own: outside a
// lease, the entry and the balance change together.
func (s *Store) Book(ctx context.Context, e ledger.Entry) (ledger.Entry, error) {
	var (
		out ledger.Entry
		err error
	)
	s.write(func() { out, err = s.book(e, func(apply, _ func()) { apply() }) })
	return out, err
}

// Book implements ledger.Booker inside the unit's lease.
//
// The check that the balance covers a debit and the change it guards
// happen in one apply, under the data write lock, so concurrent debits
// cannot both pass the check on the same balance (PostgreSQL gets the same
// from its guarded UPDATE). A refused debit still takes the lock inside a
// lease, as a refused UPDATE waits for the row in PostgreSQL: it must see
// the balance other leases leave, not one they are about to change.
func (u *unit) Book(_ context.Context, e ledger.Entry) (ledger.Entry, error) {
	return u.s.book(e, u.write)
}

// book applies e through write, which runs apply and keeps undo for a
// rollback.
func (s *Store) book(e ledger.Entry, write func(apply, undo func())) (ledger.Entry, error) {
	var (
		err        error
		booked     bool
		before     int64
		hadBalance bool
	)
	write(func() {
		before, hadBalance = s.bonusBalances[e.AccountID]
		var after int64
		after, err = balanceAfter(before, e)
		if err != nil {
			return
		}
		e.BalanceAfter = after
		s.bonusBalances[e.AccountID] = after
		s.bonusEntries[e.AccountID] = append(s.bonusEntries[e.AccountID], e)
		booked = true
	}, func() {
		if !booked {
			return
		}
		// Undos run newest first with the lock held since the lease's first
		// write, so before is exactly the balance to go back to.
		if hadBalance {
			s.bonusBalances[e.AccountID] = before
		} else {
			delete(s.bonusBalances, e.AccountID)
		}
		s.bonusEntries[e.AccountID] = slices.DeleteFunc(s.bonusEntries[e.AccountID], func(x ledger.Entry) bool { return x.ID == e.ID })
	})
	if err != nil {
		return ledger.Entry{}, err
	}
	return e, nil
}

// balanceAfter returns the balance e leaves, or why e cannot be booked on
// balance. It refuses what PostgreSQL's constraints refuse (an amount that
// is not positive, an empty reason), and what PostgreSQL's guarded UPDATEs
// refuse: a debit beyond the balance, a credit beyond ledger.MaxBalance.
func balanceAfter(balance int64, e ledger.Entry) (int64, error) {
	switch {
	case e.Amount <= 0:
		return 0, fmt.Errorf("memory: the amount %d is not positive", e.Amount)
	case e.Reason == "":
		return 0, errors.New("memory: an entry needs a reason")
	}
	switch e.Kind {
	case ledger.KindCredit:
		if e.Amount > ledger.MaxBalance-balance {
			return 0, fmt.Errorf("%w: the credit of %d would take the balance of %d beyond %d", ledger.ErrBalanceLimit, e.Amount, balance, ledger.MaxBalance)
		}
		return balance + e.Amount, nil
	case ledger.KindDebit:
		if balance < e.Amount {
			return 0, fmt.Errorf("%w: the debit of %d exceeds the balance of %d", ledger.ErrInsufficientFunds, e.Amount, balance)
		}
		return balance - e.Amount, nil
	default:
		return 0, fmt.Errorf("ledger: unknown entry kind %q", e.Kind)
	}
}

// Balance implements ledger.Repository.
func (s *Store) Balance(_ context.Context, account uuid.UUID) (int64, error) {
	var balance int64
	s.read(func() { balance = s.bonusBalances[account] })
	return balance, nil
}

// CountBonusEntries returns how many entries the account's ledger holds.
// No API lists entries yet; tests count them to prove that a key booked
// exactly once, whatever the retries.
func (s *Store) CountBonusEntries(_ context.Context, account uuid.UUID) (int, error) {
	var n int
	s.read(func() { n = len(s.bonusEntries[account]) })
	return n, nil
}
