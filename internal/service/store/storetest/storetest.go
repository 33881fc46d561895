// Package storetest is the conformance suite of Oncekey's backends: the
// in-memory and the PostgreSQL one both run it, so they keep the same
// semantics for accounts, orders, payments and the bonus ledger, and for
// the domain's writes inside the idempotency engine's leases. The leases
// themselves are the engine's business (package idempotency/storetest).
//
// Every case makes its own accounts and keys, so the cases run in parallel
// and may share one database with other tests.
package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/ledger"
	"github.com/oncekey/oncekey/internal/service/orders"
	"github.com/oncekey/oncekey/internal/service/store"
)

// Store is a backend with what the suite writes outside a lease.
type Store interface {
	store.Backend
	// Book books an entry on its own, outside an idempotent operation.
	ledger.Booker
	// CreateOrder creates an order on its own.
	orders.Writer
	// CountBonusEntries counts an account's ledger entries: a balance alone
	// cannot tell "booked once" from "booked, undone, booked again".
	CountBonusEntries(ctx context.Context, account uuid.UUID) (int, error)
}

// expiryPause is how long a case sleeps for a record with a 1ms TTL to
// expire. The PostgreSQL store measures expiry on the database clock, so the
// pause leaves room beyond the TTL itself.
const expiryPause = 50 * time.Millisecond

// Run runs the suite against the stores newStore returns. It is called once
// per case; the stores may share state (one database), since every case
// works in accounts of its own.
func Run(t *testing.T, newStore func(t *testing.T) Store) {
	t.Helper()
	setup := func(t *testing.T) (Store, *testBundle) {
		t.Helper()
		store := newStore(t)
		ctx := t.Context()
		return store, &testBundle{ctx: ctx, account: newAccount(t, ctx, store)}
	}
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, setup setupFunc)
	}{
		{"Orders", testOrders},
		{"OrdersWrittenWithTheirClaim", testOrdersWithClaim},
		{"OrdersOfManyKeysRunOncePerKey", testOrdersManyKeys},
		{"Accounts", testAccounts},
		{"Ledger", testLedger},
		{"LedgerConcurrentDebits", testLedgerConcurrentDebits},
		{"LedgerRollbackUndoesEntry", testLedgerRollback},
		{"Payments", testPayments},
		{"PaymentFinishReplacesProvisionalResponse", testPaymentFinishReplacesProvisional},
		{"OneActivePaymentPerOrder", testOneActivePaymentPerOrder},
		{"OrderChanges", testOrderChanges},
		{"OrderLockSerializes", testOrderLockSerializes},
		{"Refunds", testRefunds},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t, setup)
		})
	}
}

// testBundle is what a case gets besides the store: a context ending with
// the test and a fresh account.
type testBundle struct {
	ctx     context.Context
	account uuid.UUID
}

type setupFunc func(t *testing.T) (Store, *testBundle)

