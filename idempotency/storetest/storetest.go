// Package storetest is the conformance suite of the storage implementations.
// The in-memory and the PostgreSQL store both run it, so they keep the same
// semantics: what the idempotency middleware and the order service rely on
// is pinned here once, not per implementation.
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

	"github.com/oncekey/oncekey/internal/auth"
	"github.com/oncekey/oncekey/internal/idempotency"
	"github.com/oncekey/oncekey/internal/ledger"
	"github.com/oncekey/oncekey/internal/orders"
	"github.com/oncekey/oncekey/internal/payments"
)

// Store is everything a storage implementation provides.
type Store interface {
	idempotency.Store
	orders.Repository
	ledger.Repository
	payments.Repository
	auth.Store
	PurgeExpired(ctx context.Context, batch int) (int64, error)
}

// clockSlack absorbs the difference between the test's clock and the
// store's (PostgreSQL stamps records with the database's now()).
const clockSlack = time.Second

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
		{"ClaimCommitReplay", testClaimCommitReplay},
		{"ReplayEmptyBody", testReplayEmptyBody},
		{"FingerprintMismatchReturnsOriginalRecord", testFingerprintMismatch},
		{"KeysAreScopedPerAccount", testKeysScopedPerAccount},
		{"RollbackFreesKeyAndDiscardsWrites", testRollback},
		{"ConcurrentClaimWaitsForHolder", testConcurrentClaimWaits},
		{"WaitIsBoundedAcrossHolders", testWaitBoundedAcrossHolders},
		{"LeaseWritesNotBoundByClaimWait", testLeaseWritesNotBoundByClaimWait},
		{"ExpiredKeyIsAbsent", testExpiredKeyIsAbsent},
		{"PurgeExpired", testPurgeExpired},
		{"Orders", testOrders},
		{"Accounts", testAccounts},
		{"ConcurrentClaimsRunOnce", testConcurrentClaimsRunOnce},
		{"UncommittedWritesInvisible", testUncommittedWritesInvisible},
		{"Deferred", testDeferred},
		{"Ledger", testLedger},
		{"LedgerConcurrentDebits", testLedgerConcurrentDebits},
		{"LedgerRollbackUndoesEntry", testLedgerRollback},
		{"Payments", testPayments},
		{"PaymentFinishReplacesProvisionalResponse", testPaymentFinishReplacesProvisional},
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

// 1. A fresh key gives a lease; after Commit the same request replays the
// exact stored response.
func testClaimCommitReplay(t *testing.T, setup setupFunc) {
	store, bundle := setup(t)
	req := claimRequest(bundle.account, newKey(), fingerprint("POST /orders x"))
	// Unsorted keys, odd spacing and a trailing newline: a store that
	// normalises JSON (jsonb would) fails here.
	body := []byte("{\"id\":\"x\",\"amount\":1999, \"currency\":\"EUR\",\"items\":[{\"sku\":\"b\",\"qty\":1}]}\n")
	header := http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/x"}}

	before := time.Now()
	lease := claimLease(t, bundle.ctx, store, req)
	resp := idempotency.Response{Status: http.StatusCreated, Header: header.Clone(), Body: slices.Clone(body)}
	require.NoError(t, lease.Commit(bundle.ctx, resp), "commit")
	after := time.Now()

	// The store keeps its own copy: a caller reusing its buffers must not
	// rewrite what is replayed.
	resp.Body[0] = 'X'
	resp.Header.Set("Location", "/elsewhere")

	rec := claimRecord(t, bundle.ctx, store, req)
	require.Equal(t, body, rec.Response.Body, "replayed body must be byte-identical")
	require.Equal(t, http.StatusCreated, rec.Response.Status, "replayed status")
	require.Equal(t, header, rec.Response.Header, "replayed header")
	require.Equal(t, req.Fingerprint, rec.Fingerprint, "stored fingerprint")
	require.WithinRange(t, rec.CreatedAt, before.Add(-clockSlack), after.Add(clockSlack), "record CreatedAt")
	require.WithinRange(t, rec.ExpiresAt, before.Add(req.TTL-clockSlack), after.Add(req.TTL+clockSlack),
		"record ExpiresAt must be about now+TTL")

	// Every replay is a copy too.
	rec.Response.Body[0] = 'X'
	rec.Response.Header.Set("Location", "/elsewhere")
	again := claimRecord(t, bundle.ctx, store, req)
	require.Equal(t, body, again.Response.Body, "second replay body after the first was mutated")
	require.Equal(t, header, again.Response.Header, "second replay header after the first was mutated")
}

