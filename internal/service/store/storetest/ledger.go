package storetest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/ledger"
)

// 5. Ledger arithmetic: credits and debits move the balance and each entry
// carries the balance after it; a debit the balance does not cover, or a
// booking the database would refuse, changes nothing; accounts are apart.
func testLedger(t *testing.T, setup setupFunc) {
	t.Run("a new account has balance 0 and nothing to debit", func(t *testing.T) {
		t.Parallel()
		store, bundle := setup(t)
		requireLedger(t, bundle.ctx, store, bundle.account, 0, 0, "new account")

		_, err := store.Book(bundle.ctx, newEntry(bundle.account, ledger.KindDebit, 1))
		require.ErrorIs(t, err, ledger.ErrInsufficientFunds, "debit of an account that never had a credit")
		require.ErrorContains(t, err, "the debit of 1 exceeds the balance of 0", "the message names the amount and the balance")
		requireLedger(t, bundle.ctx, store, bundle.account, 0, 0, "after the refused debit")
	})

	t.Run("bookings add up", func(t *testing.T) {
		t.Parallel()
		store, bundle := setup(t)
		// Steps run in order on one account; each sees the balance the
		// previous ones left.
		steps := []struct {
			kind        string
			amount      int64
			wantBalance int64
			wantErr     string // empty: booked; otherwise the refusal's message
		}{
			{kind: ledger.KindCredit, amount: 100, wantBalance: 100},
			{kind: ledger.KindCredit, amount: 20, wantBalance: 120},
			{kind: ledger.KindDebit, amount: 30, wantBalance: 90},
			{kind: ledger.KindDebit, amount: 91, wantBalance: 90, wantErr: "the debit of 91 exceeds the balance of 90"},
			{kind: ledger.KindDebit, amount: 90, wantBalance: 0}, // exactly the balance
			{kind: ledger.KindDebit, amount: 1, wantBalance: 0, wantErr: "the debit of 1 exceeds the balance of 0"},
			{kind: ledger.KindCredit, amount: 5, wantBalance: 5},
		}
		entries := 0
		for i, step := range steps {
			e := newEntry(bundle.account, step.kind, step.amount)
			got, err := store.Book(bundle.ctx, e)
			if step.wantErr != "" {
				require.ErrorIs(t, err, ledger.ErrInsufficientFunds, "step %d: %s of %d", i, step.kind, step.amount)
				require.ErrorContains(t, err, step.wantErr, "step %d: the refusal's message", i)
				require.Zero(t, got, "step %d: a refused booking returns no entry", i)
			} else {
				require.NoError(t, err, "step %d: %s of %d", i, step.kind, step.amount)
				want := e
				want.BalanceAfter = step.wantBalance
				require.Equal(t, want, got, "step %d: the booked entry carries the balance after it", i)
				entries++
			}
			requireLedger(t, bundle.ctx, store, bundle.account, step.wantBalance, entries, "after step "+strconv.Itoa(i))
		}
	})

	t.Run("a credit beyond the limit is refused", func(t *testing.T) {
		t.Parallel()
		store, bundle := setup(t)
		_, err := store.Book(bundle.ctx, newEntry(bundle.account, ledger.KindCredit, ledger.MaxBalance-50))
		require.NoError(t, err, "credit up to 50 below the limit")
		for _, amount := range []int64{51, math.MaxInt64} { // just beyond, and far beyond: never an overflow
			got, err := store.Book(bundle.ctx, newEntry(bundle.account, ledger.KindCredit, amount))
			require.ErrorIs(t, err, ledger.ErrBalanceLimit, "credit of %d", amount)
			require.ErrorContains(t, err, fmt.Sprintf("the credit of %d would take the balance of %d beyond %d", amount, ledger.MaxBalance-50, ledger.MaxBalance), "the refusal's message")
			require.Zero(t, got, "a refused booking returns no entry")
		}
		requireLedger(t, bundle.ctx, store, bundle.account, ledger.MaxBalance-50, 1, "after the refused credits")
		_, err = store.Book(bundle.ctx, newEntry(bundle.account, ledger.KindCredit, 50))
		require.NoError(t, err, "a credit up to the limit itself")
		requireLedger(t, bundle.ctx, store, bundle.account, ledger.MaxBalance, 2, "at the limit")
	})

	t.Run("accounts are separate", func(t *testing.T) {
		t.Parallel()
		store, bundle := setup(t)
		other := newAccount(t, bundle.ctx, store)
		_, err := store.Book(bundle.ctx, newEntry(bundle.account, ledger.KindCredit, 50))
		require.NoError(t, err, "credit the first account")

		requireLedger(t, bundle.ctx, store, other, 0, 0, "the other account after a credit of the first")
		_, err = store.Book(bundle.ctx, newEntry(other, ledger.KindDebit, 1))
		require.ErrorIs(t, err, ledger.ErrInsufficientFunds, "the other account cannot spend the first one's balance")
		requireLedger(t, bundle.ctx, store, bundle.account, 50, 1, "the first account after the other's refused debit")
	})

	// What the service never sends but the schema refuses: a store must
	// refuse it too, and leave the balance and the entries as they were.
	tests := []struct {
		name  string
		entry func(account uuid.UUID) ledger.Entry
	}{
		{name: "credit of zero", entry: func(a uuid.UUID) ledger.Entry { return newEntry(a, ledger.KindCredit, 0) }},
		{name: "negative credit", entry: func(a uuid.UUID) ledger.Entry { return newEntry(a, ledger.KindCredit, -5) }},
		{name: "debit of zero", entry: func(a uuid.UUID) ledger.Entry { return newEntry(a, ledger.KindDebit, 0) }},
		{name: "negative debit", entry: func(a uuid.UUID) ledger.Entry { return newEntry(a, ledger.KindDebit, -5) }},
		{name: "empty reason", entry: func(a uuid.UUID) ledger.Entry {
			e := newEntry(a, ledger.KindCredit, 1)
			e.Reason = ""
			return e
		}},
		{name: "unknown kind", entry: func(a uuid.UUID) ledger.Entry { return newEntry(a, "refund", 1) }},
	}
	for _, tt := range tests {
		t.Run("refused: "+tt.name, func(t *testing.T) {
			t.Parallel()
			store, bundle := setup(t)
			_, err := store.Book(bundle.ctx, newEntry(bundle.account, ledger.KindCredit, 10))
			require.NoError(t, err, "initial credit")

			got, err := store.Book(bundle.ctx, tt.entry(bundle.account))
			require.Error(t, err, "booking %s", tt.name)
			require.NotErrorIs(t, err, ledger.ErrInsufficientFunds, "%s is invalid, not a business refusal", tt.name)
			require.Zero(t, got, "a refused booking returns no entry")
			requireLedger(t, bundle.ctx, store, bundle.account, 10, 1, "after the refused "+tt.name)
		})
	}
}