// 1. Orders: read back as written, per account, listed newest first with a
// cursor that neither skips nor repeats.
func testOrders(t *testing.T, setup setupFunc) {
	t.Run("get returns the created order", func(t *testing.T) {
		t.Parallel()
		store, bundle := setup(t)
		o := newOrder(bundle.account, time.Now())
		want := o
		want.Items = slices.Clone(o.Items)
		require.NoError(t, store.CreateOrder(bundle.ctx, o), "create order")
		o.Items[0].Qty = 99 // the store keeps its own copy

		got, err := store.GetOrder(bundle.ctx, bundle.account, o.ID)
		require.NoError(t, err, "get order")
		require.Equal(t, want, got, "order read back")
	})

	t.Run("another account's order is not found", func(t *testing.T) {
		t.Parallel()
		store, bundle := setup(t)
		other := newAccount(t, bundle.ctx, store)
		o := newOrder(bundle.account, time.Now())
		require.NoError(t, store.CreateOrder(bundle.ctx, o), "create order")

		_, err := store.GetOrder(bundle.ctx, other, o.ID)
		require.ErrorIs(t, err, orders.ErrNotFound, "get another account's order")
		list, err := store.ListOrders(bundle.ctx, other, nil, 10)
		require.NoError(t, err, "list another account's orders")
		require.Empty(t, list, "listing must not show another account's orders")
		_, err = store.GetOrder(bundle.ctx, bundle.account, uuid.New())
		require.ErrorIs(t, err, orders.ErrNotFound, "get an unknown order id")
	})

	// Seven orders, all in one account: five with distinct CreatedAt and two
	// sharing one, so that the ID decides their order. The pair sits at
	// positions 2 and 3, so pages of 1 and 3 split it and the cursor must
	// break the tie by ID.
	store, bundle := setup(t)
	base := time.Now().UTC().Truncate(time.Microsecond)
	tieLow, tieHigh := uuid.New(), uuid.New()
	if bytes.Compare(tieLow[:], tieHigh[:]) > 0 {
		tieLow, tieHigh = tieHigh, tieLow
	}
	var created []orders.Order
	for _, offset := range []time.Duration{-5 * time.Second, -4 * time.Second, -3 * time.Second, -1 * time.Second, 0} {
		created = append(created, newOrder(bundle.account, base.Add(offset)))
	}
	for _, id := range []uuid.UUID{tieLow, tieHigh} { // ascending: insertion order is not the answer
		o := newOrder(bundle.account, base.Add(-2*time.Second))
		o.ID = id
		created = append(created, o)
	}
	for _, o := range created {
		require.NoError(t, store.CreateOrder(bundle.ctx, o), "create order %s", o.ID)
	}
	want := slices.Clone(created)
	slices.SortFunc(want, func(a, b orders.Order) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return bytes.Compare(b.ID[:], a.ID[:])
	})
	require.Equal(t, tieHigh, want[2].ID, "test setup: the tied pair must sit at positions 2 and 3")

	for _, limit := range []int{1, 2, 3, len(want), len(want) + 3} {
		t.Run("list pages of "+strconv.Itoa(limit), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			var (
				got   []orders.Order
				after *orders.Cursor
			)
			for page := 0; ; page++ {
				require.LessOrEqual(t, page, len(want), "pagination does not end (cursor %+v)", after)
				list, err := store.ListOrders(ctx, bundle.account, after, limit)
				require.NoError(t, err, "list page %d (cursor %+v)", page, after)
				require.LessOrEqual(t, len(list), limit, "page %d is longer than the limit", page)
				got = append(got, list...)
				if len(list) < limit {
					break
				}
				last := list[len(list)-1]
				after = &orders.Cursor{CreatedAt: last.CreatedAt, ID: last.ID}
			}
			require.Equal(t, want, got, "all pages together, newest first by (CreatedAt, ID)")
		})
	}
}

// orderAttempt is how creating an order as POST /orders does ended: it
// committed, or it found the key taken and learned the record there, or
// it failed.
type orderAttempt struct {
	committed bool
	order     orders.Order
	rec       *idempotency.Record
	err       error
}

// createOrder plays POST /orders: a claim of the write-only operations'
// store, the order written through its unit, the commit; a commit that
// lost its claim without a record claims again, at once (AtOnce), as the
// engine does.
func createOrder(ctx context.Context, store Store, req idempotency.ClaimRequest, body string) orderAttempt {
	for _, now := range []bool{false, true} {
		req.AtOnce = now
		lease, rec, err := store.DeferredKeys().Claim(ctx, req)
		if err != nil || lease == nil {
			return orderAttempt{rec: rec, err: err}
		}
		o := newOrder(accountOf(req.Scope), time.Now())
		if err := lease.Unit().CreateOrder(ctx, o); err != nil {
			_ = lease.Rollback(ctx)
			return orderAttempt{err: err}
		}
		err = lease.Commit(ctx, response(body))
		var taken *idempotency.TakenError
		switch {
		case err == nil:
			return orderAttempt{committed: true, order: o}
		case errors.As(err, &taken) && taken.Record != nil:
			return orderAttempt{rec: taken.Record}
		case !errors.As(err, &taken):
			return orderAttempt{err: err}
		}
	}
	return orderAttempt{err: errors.New("the key changed under a claim made now")}
}