// A stored response may have no body (204, or a handler that writes
// nothing: the middleware then commits a nil Body).
func testReplayEmptyBody(t *testing.T, setup setupFunc) {
	tests := []struct {
		name string
		body []byte
	}{
		{name: "nil body", body: nil},
		{name: "empty body", body: []byte{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			store, bundle := setup(t)
			req := claimRequest(bundle.account, newKey(), fingerprint("DELETE /orders/x"))
			lease := claimLease(t, bundle.ctx, store, req)
			resp := idempotency.Response{Status: http.StatusNoContent, Header: http.Header{}, Body: tt.body}
			require.NoError(t, lease.Commit(bundle.ctx, resp), "commit a response with an empty body")

			rec := claimRecord(t, bundle.ctx, store, req)
			require.Equal(t, http.StatusNoContent, rec.Response.Status, "replayed status")
			require.Empty(t, rec.Response.Body, "replayed body")
			require.Empty(t, rec.Response.Header, "replayed header")
		})
	}
}

// 2. Another fingerprint on a completed key gets the record as stored; the
// caller, not the store, turns the mismatch into a 409.
func testFingerprintMismatch(t *testing.T, setup setupFunc) {
	store, bundle := setup(t)
	req := claimRequest(bundle.account, newKey(), fingerprint("POST /orders amount=1"))
	commitResponse(t, bundle.ctx, claimLease(t, bundle.ctx, store, req), "first\n")

	other := req
	other.Fingerprint = fingerprint("POST /orders amount=2")
	rec := claimRecord(t, bundle.ctx, store, other)
	require.Equal(t, req.Fingerprint, rec.Fingerprint, "the record must carry the ORIGINAL fingerprint")
	require.Equal(t, []byte("first\n"), rec.Response.Body, "the record must carry the original response")
}

// 3. The same key string under two accounts is two keys.
func testKeysScopedPerAccount(t *testing.T, setup setupFunc) {
	store, bundle := setup(t)
	other := newAccount(t, bundle.ctx, store)
	key := newKey()
	reqA := claimRequest(bundle.account, key, fingerprint("A"))
	reqB := claimRequest(other, key, fingerprint("B"))
	// A short wait: if the key were shared, B would wait on A's open lease.
	reqB.Wait = 200 * time.Millisecond

	leaseA := claimLease(t, bundle.ctx, store, reqA)
	leaseB := claimLease(t, bundle.ctx, store, reqB)
	commitResponse(t, bundle.ctx, leaseA, "account A\n")
	commitResponse(t, bundle.ctx, leaseB, "account B\n")

	recA := claimRecord(t, bundle.ctx, store, reqA)
	recB := claimRecord(t, bundle.ctx, store, reqB)
	require.Equal(t, []byte("account A\n"), recA.Response.Body, "account A's replay")
	require.Equal(t, reqA.Fingerprint, recA.Fingerprint, "account A's fingerprint")
	require.Equal(t, []byte("account B\n"), recB.Response.Body, "account B's replay")
	require.Equal(t, reqB.Fingerprint, recB.Fingerprint, "account B's fingerprint")
}

// 4. Rollback frees the key and takes the lease's domain writes with it;
// Commit makes them visible; Rollback after Commit does nothing.
func testRollback(t *testing.T, setup setupFunc) {
	store, bundle := setup(t)
	ctx := bundle.ctx
	req := claimRequest(bundle.account, newKey(), fingerprint("POST /orders"))

	lease := claimLease(t, ctx, store, req)
	discarded := newOrder(bundle.account, time.Now())
	require.NoError(t, store.CreateOrder(lease.Context(ctx), discarded), "create order in lease")
	got, err := store.GetOrder(lease.Context(ctx), bundle.account, discarded.ID)
	require.NoError(t, err, "the lease must read its own uncommitted write")
	require.Equal(t, discarded, got, "order read inside the lease")
	require.NoError(t, lease.Rollback(ctx), "rollback")
	_, err = store.GetOrder(ctx, bundle.account, discarded.ID)
	require.ErrorIs(t, err, orders.ErrNotFound, "an order written in a rolled-back lease must be gone")

	lease = claimLease(t, ctx, store, req) // the key is free again
	kept := newOrder(bundle.account, time.Now())
	require.NoError(t, store.CreateOrder(lease.Context(ctx), kept), "create order in lease")
	commitResponse(t, ctx, lease, "created\n")
	require.NoError(t, lease.Rollback(ctx), "Rollback after Commit must be a no-op")

	got, err = store.GetOrder(ctx, bundle.account, kept.ID)
	require.NoError(t, err, "an order written in a committed lease must be visible")
	require.Equal(t, kept, got, "committed order")
	rec := claimRecord(t, ctx, store, req)
	require.Equal(t, []byte("created\n"), rec.Response.Body, "Rollback after Commit must keep the record")
}