// 6. Concurrent debits, each in its own idempotency lease as a request
// runs them, never together take more than the balance: of 100 debits of 1
// against 37 exactly 37 are booked, each on a balance of its own.
func testLedgerConcurrentDebits(t *testing.T, setup setupFunc) {
	const (
		initial = 37
		debits  = 100
	)
	store, bundle := setup(t)
	ctx := bundle.ctx
	_, err := store.Book(ctx, newEntry(bundle.account, ledger.KindCredit, initial))
	require.NoError(t, err, "initial credit")

	results := make([]leaseDebit, debits)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range debits {
		wg.Go(func() {
			<-start
			results[i] = debitInLease(ctx, store, bundle.account)
		})
	}
	close(start)
	wg.Wait()

	var balancesAfter []int64
	refused := 0
	for i, res := range results {
		require.NoError(t, res.fail, "debit %d: the lease", i)
		if errors.Is(res.err, ledger.ErrInsufficientFunds) {
			refused++
			continue
		}
		require.NoError(t, res.err, "debit %d", i)
		balancesAfter = append(balancesAfter, res.entry.BalanceAfter)
	}
	require.Len(t, balancesAfter, initial, "booked debits of 1 against a balance of %d", initial)
	require.Equal(t, debits-initial, refused, "debits refused for insufficient funds")
	// Serialised debits each see the balance the previous one left: the
	// balances after them are 36, 35, ... 0, each exactly once.
	slices.Sort(balancesAfter)
	want := make([]int64, initial)
	for i := range want {
		want[i] = int64(i)
	}
	require.Equal(t, want, balancesAfter, "the balances after the booked debits")
	requireLedger(t, ctx, store, bundle.account, 0, 1+initial, "after the concurrent debits")
}

// leaseDebit is what one debit in a lease came to.
type leaseDebit struct {
	entry ledger.Entry
	err   error // of the booking: nil and ErrInsufficientFunds are outcomes
	fail  error // of the lease itself (claim, commit): never expected
}

