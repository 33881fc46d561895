package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/gen/api"
	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/ledger"
	"github.com/oncekey/oncekey/internal/wire/problem"
)

// bonusBody is a bonus request for amount.
func bonusBody(amount int64, reason string) string {
	return fmt.Sprintf(`{"amount":%d,"reason":%q}`, amount, reason)
}

// postBonus sends body to path (/bonus/credits or /bonus/debits) under key.
func (b *testBundle) postBonus(t *testing.T, path, key, body string) reply {
	t.Helper()
	resp := b.post(t, path, key, body)
	return reply{Status: resp.StatusCode, Header: resp.Header, Body: readAll(t, resp.Body)}
}

// bonusBalance reads the account's balance through GET /bonus/balance.
func (b *testBundle) bonusBalance(t *testing.T) int64 {
	t.Helper()
	r := b.get(t, "/bonus/balance")
	require.Equal(t, http.StatusOK, r.Status, "GET /bonus/balance: %s", r)
	var got api.BonusBalance
	require.NoError(t, json.Unmarshal(r.Body, &got), "decode balance %s", r.Body)
	return got.Balance
}

// bonusEntryCounter is what both stores offer for counting ledger entries;
// the API has no list of entries, and a balance alone cannot tell one
// booking from two that cancel out.
type bonusEntryCounter interface {
	CountBonusEntries(ctx context.Context, account uuid.UUID) (int, error)
}

// bonusEntries counts the account's ledger entries in the store.
func (b *testBundle) bonusEntries(t *testing.T) int {
	t.Helper()
	counter, ok := b.store.(bonusEntryCounter)
	require.True(t, ok, "store %T cannot count bonus entries", b.store)
	n, err := counter.CountBonusEntries(context.Background(), b.account)
	require.NoError(t, err, "count bonus entries")
	return n
}

// requireBooked checks that r is a 201 with a booked entry and returns it.
func requireBooked(t *testing.T, r reply, what string) api.BonusEntryResult {
	t.Helper()
	require.Equal(t, http.StatusCreated, r.Status, "%s: want 201, got %s", what, r)
	var res api.BonusEntryResult
	require.NoError(t, json.Unmarshal(r.Body, &res), "%s: decode entry %s", what, r.Body)
	return res
}

func TestBonusCreditAndReplay(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{})
		require.Zero(t, b.bonusBalance(t), "balance of a new account")
		const key = "bonus-credit-welcome"
		body := bonusBody(100, "welcome bonus")

		before := time.Now()
		first := b.postBonus(t, "/bonus/credits", key, body)
		got := requireBooked(t, first, "first credit")
		require.Empty(t, first.Header.Get("Idempotent-Replayed"), "a first response is not a replay")
		require.Equal(t, key, first.Header.Get("Idempotency-Key"), "the key is echoed")
		id, err := uuid.Parse(got.Entry.Id)
		require.NoError(t, err, "entry id %q", got.Entry.Id)
		require.Equal(t, uuid.Version(7), id.Version(), "entry ids are UUIDv7")
		require.WithinRange(t, got.Entry.CreatedAt, before.Add(-time.Second), time.Now().Add(time.Second), "created_at")
		require.Equal(t, api.BonusEntryResult{
			Balance: 100,
			Entry: api.BonusEntry{
				Id: got.Entry.Id, Kind: "credit", Amount: 100, Reason: "welcome bonus",
				BalanceAfter: 100, CreatedAt: got.Entry.CreatedAt,
			},
		}, got, "the credit's entry and balance")
		require.EqualValues(t, 100, b.bonusBalance(t), "balance after the credit")

		tests := []struct {
			name   string
			body   string
			verify func(t *testing.T, r reply)
		}{
			{
				name:   "same body replays",
				body:   body,
				verify: func(t *testing.T, r reply) { requireReplayOf(t, first, r, "credit retried with the same key") },
			},
			{
				name: "another body is a conflict",
				body: bonusBody(101, "welcome bonus"),
				verify: func(t *testing.T, r reply) {
					requireProblem(t, r, problem.KeyMismatch, "credit retried with the same key and another amount")
				},
			},
		}
		for _, tt := range tests {
			// Not parallel: each checks the ledger the first credit left.
			t.Run(tt.name, func(t *testing.T) {
				tt.verify(t, b.postBonus(t, "/bonus/credits", key, tt.body))
				require.EqualValues(t, 100, b.bonusBalance(t), "the balance must not move")
				require.Equal(t, 1, b.bonusEntries(t), "one key books one entry")
			})
		}
	})
}