// 5. A claim on a key whose holder is still running waits for it, up to Wait.
func testConcurrentClaimWaits(t *testing.T, setup setupFunc) {
	tests := []struct {
		name string
		wait time.Duration
		// settle ends the holder's lease while the waiter waits; nil leaves
		// it open for longer than the wait.
		settle func(ctx context.Context, lease idempotency.Lease) error
		want   func(t *testing.T, req idempotency.ClaimRequest, res claimResult)
	}{
		{
			name: "holder commits",
			wait: 5 * time.Second,
			settle: func(ctx context.Context, lease idempotency.Lease) error {
				return lease.Commit(ctx, response("holder\n"))
			},
			want: func(t *testing.T, req idempotency.ClaimRequest, res claimResult) {
				require.NoError(t, res.err, "waiter's claim")
				require.Nil(t, res.lease, "waiter must not get a lease on a committed key")
				require.NotNil(t, res.rec, "waiter must get the holder's record")
				require.Equal(t, []byte("holder\n"), res.rec.Response.Body, "waiter's replay")
				require.Equal(t, req.Fingerprint, res.rec.Fingerprint, "waiter's record fingerprint")
			},
		},
		{
			name: "holder rolls back",
			wait: 5 * time.Second,
			settle: func(ctx context.Context, lease idempotency.Lease) error {
				return lease.Rollback(ctx)
			},
			want: func(t *testing.T, req idempotency.ClaimRequest, res claimResult) {
				require.NoError(t, res.err, "waiter's claim")
				require.Nil(t, res.rec, "waiter must not get a record for a rolled-back key")
				require.NotNil(t, res.lease, "waiter must get the freed key")
			},
		},
		{
			name: "holder does not settle within the wait",
			wait: 200 * time.Millisecond,
			want: func(t *testing.T, req idempotency.ClaimRequest, res claimResult) {
				require.ErrorIs(t, res.err, idempotency.ErrInFlight, "waiter's claim (lease=%v, record=%v)", res.lease, res.rec)
				// Not at once (it must wait) and not much later (Wait bounds it).
				require.GreaterOrEqual(t, res.elapsed, 150*time.Millisecond, "ErrInFlight came before the wait was over")
				require.Less(t, res.elapsed, 5*time.Second, "ErrInFlight came long after the wait was over")
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			store, bundle := setup(t)
			req := claimRequest(bundle.account, newKey(), fingerprint("POST /orders"))
			req.Wait = tt.wait
			holder := claimLease(t, bundle.ctx, store, req)

			waiter := claimAsync(bundle.ctx, store, req)
			if tt.settle != nil {
				time.Sleep(100 * time.Millisecond) // let the waiter reach its wait
				select {
				case res := <-waiter:
					require.FailNow(t, "the waiter returned while the holder was still running",
						"lease=%v record=%v err=%v", res.lease, res.rec, res.err)
				default:
				}
				require.NoError(t, tt.settle(bundle.ctx, holder), "settle the holder")
			}
			res := receive(t, waiter, "the waiter's claim")
			if res.lease != nil {
				t.Cleanup(func() { _ = res.lease.Rollback(context.Background()) })
			}
			tt.want(t, req, res)
		})
	}
}

