package storetest

import (
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/orders"
	"github.com/oncekey/oncekey/internal/service/payments"
)

// Orders change and are cancelled through a lease: the change commits with
// it or not at all, and an order's payments decide whether it may change.
func testOrderChanges(t *testing.T, setup setupFunc) {
	store, bundle := setup(t)
	ctx := bundle.ctx
	o := newOrder(bundle.account, time.Now())
	require.NoError(t, store.CreateOrder(ctx, o))

	lease := claimTx(t, ctx, store, claimRequest(bundle.account, newKey(), fingerprint("PATCH a")))
	locked, err := lease.Unit().LockOrder(ctx, bundle.account, o.ID)
	require.NoError(t, err, "lock order")
	require.Equal(t, o, locked, "the locked order is the stored one")
	active, err := lease.Unit().HasActivePayment(ctx, bundle.account, o.ID)
	require.NoError(t, err)
	require.False(t, active, "a new order has no payment")
	changed := locked
	changed.Amount, changed.Items = 777, []orders.Item{{SKU: "NEW", Qty: 7}}
	require.NoError(t, lease.Unit().UpdateOrder(ctx, changed))
	require.NoError(t, lease.Rollback(ctx))
	got, err := store.GetOrder(ctx, bundle.account, o.ID)
	require.NoError(t, err)
	require.Equal(t, o, got, "a rolled-back change leaves the order as it was")

	lease = claimTx(t, ctx, store, claimRequest(bundle.account, newKey(), fingerprint("DELETE b")))
	cancelled := changed
	at := time.Now().UTC().Truncate(time.Microsecond)
	cancelled.Status, cancelled.CancelledAt = orders.StatusCancelled, &at
	require.NoError(t, lease.Unit().UpdateOrder(ctx, cancelled))
	commitResponse(t, ctx, lease, `{"status":"cancelled"}`)
	got, err = store.GetOrder(ctx, bundle.account, o.ID)
	require.NoError(t, err)
	require.Equal(t, cancelled, got, "a committed change is stored, cancellation time included")

	lease = claimTx(t, ctx, store, claimRequest(bundle.account, newKey(), fingerprint("PATCH c")))
	_, err = lease.Unit().LockOrder(ctx, bundle.account, uuid.New())
	require.ErrorIs(t, err, orders.ErrNotFound, "lock a missing order")
	_, err = lease.Unit().LockOrder(ctx, newAccount(t, ctx, store), o.ID)
	require.ErrorIs(t, err, orders.ErrNotFound, "lock another account's order")
	missing := newOrder(bundle.account, time.Now())
	require.ErrorIs(t, lease.Unit().UpdateOrder(ctx, missing), orders.ErrNotFound, "update a missing order")
	require.NoError(t, lease.Rollback(ctx))

	// A pending payment makes the order's payment active; a failed one
	// does not.
	p := acceptPayment(t, store, bundle, claimRequest(bundle.account, newKey(), fingerprint("POST /payments")))
	for _, tc := range []struct {
		name   string
		finish *payments.Payment
		active bool
	}{
		{"pending", nil, true},
		{"failed", new(settled(p, payments.StatusFailed, payments.ReasonCardDeclined, "")), false},
	} {
		if tc.finish != nil {
			_, err := store.FinishPayment(ctx, *tc.finish, finalResponse(`{}`))
			require.NoError(t, err)
		}
		lease := claimTx(t, ctx, store, claimRequest(bundle.account, newKey(), fingerprint("DELETE "+tc.name)))
		active, err := lease.Unit().HasActivePayment(ctx, bundle.account, p.OrderID)
		require.NoError(t, err)
		require.Equal(t, tc.active, active, "an order with a %s payment", tc.name)
		require.NoError(t, lease.Rollback(ctx))
	}
}

// LockOrder holds the order until the lease ends: a second lease locking it
// waits, and then sees what the first one wrote.
func testOrderLockSerializes(t *testing.T, setup setupFunc) {
	store, bundle := setup(t)
	ctx := bundle.ctx
	o := newOrder(bundle.account, time.Now())
	require.NoError(t, store.CreateOrder(ctx, o))

	first := claimTx(t, ctx, store, claimRequest(bundle.account, newKey(), fingerprint("PATCH 1")))
	locked, err := first.Unit().LockOrder(ctx, bundle.account, o.ID)
	require.NoError(t, err)
	locked.Amount = 4242
	require.NoError(t, first.Unit().UpdateOrder(ctx, locked))

	seen := make(chan orders.Order, 1)
	go func() {
		second := claimTx(t, ctx, store, claimRequest(bundle.account, newKey(), fingerprint("PATCH 2")))
		o, err := second.Unit().LockOrder(ctx, bundle.account, o.ID)
		if err != nil {
			t.Error(err)
		}
		_ = second.Rollback(ctx)
		seen <- o
	}()
	select {
	case o := <-seen:
		t.Fatalf("the second lock returned %+v while the first lease held the order", o)
	case <-time.After(200 * time.Millisecond):
	}
	commitResponse(t, ctx, first, `{}`)
	got := receive(t, seen, "the second lock, once the first lease committed")
	require.EqualValues(t, 4242, got.Amount, "the second lease sees the first one's change")
}