// 2. An order written through a write-only operation's unit exists only
// with its claim: a replay or a mismatch writes none, a rollback leaves
// none, and an order in a unit not yet committed is seen by no one.
func testOrdersWithClaim(t *testing.T, setup setupFunc) {
	t.Run("replay and mismatch write nothing", func(t *testing.T) {
		t.Parallel()
		store, b := setup(t)
		req := claimRequest(b.account, newKey(), fingerprint("POST /orders a"))
		first := createOrder(b.ctx, store, req, "first\n")
		require.NoError(t, first.err, "first request")
		require.True(t, first.committed, "the first request must commit")
		got, err := store.GetOrder(b.ctx, b.account, first.order.ID)
		require.NoError(t, err, "the committed order")
		require.Equal(t, first.order, got, "the committed order")

		again := createOrder(b.ctx, store, req, "again\n")
		require.NoError(t, again.err, "replay")
		require.False(t, again.committed, "a replay must not commit")
		require.Equal(t, []byte("first\n"), again.rec.Response.Body, "replayed body")

		other := req
		other.Fingerprint = fingerprint("POST /orders b")
		mismatch := createOrder(b.ctx, store, other, "other\n")
		require.NoError(t, mismatch.err, "mismatch")
		require.False(t, mismatch.committed, "a mismatch must not commit")
		require.Equal(t, req.Fingerprint, mismatch.rec.Fingerprint, "the record keeps the first fingerprint")
		require.Equal(t, 1, orderCount(t, store, b), "orders after a first request, a replay and a mismatch")
	})

	t.Run("rollback leaves nothing and is seen by no one", func(t *testing.T) {
		t.Parallel()
		store, b := setup(t)
		req := claimRequest(b.account, newKey(), fingerprint("POST /orders"))
		// Claimed at once: the order is written now where the store can.
		req.AtOnce = true
		lease, _, err := store.DeferredKeys().Claim(b.ctx, req)
		require.NoError(t, err, "claim")
		o := newOrder(b.account, time.Now())
		require.NoError(t, lease.Unit().CreateOrder(b.ctx, o), "create the order")

		// Outside the unit, the order does not exist yet: a reader sees
		// nothing now (PostgreSQL), or waits for the unit (memory), and
		// after the rollback sees nothing either way.
		gets := make(chan error, 1)
		go func() {
			_, err := store.GetOrder(b.ctx, b.account, o.ID)
			gets <- err
		}()
		time.Sleep(50 * time.Millisecond)
		require.NoError(t, lease.Rollback(b.ctx), "rollback")
		require.ErrorIs(t, receive(t, gets, "the outside GetOrder"), orders.ErrNotFound, "an uncommitted, then rolled-back order")
		require.Zero(t, orderCount(t, store, b), "orders after a rollback")
		require.True(t, createOrder(b.ctx, store, req, "after\n").committed, "the key must be free after a rollback")
	})
}

// 3. Concurrent first requests for many keys (a store may merge their
// commits into one transaction) write one order per key, and every other
// request gets its key's record.
func testOrdersManyKeys(t *testing.T, setup setupFunc) {
	const keys, perKey = 20, 5
	store, b := setup(t)
	reqs := make([]idempotency.ClaimRequest, keys)
	for i := range reqs {
		reqs[i] = claimRequest(b.account, newKey(), fingerprint("POST /orders"))
	}
	start := make(chan struct{})
	results := make([]orderAttempt, keys*perKey)
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() {
			<-start
			req := reqs[i%keys]
			results[i] = createOrder(b.ctx, store, req, req.Key)
		})
	}
	close(start)
	wg.Wait()
	committed := make([]int, keys)
	for i, res := range results {
		require.NoError(t, res.err, "request %d", i)
		if res.committed {
			committed[i%keys]++
			continue
		}
		require.NotNil(t, res.rec, "request %d neither committed nor got a record", i)
		require.Equal(t, reqs[i%keys].Key, string(res.rec.Response.Body), "request %d replayed another key's record", i)
	}
	for k, n := range committed {
		require.Equal(t, 1, n, "commits of key %d among %d concurrent requests", k, perKey)
	}
	require.Equal(t, keys, orderCount(t, store, b), "orders created by %d keys", keys)
}

// 4. Accounts are found by the hash of their API key, and by name.
func testAccounts(t *testing.T, setup setupFunc) {
	store, bundle := setup(t)
	name := "storetest " + rand.Text()
	creds, err := auth.CreateAccount(bundle.ctx, store, name, "")
	require.NoError(t, err, "create account")
	named, err := store.AccountsNamed(bundle.ctx, name)
	require.NoError(t, err, "accounts named")
	require.Equal(t, []uuid.UUID{creds.AccountID}, named, "accounts named %q", name)
	named, err = store.AccountsNamed(bundle.ctx, "storetest "+rand.Text())
	require.NoError(t, err, "accounts named")
	require.Empty(t, named, "no account has a new name")
	tests := []struct {
		name    string
		key     string
		want    uuid.UUID
		wantErr error
	}{
		{name: "known key", key: creds.APIKey, want: creds.AccountID},
		{name: "unknown key", key: auth.KeyPrefix + rand.Text(), wantErr: auth.ErrUnknownKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := store.AccountByKeyHash(t.Context(), auth.HashKey(tt.key))
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr, "account by key hash")
				return
			}
			require.NoError(t, err, "account by key hash")
			require.Equal(t, tt.want, got, "account by key hash")
		})
	}
}