// Wait bounds the claim only: once a lease is granted, its domain writes may
// wait on other units of work for as long as they take (in PostgreSQL, the
// claim's lock_timeout must not outlive the claim).
// The wait budget bounds a claim as a whole: a waiter that waits behind one
// holder, then behind the next one (who took over when the first rolled
// back), still returns within about Wait, not Wait per holder.
func testWaitBoundedAcrossHolders(t *testing.T, setup setupFunc) {
	store, bundle := setup(t)
	const wait = 800 * time.Millisecond
	req := claimRequest(bundle.account, newKey(), fingerprint("POST /orders chain"))
	req.Wait = wait

	first, _, err := store.Claim(bundle.ctx, req)
	require.NoError(t, err)
	require.NotNil(t, first)

	// Two waiters: one takes the key over when the first holder rolls back
	// and keeps it; the other must give up at the budget's end.
	type result struct {
		lease   idempotency.Lease
		err     error
		elapsed time.Duration
	}
	results := make(chan result, 2)
	for range 2 {
		go func() {
			start := time.Now()
			lease, _, err := store.Claim(bundle.ctx, req)
			results <- result{lease, err, time.Since(start)}
		}()
	}
	time.Sleep(wait * 3 / 4)
	require.NoError(t, first.Rollback(bundle.ctx))

	var takeover, gaveUp *result
	for range 2 {
		r := <-results
		switch {
		case r.lease != nil:
			takeover = &r
		case errors.Is(r.err, idempotency.ErrInFlight):
			gaveUp = &r
		default:
			t.Fatalf("unexpected claim result: %+v", r)
		}
	}
	require.NotNil(t, takeover, "one waiter takes the freed key over")
	require.NotNil(t, gaveUp, "the other waits behind the new holder and gives up")
	// Per-holder budgets would make this wait*3/4 + wait; stores may take
	// a little slack for the claim statement itself.
	require.Less(t, gaveUp.elapsed, wait+450*time.Millisecond, "the wait budget is for the whole claim, not per holder")
	require.NoError(t, takeover.lease.Rollback(bundle.ctx))
}

func testLeaseWritesNotBoundByClaimWait(t *testing.T, setup setupFunc) {
	store, bundle := setup(t)
	ctx := bundle.ctx
	wait := 200 * time.Millisecond
	firstReq := claimRequest(bundle.account, newKey(), fingerprint("first"))
	firstReq.Wait = wait
	secondReq := claimRequest(bundle.account, newKey(), fingerprint("second"))
	secondReq.Wait = wait

	first := claimLease(t, ctx, store, firstReq)
	o := newOrder(bundle.account, time.Now())
	require.NoError(t, store.CreateOrder(first.Context(ctx), o), "create order in the first lease")

	second := claimLease(t, ctx, store, secondReq)
	done := make(chan error, 1)
	go func() { done <- store.CreateOrder(second.Context(ctx), o) }()
	// Registered last, so it runs first if the test fails: the second lease
	// cannot settle while its write waits on the first.
	t.Cleanup(func() { _ = first.Rollback(context.Background()) })

	time.Sleep(3 * wait)
	select {
	case err := <-done:
		require.FailNow(t, "the second lease's write did not wait for the first lease",
			"it returned %v while the first lease, writing the same order, was still open", err)
	default:
	}
	require.NoError(t, first.Rollback(ctx), "roll back the first lease")
	require.NoError(t, receive(t, done, "the second lease's write"), "the second lease's write after the first rolled back")
	commitResponse(t, ctx, second, "second\n")

	got, err := store.GetOrder(ctx, bundle.account, o.ID)
	require.NoError(t, err, "order committed by the second lease")
	require.Equal(t, o, got, "order committed by the second lease")
}

// 6. An expired record is absent: the key can be claimed again, whatever
// the fingerprint.
func testExpiredKeyIsAbsent(t *testing.T, setup setupFunc) {
	tests := []struct {
		name  string
		again string // fingerprint source of the claim after expiry
	}{
		{name: "same fingerprint", again: "original"},
		{name: "different fingerprint", again: "different"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			store, bundle := setup(t)
			req := claimRequest(bundle.account, newKey(), fingerprint("original"))
			req.TTL = time.Millisecond
			commitResponse(t, bundle.ctx, claimLease(t, bundle.ctx, store, req), "old\n")
			time.Sleep(expiryPause)

			again := claimRequest(bundle.account, req.Key, fingerprint(tt.again))
			commitResponse(t, bundle.ctx, claimLease(t, bundle.ctx, store, again), "new\n")
			rec := claimRecord(t, bundle.ctx, store, again)
			require.Equal(t, again.Fingerprint, rec.Fingerprint, "fingerprint of the record stored after expiry")
			require.Equal(t, []byte("new\n"), rec.Response.Body, "body of the record stored after expiry")
		})
	}
}