// acceptRefund does what POST /payments/{id}/refunds does under a claimed
// key: lock the payment, sum its refunds, store the refund and enqueue it,
// committing with the provisional 202.
func acceptRefund(t *testing.T, store Store, bundle *testBundle, p payments.Payment, amount int64, req idempotency.ClaimRequest) payments.Refund {
	t.Helper()
	ctx := bundle.ctx
	lease := claimTx(t, ctx, store, req)
	locked, err := lease.Unit().LockPayment(ctx, bundle.account, p.ID)
	require.NoError(t, err, "lock payment")
	require.Equal(t, p.ID, locked.ID)
	r := payments.Refund{
		AccountID: bundle.account, ID: uuid.New(), PaymentID: p.ID, Amount: amount, Currency: p.Currency, Reason: "returned",
		Status: payments.StatusPending, Key: req.Key, KeyClaimedAt: lease.Ref().ClaimedAt,
		CreatedAt: time.Now().UTC().Truncate(time.Microsecond),
	}
	require.NoError(t, lease.Unit().CreateRefund(ctx, r), "create refund")
	require.NoError(t, lease.Unit().EnqueueRefund(ctx, payments.RefundRef{AccountID: bundle.account, RefundID: r.ID}), "enqueue refund")
	require.NoError(t, lease.Commit(ctx, idempotency.Response{
		Status: http.StatusAccepted, Header: http.Header{"Location": {"/refunds/" + r.ID.String()}}, Body: []byte(`{"status":"pending"}`),
	}))
	return r
}

// Refunds are stored per account and payment, listed oldest first, summed
// without the failed ones, finished once with their key's final response.
func testRefunds(t *testing.T, setup setupFunc) {
	store, bundle := setup(t)
	ctx := bundle.ctx
	p := acceptPayment(t, store, bundle, claimRequest(bundle.account, newKey(), fingerprint("POST /payments")))
	_, err := store.FinishPayment(ctx, settled(p, payments.StatusSucceeded, "", "ch_1"), finalResponse(`{}`))
	require.NoError(t, err)

	firstReq := claimRequest(bundle.account, newKey(), fingerprint("POST refund 1"))
	first := acceptRefund(t, store, bundle, p, 300, firstReq)
	second := acceptRefund(t, store, bundle, p, 500, claimRequest(bundle.account, newKey(), fingerprint("POST refund 2")))

	got, err := store.GetRefund(ctx, bundle.account, first.ID)
	require.NoError(t, err)
	require.True(t, first.KeyClaimedAt.Equal(got.KeyClaimedAt))
	got.KeyClaimedAt = first.KeyClaimedAt
	require.Equal(t, first, got, "stored refund")
	_, err = store.GetRefund(ctx, newAccount(t, ctx, store), first.ID)
	require.ErrorIs(t, err, payments.ErrRefundNotFound, "another account's refund")
	list, err := store.ListRefunds(ctx, bundle.account, p.ID)
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Equal(t, []uuid.UUID{first.ID, second.ID}, []uuid.UUID{list[0].ID, list[1].ID}, "oldest first")

	totals := func(what string) (int64, int) {
		t.Helper()
		lease := claimTx(t, ctx, store, claimRequest(bundle.account, newKey(), fingerprint("totals "+what)))
		defer func() { require.NoError(t, lease.Rollback(ctx)) }()
		refunded, n, err := lease.Unit().RefundTotals(ctx, bundle.account, p.ID)
		require.NoError(t, err, what)
		return refunded, n
	}
	refunded, n := totals("pending")
	require.Equal(t, []int64{800, 2}, []int64{refunded, int64(n)}, "pending refunds count")

	failed := second
	now := time.Now().UTC().Truncate(time.Microsecond)
	failed.Status, failed.FailureReason, failed.CompletedAt = payments.StatusFailed, payments.ReasonRefundDeclined, &now
	changed, err := store.FinishRefund(ctx, failed, finalResponse(`{"status":"failed"}`))
	require.NoError(t, err)
	require.True(t, changed)
	refunded, n = totals("one failed")
	require.Equal(t, []int64{300, 2}, []int64{refunded, int64(n)}, "a failed refund is not refunded money, but still a refund")

	done := first
	done.Status, done.ProviderRefundID, done.CompletedAt = payments.StatusSucceeded, "re_1", &now
	changed, err = store.FinishRefund(ctx, done, finalResponse(`{"status":"succeeded"}`))
	require.NoError(t, err)
	require.True(t, changed)
	changed, err = store.FinishRefund(ctx, failed, finalResponse(`{"status":"failed"}`))
	require.NoError(t, err)
	require.False(t, changed, "a final refund never changes again")
	got, err = store.GetRefund(ctx, bundle.account, first.ID)
	require.NoError(t, err)
	require.Equal(t, "re_1", got.ProviderRefundID)
	rec := claimRecord(t, ctx, store, firstReq)
	require.Equal(t, http.StatusOK, rec.Response.Status, "the key replays the final response")
	require.Equal(t, `{"status":"succeeded"}`, string(rec.Response.Body))

	lease := claimTx(t, ctx, store, claimRequest(bundle.account, newKey(), fingerprint("refund missing")))
	_, err = lease.Unit().LockPayment(ctx, bundle.account, uuid.New())
	require.ErrorIs(t, err, payments.ErrNotFound, "lock a missing payment")
	orphan := first
	orphan.ID, orphan.PaymentID = uuid.New(), uuid.New()
	require.Error(t, lease.Unit().CreateRefund(ctx, orphan), "a refund of a missing payment must be refused")
	require.NoError(t, lease.Rollback(ctx))

	lease = claimTx(t, ctx, store, claimRequest(bundle.account, newKey(), fingerprint("refund rolled back")))
	gone := first
	gone.ID = uuid.New()
	require.NoError(t, lease.Unit().CreateRefund(ctx, gone))
	require.NoError(t, lease.Rollback(ctx))
	_, err = store.GetRefund(ctx, bundle.account, gone.ID)
	require.ErrorIs(t, err, payments.ErrRefundNotFound, "a rolled-back refund must not exist")
}