func orderCount(t *testing.T, store Store, b *testBundle) int {
	t.Helper()
	list, err := store.ListOrders(b.ctx, b.account, nil, 1000)
	require.NoError(t, err, "list orders")
	return len(list)
}

func newAccount(t *testing.T, ctx context.Context, store auth.Store) uuid.UUID {
	t.Helper()
	creds, err := auth.CreateAccount(ctx, store, "storetest "+rand.Text(), "")
	require.NoError(t, err, "create account")
	return creds.AccountID
}

// accountOf is the account whose idempotency scope is scope.
func accountOf(scope string) uuid.UUID { return uuid.UUID([]byte(scope)) }

func newKey() string { return "storetest-" + rand.Text() }

func fingerprint(s string) idempotency.Fingerprint { return sha256.Sum256([]byte(s)) }

func claimRequest(account uuid.UUID, key string, fp idempotency.Fingerprint) idempotency.ClaimRequest {
	return idempotency.ClaimRequest{
		Scope:       auth.Scope(account),
		Key:         key,
		Fingerprint: fp,
		Method:      http.MethodPost,
		Route:       "/orders",
		TTL:         time.Hour,
		Wait:        5 * time.Second,
	}
}

func response(body string) idempotency.Response {
	return idempotency.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   []byte(body),
	}
}

// claimTx claims req in the store of operations that read as they write
// and requires a lease, which is rolled back when the test ends (a no-op
// once it ended).
func claimTx(t *testing.T, ctx context.Context, s Store, req idempotency.ClaimRequest) idempotency.Lease[store.Tx] {
	t.Helper()
	lease, rec, err := s.Keys().Claim(ctx, req)
	require.NoError(t, err, "claim key %q", req.Key)
	require.Nil(t, rec, "claim key %q: want a lease, got a record", req.Key)
	require.NotNil(t, lease, "claim key %q: want a lease, got nothing", req.Key)
	t.Cleanup(func() { _ = lease.Rollback(context.Background()) })
	// Payments and refunds record the claim they were accepted under.
	require.Equal(t, lease.Ref(), lease.Unit().Claim(), "claim key %q: the unit of work's claim", req.Key)
	return lease
}

// claimRecord claims req and requires a completed record.
func claimRecord(t *testing.T, ctx context.Context, s Store, req idempotency.ClaimRequest) *idempotency.Record {
	t.Helper()
	lease, rec, err := s.Keys().Claim(ctx, req)
	if lease != nil {
		t.Cleanup(func() { _ = lease.Rollback(context.Background()) })
	}
	require.NoError(t, err, "claim key %q", req.Key)
	require.Nil(t, lease, "claim key %q: want a record, got a lease", req.Key)
	require.NotNil(t, rec, "claim key %q: want a record, got nothing", req.Key)
	return rec
}

func commitResponse(t *testing.T, ctx context.Context, lease idempotency.Lease[store.Tx], body string) {
	t.Helper()
	require.NoError(t, lease.Commit(ctx, response(body)), "commit %q", body)
}

// receive waits for what a goroutine reports, failing rather than hanging
// the whole test binary if a store never answers.
func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		require.FailNow(t, "timed out waiting for "+what)
		var zero T
		return zero
	}
}

func newOrder(account uuid.UUID, createdAt time.Time) orders.Order {
	return orders.Order{
		AccountID: account,
		ID:        uuid.New(),
		Status:    orders.StatusCreated,
		Amount:    1999,
		Currency:  "EUR",
		Items:     []orders.Item{{SKU: "sku-1", Qty: 2}, {SKU: "sku-2", Qty: 1}},
		// PostgreSQL keeps microseconds; orders.Service truncates the same way.
		CreatedAt: createdAt.UTC().Truncate(time.Microsecond),
	}
}