// 7. PurgeExpired deletes expired records, in batches, and keeps live ones
// and in-flight claims.
func testPurgeExpired(t *testing.T, setup setupFunc) {
	store, bundle := setup(t)
	ctx := bundle.ctx
	const batch = 2
	expired := make([]idempotency.ClaimRequest, batch+1) // more than one batch
	for i := range expired {
		expired[i] = claimRequest(bundle.account, newKey(), fingerprint("expired"))
		expired[i].TTL = time.Millisecond
		commitResponse(t, ctx, claimLease(t, ctx, store, expired[i]), "expired\n")
	}
	live := claimRequest(bundle.account, newKey(), fingerprint("live"))
	commitResponse(t, ctx, claimLease(t, ctx, store, live), "live\n")
	inFlightReq := claimRequest(bundle.account, newKey(), fingerprint("in flight"))
	inFlightReq.TTL = time.Millisecond
	inFlight := claimLease(t, ctx, store, inFlightReq)
	time.Sleep(expiryPause)

	n, err := store.PurgeExpired(ctx, batch)
	require.NoError(t, err, "purge")
	// Other tests on the same database add expired keys of their own.
	require.GreaterOrEqual(t, n, int64(len(expired)), "purged count")

	rec := claimRecord(t, ctx, store, live)
	require.Equal(t, []byte("live\n"), rec.Response.Body, "a live record must survive the purge")
	require.NoError(t, inFlight.Commit(ctx, response("in flight\n")), "commit a claim that was in flight during the purge")
	for _, req := range expired {
		claimLease(t, ctx, store, req)
	}
}

// 8. Orders: read back as written, per account, listed newest first with a
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

// 9. Accounts are found by the hash of their API key.
func testAccounts(t *testing.T, setup setupFunc) {
	store, bundle := setup(t)
	creds, err := auth.CreateAccount(bundle.ctx, store, "storetest "+rand.Text(), "")
	require.NoError(t, err, "create account")
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

// 10. Of many concurrent identical requests exactly one runs the operation;
// the others replay its outcome.
func testConcurrentClaimsRunOnce(t *testing.T, setup setupFunc) {
	tests := []struct {
		name    string
		expired bool // the key holds an expired record when the race starts
	}{
		{name: "fresh key"},
		{name: "expired key", expired: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			const claimers = 50
			store, bundle := setup(t)
			ctx := bundle.ctx
			req := claimRequest(bundle.account, newKey(), fingerprint("POST /orders"))
			req.Wait = 5 * time.Second // long enough that no one gets ErrInFlight
			if tt.expired {
				old := req
				old.TTL = time.Millisecond
				commitResponse(t, ctx, claimLease(t, ctx, store, old), "expired\n")
				time.Sleep(expiryPause)
			}

			start := make(chan struct{})
			results := make([]claimResult, claimers)
			var wg sync.WaitGroup
			for i := range claimers {
				wg.Go(func() {
					<-start
					lease, rec, err := store.Claim(ctx, req)
					results[i] = claimResult{lease: lease, rec: rec, err: err}
					if err != nil || lease == nil {
						return
					}
					defer func() { _ = lease.Rollback(context.WithoutCancel(ctx)) }()
					if err := store.CreateOrder(lease.Context(ctx), newOrder(bundle.account, time.Now())); err != nil {
						results[i].err = err
						return
					}
					results[i].err = lease.Commit(ctx, response("the one\n"))
				})
			}
			close(start)
			wg.Wait()

			leases := 0
			for i, res := range results {
				require.NoError(t, res.err, "claimer %d", i)
				if res.lease != nil {
					leases++
					continue
				}
				require.NotNil(t, res.rec, "claimer %d got neither a lease nor a record", i)
				require.Equal(t, []byte("the one\n"), res.rec.Response.Body, "claimer %d's replay", i)
				require.Equal(t, req.Fingerprint, res.rec.Fingerprint, "claimer %d's record fingerprint", i)
			}
			require.Equal(t, 1, leases, "leases granted among %d concurrent claims", claimers)
			list, err := store.ListOrders(ctx, bundle.account, nil, claimers+1)
			require.NoError(t, err, "list orders")
			require.Len(t, list, 1, "orders created by %d concurrent identical requests", claimers)
		})
	}
}