// TestBonusInsufficientDebitIsStored: a refused debit is an outcome, stored
// under its key like a success, so the key never succeeds later because
// credits arrived in between; a new key is a new attempt.
func TestBonusInsufficientDebitIsStored(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{})
		const debitKey = "bonus-debit-too-early"
		debit := bonusBody(40, "order 1")

		refused := b.postBonus(t, "/bonus/debits", debitKey, debit)
		d := requireProblem(t, refused, httpapi.ProblemFor(ledger.ErrInsufficientFunds), "debit of an empty balance")
		require.Contains(t, d.Detail, "the debit of 40 exceeds the balance of 0", "the detail names the amount and the balance")
		require.Empty(t, refused.Header.Get("Idempotent-Replayed"), "the first refusal is not a replay")

		requireBooked(t, b.postBonus(t, "/bonus/credits", "bonus-credit-in-between", bonusBody(50, "top-up")), "credit")

		requireReplayOf(t, refused, b.postBonus(t, "/bonus/debits", debitKey, debit), "the refused debit retried after the credit")
		require.EqualValues(t, 50, b.bonusBalance(t), "the replayed refusal must not debit")

		fresh := requireBooked(t, b.postBonus(t, "/bonus/debits", "bonus-debit-new-attempt", debit), "the debit under a new key")
		require.EqualValues(t, 10, fresh.Balance, "balance in the new debit's response")
		require.EqualValues(t, 10, fresh.Entry.BalanceAfter, "balance_after of the new debit")
		require.EqualValues(t, 10, b.bonusBalance(t), "balance after the new debit")
		require.Equal(t, 2, b.bonusEntries(t), "entries: the credit and the new debit")
	})
}

// TestBonusCreditBeyondTheLimitIsStored: a credit that would take the
// balance beyond the limit is a 422 outcome, stored and replayed (it was a
// 500 on every retry once the balance overflowed bigint).
func TestBonusCreditBeyondTheLimitIsStored(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		store := be.open(t)
		b := setup(t, store, options{})
		_, err := store.(ledger.Booker).Book(context.Background(), ledger.Entry{AccountID: b.account, ID: uuid.New(),
			Kind: ledger.KindCredit, Amount: ledger.MaxBalance - 50, Reason: "almost all", CreatedAt: time.Now().UTC()})
		require.NoError(t, err, "credit up to 50 below the limit")

		const key = "bonus-credit-beyond"
		refused := b.postBonus(t, "/bonus/credits", key, bonusBody(100, "one too many"))
		d := requireProblem(t, refused, httpapi.ProblemFor(ledger.ErrBalanceLimit), "a credit beyond the limit")
		require.Contains(t, d.Detail, "beyond 1000000000000000000", "the detail names the limit")
		requireReplayOf(t, refused, b.postBonus(t, "/bonus/credits", key, bonusBody(100, "one too many")), "the refused credit retried")
		requireBooked(t, b.postBonus(t, "/bonus/credits", "bonus-credit-to-the-limit", bonusBody(50, "the rest")), "a credit to the limit")
		require.EqualValues(t, ledger.MaxBalance, b.bonusBalance(t), "the balance at the limit")
	})
}

