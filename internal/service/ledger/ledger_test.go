package ledger

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// fakeRepository records what the service books and answers with err, or
// with the entry and a fixed balance after it. The stores' own behaviour is
// pinned by the conformance suite (internal/service/store/storetest); here only
// what the service adds is under test.
type fakeRepository struct {
	mu      sync.Mutex
	booked  []Entry
	err     error
	balance int64
}

func (r *fakeRepository) Book(_ context.Context, e Entry) (Entry, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.booked = append(r.booked, e)
	if r.err != nil {
		return Entry{}, r.err
	}
	e.BalanceAfter = r.balance
	return e, nil
}

func (r *fakeRepository) Balance(context.Context, uuid.UUID) (int64, error) {
	return r.balance, r.err
}

// testBundle is what a test of the service works with.
type testBundle struct {
	repo    *fakeRepository
	account uuid.UUID
	now     time.Time // what the service's clock says
}

func setup(t *testing.T) (*Service, *testBundle) {
	t.Helper()
	b := &testBundle{
		repo:    &fakeRepository{balance: 42},
		account: uuid.New(),
		// Nanoseconds and a zone other than UTC, both of which the service
		// must take away.
		now: time.Date(2026, 12, 2, 16, 41, 10, 123456789, time.FixedZone("MSK", 3*60*60)),
	}
	s := NewService(b.repo)
	s.now = func() time.Time { return b.now }
	return s, b
}

// book is a use case of the service that books an entry.
type book func(s *Service, ctx context.Context, b Booker, account uuid.UUID, amount int64, reason string) (Entry, error)

var bookings = []struct {
	kind string
	book book
}{
	{KindCredit, (*Service).Credit},
	{KindDebit, (*Service).Debit},
}

func TestLedgerBookPassesTheEntryToTheRepository(t *testing.T) {
	t.Parallel()
	for _, tt := range bookings {
		t.Run(tt.kind, func(t *testing.T) {
			t.Parallel()
			s, b := setup(t)
			got, err := tt.book(s, t.Context(), b.repo, b.account, 40, "order 1")
			require.NoError(t, err, "%s of 40", tt.kind)

			require.Len(t, b.repo.booked, 1, "entries booked by one %s", tt.kind)
			sent := b.repo.booked[0]
			require.Equal(t, b.account, sent.AccountID, "account")
			require.Equal(t, tt.kind, sent.Kind, "kind")
			require.EqualValues(t, 40, sent.Amount, "amount")
			require.Equal(t, "order 1", sent.Reason, "reason")
			require.Equal(t, uuid.Version(7), sent.ID.Version(), "entry ids are UUIDv7, so they sort by creation")
			// PostgreSQL keeps microseconds in UTC: the entry answered at
			// once must equal the one read back later.
			require.Equal(t, time.Date(2026, 12, 2, 13, 41, 10, 123456000, time.UTC), sent.CreatedAt, "created_at")
			require.Equal(t, time.UTC, sent.CreatedAt.Location(), "created_at's zone")

			want := sent
			want.BalanceAfter = b.repo.balance
			require.Equal(t, want, got, "the service returns what the repository booked")
		})
	}
}

func TestLedgerBookGivesEachEntryItsOwnID(t *testing.T) {
	t.Parallel()
	s, b := setup(t)
	for range 3 {
		_, err := s.Credit(t.Context(), b.repo, b.account, 1, "welcome")
		require.NoError(t, err, "credit")
	}
	ids := map[uuid.UUID]bool{}
	for _, e := range b.repo.booked {
		ids[e.ID] = true
	}
	require.Len(t, ids, len(b.repo.booked), "distinct entry ids among %d bookings", len(b.repo.booked))
}

func TestLedgerBookRejectsAnAmountThatIsNotPositive(t *testing.T) {
	t.Parallel()
	for _, tt := range bookings {
		for _, amount := range []int64{0, -1, -1 << 63} {
			t.Run(fmt.Sprintf("%s of %d", tt.kind, amount), func(t *testing.T) {
				t.Parallel()
				s, b := setup(t)
				_, err := tt.book(s, t.Context(), b.repo, b.account, amount, "x")
				require.ErrorContains(t, err, "is not positive", "%s of %d", tt.kind, amount)
				require.Empty(t, b.repo.booked, "nothing may reach the repository")
			})
		}
	}
}

func TestLedgerBookKeepsTheRepositorysError(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  error
	}{
		{name: "insufficient funds", err: fmt.Errorf("%w: the debit of 40 exceeds the balance of 25", ErrInsufficientFunds)},
		{name: "database down", err: errors.New("connection refused")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, b := setup(t)
			b.repo.err = tt.err
			got, err := s.Debit(t.Context(), b.repo, b.account, 40, "order 1")
			// The HTTP layer maps ErrInsufficientFunds to a 422 through
			// errors.Is, and shows the message: both must survive.
			require.ErrorIs(t, err, tt.err, "the repository's error stays in the chain")
			require.ErrorContains(t, err, tt.err.Error(), "and in the message")
			require.Zero(t, got, "no entry on error")
		})
	}
}

func TestLedgerBalanceAsksTheRepository(t *testing.T) {
	t.Parallel()
	s, b := setup(t)
	got, err := s.Balance(t.Context(), b.account)
	require.NoError(t, err, "balance")
	require.Equal(t, b.repo.balance, got, "balance")
}