// 11. A write inside an open lease is seen by no one else, and a rolled-back
// one never. The memory store makes readers wait for the lease; PostgreSQL
// answers at once from the committed state. Both are fine.
func testUncommittedWritesInvisible(t *testing.T, setup setupFunc) {
	store, bundle := setup(t)
	ctx := bundle.ctx
	lease := claimLease(t, ctx, store, claimRequest(bundle.account, newKey(), fingerprint("POST /orders")))
	o := newOrder(bundle.account, time.Now())
	require.NoError(t, store.CreateOrder(lease.Context(ctx), o), "create order in lease")

	type getResult struct {
		order orders.Order
		err   error
	}
	type listResult struct {
		list []orders.Order
		err  error
	}
	gets := make(chan getResult, 1)
	lists := make(chan listResult, 1)
	go func() {
		got, err := store.GetOrder(ctx, bundle.account, o.ID)
		gets <- getResult{got, err}
	}()
	go func() {
		list, err := store.ListOrders(ctx, bundle.account, nil, 10)
		lists <- listResult{list, err}
	}()
	time.Sleep(50 * time.Millisecond) // let the readers start
	require.NoError(t, lease.Rollback(ctx), "rollback")

	get := receive(t, gets, "the outside GetOrder")
	require.ErrorIs(t, get.err, orders.ErrNotFound, "outside GetOrder of an uncommitted, then rolled-back order (got %+v)", get.order)
	list := receive(t, lists, "the outside ListOrders")
	require.NoError(t, list.err, "outside ListOrders")
	require.Empty(t, list.list, "outside ListOrders must not show an uncommitted, then rolled-back order")
}

func newAccount(t *testing.T, ctx context.Context, store auth.Store) uuid.UUID {
	t.Helper()
	creds, err := auth.CreateAccount(ctx, store, "storetest "+rand.Text(), "")
	require.NoError(t, err, "create account")
	return creds.AccountID
}

func newKey() string { return "storetest-" + rand.Text() }

func fingerprint(s string) idempotency.Fingerprint { return sha256.Sum256([]byte(s)) }

func claimRequest(account uuid.UUID, key string, fp idempotency.Fingerprint) idempotency.ClaimRequest {
	return idempotency.ClaimRequest{
		Account:     account,
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

// claimLease claims req and requires a lease, which is rolled back when the
// test ends (a no-op once settled).
func claimLease(t *testing.T, ctx context.Context, store Store, req idempotency.ClaimRequest) idempotency.Lease {
	t.Helper()
	lease, rec, err := store.Claim(ctx, req)
	require.NoError(t, err, "claim key %q", req.Key)
	require.Nil(t, rec, "claim key %q: want a lease, got a record", req.Key)
	require.NotNil(t, lease, "claim key %q: want a lease, got nothing", req.Key)
	t.Cleanup(func() { _ = lease.Rollback(context.Background()) })
	return lease
}

// claimRecord claims req and requires a completed record.
func claimRecord(t *testing.T, ctx context.Context, store Store, req idempotency.ClaimRequest) *idempotency.Record {
	t.Helper()
	lease, rec, err := store.Claim(ctx, req)
	if lease != nil {
		t.Cleanup(func() { _ = lease.Rollback(context.Background()) })
	}
	require.NoError(t, err, "claim key %q", req.Key)
	require.Nil(t, lease, "claim key %q: want a record, got a lease", req.Key)
	require.NotNil(t, rec, "claim key %q: want a record, got nothing", req.Key)
	return rec
}

func commitResponse(t *testing.T, ctx context.Context, lease idempotency.Lease, body string) {
	t.Helper()
	require.NoError(t, lease.Commit(ctx, response(body)), "commit %q", body)
}

type claimResult struct {
	lease   idempotency.Lease
	rec     *idempotency.Record
	err     error
	elapsed time.Duration
}

func claimAsync(ctx context.Context, store Store, req idempotency.ClaimRequest) <-chan claimResult {
	ch := make(chan claimResult, 1)
	go func() {
		start := time.Now()
		lease, rec, err := store.Claim(ctx, req)
		ch <- claimResult{lease: lease, rec: rec, err: err, elapsed: time.Since(start)}
	}()
	return ch
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