// TestBonusConcurrentDebitsNeverOverdraw: of 100 concurrent debits of 1
// against a balance of 37, each under its own key, exactly 37 are booked
// and the rest refused; the balance ends at 0, never below.
func TestBonusConcurrentDebitsNeverOverdraw(t *testing.T) {
	t.Parallel()
	const (
		initial = 37
		debits  = 100
	)
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{})
		requireBooked(t, b.postBonus(t, "/bonus/credits", "bonus-credit-initial", bonusBody(initial, "initial")), "initial credit")

		replies := b.stampede(t, debits, func(i int) *http.Request {
			return b.newRequest(t, http.MethodPost, "/bonus/debits", strings.NewReader(bonusBody(1, "concurrent")),
				"Idempotency-Key", fmt.Sprintf("bonus-debit-%d", i))
		})

		var balancesAfter []int64
		statuses := map[int]int{}
		for i, r := range replies {
			statuses[r.Status]++
			switch r.Status {
			case http.StatusCreated:
				balancesAfter = append(balancesAfter, requireBooked(t, r, fmt.Sprintf("debit %d", i)).Balance)
			case http.StatusUnprocessableEntity:
				requireProblem(t, r, httpapi.ProblemFor(ledger.ErrInsufficientFunds), fmt.Sprintf("debit %d", i))
			default:
				require.FailNow(t, "unexpected status", "debit %d: want 201 or 422, got %s", i, r)
			}
		}
		require.Equal(t, map[int]int{http.StatusCreated: initial, http.StatusUnprocessableEntity: debits - initial}, statuses,
			"statuses of %d debits of 1 against %d", debits, initial)
		// Serialised debits each see the balance the previous one left.
		slices.Sort(balancesAfter)
		want := make([]int64, initial)
		for i := range want {
			want[i] = int64(i)
		}
		require.Equal(t, want, balancesAfter, "balances after the booked debits: each of 36..0 once")
		require.Zero(t, b.bonusBalance(t), "balance after the debits")
		require.Equal(t, 1+initial, b.bonusEntries(t), "entries: the credit and the booked debits")
	})
}

// TestBonusConcurrentRetriesDebitOnce: 100 concurrent sends of one debit
// under one key book it once; every reply is that booking (byte-identical)
// or a 202 while it was still running.
func TestBonusConcurrentRetriesDebitOnce(t *testing.T) {
	t.Parallel()
	const retries = 100
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{})
		requireBooked(t, b.postBonus(t, "/bonus/credits", "bonus-credit-initial", bonusBody(50, "initial")), "initial credit")
		const key = "bonus-debit-retried"

		replies := b.stampede(t, retries, func(int) *http.Request {
			return b.newRequest(t, http.MethodPost, "/bonus/debits", strings.NewReader(bonusBody(7, "order 1")), "Idempotency-Key", key)
		})

		var booked []byte
		fresh, inProgress := 0, 0
		for i, r := range replies {
			switch r.Status {
			case http.StatusCreated:
				if booked == nil {
					booked = r.Body
				}
				require.Equal(t, string(booked), string(r.Body), "reply %d: every 201 must carry the same entry", i)
				if r.Header.Get("Idempotent-Replayed") == "" {
					fresh++
				}
			case http.StatusAccepted:
				requireProblem(t, r, problem.InProgress, fmt.Sprintf("reply %d", i))
				require.NotEmpty(t, r.Header.Get("Retry-After"), "reply %d: 202 without Retry-After", i)
				inProgress++
			default:
				require.FailNow(t, "unexpected status", "reply %d: want 201 or 202, got %s", i, r)
			}
		}
		t.Logf("%d fresh, %d replayed, %d in progress", fresh, retries-fresh-inProgress, inProgress)
		require.Equal(t, 1, fresh, "exactly one send runs the debit")
		require.EqualValues(t, 43, requireBooked(t, reply{Status: http.StatusCreated, Body: booked}, "the booking").Balance,
			"balance in the booking")
		require.EqualValues(t, 43, b.bonusBalance(t), "the debit is taken once")
		require.Equal(t, 2, b.bonusEntries(t), "entries: the credit and the one debit")
	})
}