// debitInLease debits 1 from account as a request does: it claims a fresh
// key, books inside the lease and commits what the middleware would store
// (the 201, or the 422 of a refusal); any other error rolls back.
func debitInLease(ctx context.Context, store Store, account uuid.UUID) leaseDebit {
	req := claimRequest(account, newKey(), fingerprint("POST /bonus/debits 1"))
	req.Route = "/bonus/debits"
	lease, rec, err := store.Keys().Claim(ctx, req)
	switch {
	case err != nil:
		return leaseDebit{fail: err}
	case lease == nil:
		return leaseDebit{fail: errors.New("a fresh key replayed a record: " + string(rec.Response.Body))}
	}
	defer func() { _ = lease.Rollback(context.WithoutCancel(ctx)) }() // a no-op once committed
	var res leaseDebit
	res.entry, res.err = lease.Unit().Book(ctx, newEntry(account, ledger.KindDebit, 1))
	resp := response("debited\n")
	switch {
	case errors.Is(res.err, ledger.ErrInsufficientFunds):
		resp.Status = http.StatusUnprocessableEntity
	case res.err != nil:
		return res // rolled back, as the middleware does on a 5xx
	}
	res.fail = lease.Commit(ctx, resp)
	return res
}

// 7. Bookings inside a lease that rolls back leave neither a balance
// change nor an entry, while the lease itself saw them; the key is then
// free and a booking under it counts once.
func testLedgerRollback(t *testing.T, setup setupFunc) {
	type booking struct {
		kind   string
		amount int64
	}
	tests := []struct {
		name     string
		initial  int64     // credited before the lease; 0: the account never had a credit
		bookings []booking // in the lease, in order
		inside   int64     // the balance the lease sees after them
	}{
		{name: "debit", initial: 10, bookings: []booking{{ledger.KindDebit, 4}}, inside: 6},
		{name: "debit then credit", initial: 10, bookings: []booking{{ledger.KindDebit, 10}, {ledger.KindCredit, 5}}, inside: 5},
		{name: "first credit of the account", bookings: []booking{{ledger.KindCredit, 7}}, inside: 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			store, bundle := setup(t)
			ctx := bundle.ctx
			committed := 0
			if tt.initial > 0 {
				_, err := store.Book(ctx, newEntry(bundle.account, ledger.KindCredit, tt.initial))
				require.NoError(t, err, "initial credit")
				committed++
			}
			req := claimRequest(bundle.account, newKey(), fingerprint("POST /bonus"))
			req.Route = "/bonus/debits"

			lease := claimTx(t, ctx, store, req)
			var inside int64
			for i, b := range tt.bookings {
				e, err := lease.Unit().Book(ctx, newEntry(bundle.account, b.kind, b.amount))
				require.NoError(t, err, "booking %d (%s of %d) in the lease", i, b.kind, b.amount)
				inside = e.BalanceAfter
			}
			require.Equal(t, tt.inside, inside, "inside the lease, which sees its own bookings")
			require.NoError(t, lease.Rollback(ctx), "rollback")
			requireLedger(t, ctx, store, bundle.account, tt.initial, committed, "after the rollback")

			lease = claimTx(t, ctx, store, req) // the key is free again
			got, err := lease.Unit().Book(ctx, newEntry(bundle.account, ledger.KindCredit, 1))
			require.NoError(t, err, "credit in the second lease")
			require.Equal(t, tt.initial+1, got.BalanceAfter, "the second lease books on the balance the first left untouched")
			commitResponse(t, ctx, lease, "credited\n")
			requireLedger(t, ctx, store, bundle.account, tt.initial+1, committed+1, "after the second lease committed")
		})
	}
}

// requireLedger checks account's balance and entries.
func requireLedger(t *testing.T, ctx context.Context, store Store, account uuid.UUID, balance int64, entries int, what string) {
	t.Helper()
	got, err := store.Balance(ctx, account)
	require.NoError(t, err, "%s: balance", what)
	require.Equal(t, balance, got, "%s: balance", what)
	n, err := store.CountBonusEntries(ctx, account)
	require.NoError(t, err, "%s: count entries", what)
	require.Equal(t, entries, n, "%s: entries", what)
}

func newEntry(account uuid.UUID, kind string, amount int64) ledger.Entry {
	return ledger.Entry{
		AccountID: account,
		ID:        uuid.New(),
		Kind:      kind,
		Amount:    amount,
		Reason:    "storetest " + kind,
		// PostgreSQL keeps microseconds; ledger.Service truncates the same way.
		CreatedAt: time.Now().UTC().Truncate(time.Microsecond),
	}
}
