// Package ledger is the bonus ledger: credits and debits of an account's
// bonus balance, which must never happen twice and never take the balance
// below zero. It knows nothing about HTTP or idempotency: bookings go
// through the Booker it is handed (inside an idempotent request, the
// request's unit of work, so the entry and the stored response commit
// together).
package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Kinds of entry.
const (
	KindCredit = "credit"
	KindDebit  = "debit"
)

// ErrInsufficientFunds: the debit is larger than the balance. It is a
// business outcome (422), stored and replayed under the key, so the same key
// never succeeds later because credits arrived in between.
var ErrInsufficientFunds = errors.New("insufficient bonus balance")

// MaxBalance is the largest balance: far beyond any real one, and far
// enough below the int64 (and bigint) limit that no credit can overflow it.
const MaxBalance int64 = 1_000_000_000_000_000_000

// ErrBalanceLimit: the credit would take the balance beyond MaxBalance. A
// business outcome (422), stored and replayed under the key.
var ErrBalanceLimit = errors.New("bonus balance limit exceeded")

// Entry is one booked credit or debit.
type Entry struct {
	AccountID uuid.UUID
	ID        uuid.UUID
	Kind      string
	Amount    int64
	Reason    string
	// BalanceAfter is the balance right after this entry.
	BalanceAfter int64
	CreatedAt    time.Time
}

// Booker books entries. Implementations must pass the conformance suite in
// internal/service/store/storetest.
type Booker interface {
	// Book applies e.Kind's change of e.Amount to e.AccountID's balance and
	// records e with the resulting balance, which it returns, in one unit of
	// work. A debit the balance does not cover changes nothing and returns
	// ErrInsufficientFunds (wrapped, with the balance in its message); a
	// credit beyond MaxBalance changes nothing and returns ErrBalanceLimit.
	// Concurrent bookings of one account are serialised, so the balance is
	// never negative.
	Book(ctx context.Context, e Entry) (Entry, error)
}

// Repository reads the ledger.
type Repository interface {
	// Balance returns the account's balance (0 before its first credit).
	Balance(ctx context.Context, account uuid.UUID) (int64, error)
}

// Service is the ledger's use cases.
type Service struct {
	repo Repository
	now  func() time.Time
}

// NewService returns the service over repo.
func NewService(repo Repository) *Service {
	return &Service{repo: repo, now: time.Now}
}

// Credit adds amount to account's balance, through b.
func (s *Service) Credit(ctx context.Context, b Booker, account uuid.UUID, amount int64, reason string) (Entry, error) {
	return s.book(ctx, b, account, KindCredit, amount, reason)
}

// Debit takes amount from account's balance through b, or fails with
// ErrInsufficientFunds.
func (s *Service) Debit(ctx context.Context, b Booker, account uuid.UUID, amount int64, reason string) (Entry, error) {
	return s.book(ctx, b, account, KindDebit, amount, reason)
}

// Balance returns account's balance.
func (s *Service) Balance(ctx context.Context, account uuid.UUID) (int64, error) {
	return s.repo.Balance(ctx, account)
}

func (s *Service) book(ctx context.Context, b Booker, account uuid.UUID, kind string, amount int64, reason string) (Entry, error) {
	if amount <= 0 {
		return Entry{}, fmt.Errorf("ledger: amount %d is not positive", amount)
	}
	id, err := uuid.NewV7()
	if err != nil {
		return Entry{}, fmt.Errorf("new entry id: %w", err)
	}
	e, err := b.Book(ctx, Entry{
		AccountID: account, ID: id, Kind: kind, Amount: amount, Reason: reason,
		// PostgreSQL keeps microseconds; the response equals what is stored.
		CreatedAt: s.now().UTC().Truncate(time.Microsecond),
	})
	if errors.Is(err, ErrInsufficientFunds) || errors.Is(err, ErrBalanceLimit) {
		return Entry{}, err // its message is the client's problem detail
	}
	if err != nil {
		return Entry{}, fmt.Errorf("book %s: %w", kind, err)
	}
	return e, nil
}
