package storetest

import (
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/payments"
)

// acceptPayment does what POST /payments does under a claimed key: the
// payment and the provisional 202 commit together. It returns the payment
// as stored.
func acceptPayment(t *testing.T, store Store, bundle *testBundle, req idempotency.ClaimRequest) payments.Payment {
	t.Helper()
	order := newOrder(bundle.account, time.Now())
	require.NoError(t, store.CreateOrder(bundle.ctx, order), "create the order to pay")
	lease := claimTx(t, bundle.ctx, store, req)
	p := payments.Payment{
		AccountID: bundle.account, ID: uuid.New(), OrderID: order.ID, Amount: 1999, Currency: "EUR",
		Status: payments.StatusPending, Key: req.Key, KeyClaimedAt: lease.Ref().ClaimedAt,
		CreatedAt: time.Now().UTC().Truncate(time.Microsecond),
	}
	require.NoError(t, lease.Unit().CreatePayment(bundle.ctx, p), "create payment inside the lease")
	require.NoError(t, lease.Commit(bundle.ctx, idempotency.Response{
		Status: http.StatusAccepted, Header: http.Header{"Location": {"/payments/" + p.ID.String()}}, Body: []byte(`{"status":"pending"}`),
	}), "commit the provisional 202")
	return p
}

func finalResponse(body string) idempotency.Response {
	return idempotency.Response{Status: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(body)}
}

func settled(p payments.Payment, status, reason, charge string) payments.Payment {
	now := time.Now().UTC().Truncate(time.Microsecond)
	p.Status, p.FailureReason, p.ProviderChargeID, p.CompletedAt = status, reason, charge, &now
	return p
}

// Payments are stored per account, pending until finished once; a payment
// of an order that does not exist is refused, and a rolled-back one is gone.
func testPayments(t *testing.T, setup setupFunc) {
	store, bundle := setup(t)
	req := claimRequest(bundle.account, newKey(), fingerprint("POST /payments a"))
	p := acceptPayment(t, store, bundle, req)

	got, err := store.GetPayment(bundle.ctx, bundle.account, p.ID)
	require.NoError(t, err, "get payment")
	require.True(t, p.KeyClaimedAt.Equal(got.KeyClaimedAt), "the key binding survives the round trip: %s vs %s", p.KeyClaimedAt, got.KeyClaimedAt)
	got.KeyClaimedAt = p.KeyClaimedAt
	require.Equal(t, p, got, "stored payment")

	_, err = store.GetPayment(bundle.ctx, newAccount(t, bundle.ctx, store), p.ID)
	require.ErrorIs(t, err, payments.ErrNotFound, "another account's payment is not found")

	orphanLease := claimTx(t, bundle.ctx, store, claimRequest(bundle.account, newKey(), fingerprint("POST /payments o")))
	orphan := p
	orphan.ID, orphan.OrderID = uuid.New(), uuid.New()
	require.Error(t, orphanLease.Unit().CreatePayment(bundle.ctx, orphan), "a payment of a missing order must be refused")
	require.NoError(t, orphanLease.Rollback(bundle.ctx))

	lease := claimTx(t, bundle.ctx, store, claimRequest(bundle.account, newKey(), fingerprint("POST /payments b")))
	other := newOrder(bundle.account, time.Now())
	require.NoError(t, store.CreateOrder(bundle.ctx, other), "create another order to pay")
	rolledBack := p
	rolledBack.ID, rolledBack.OrderID = uuid.New(), other.ID
	require.NoError(t, lease.Unit().CreatePayment(bundle.ctx, rolledBack))
	require.NoError(t, lease.Rollback(bundle.ctx))
	_, err = store.GetPayment(bundle.ctx, bundle.account, rolledBack.ID)
	require.ErrorIs(t, err, payments.ErrNotFound, "a rolled-back payment must not exist")

	done := settled(p, payments.StatusSucceeded, "", "ch_1")
	changed, err := store.FinishPayment(bundle.ctx, done, finalResponse(`{"status":"succeeded"}`))
	require.NoError(t, err, "finish")
	require.True(t, changed, "the first finish changes the payment")
	got, err = store.GetPayment(bundle.ctx, bundle.account, p.ID)
	require.NoError(t, err)
	require.Equal(t, payments.StatusSucceeded, got.Status)
	require.Equal(t, "ch_1", got.ProviderChargeID)
	require.NotNil(t, got.CompletedAt, "completed_at")

	again := settled(p, payments.StatusFailed, payments.ReasonCardDeclined, "")
	changed, err = store.FinishPayment(bundle.ctx, again, finalResponse(`{"status":"failed"}`))
	require.NoError(t, err, "second finish")
	require.False(t, changed, "a final payment never changes again")
	got, err = store.GetPayment(bundle.ctx, bundle.account, p.ID)
	require.NoError(t, err)
	require.Equal(t, payments.StatusSucceeded, got.Status, "the first outcome stands")
	rec := claimRecord(t, bundle.ctx, store, req)
	require.Equal(t, `{"status":"succeeded"}`, string(rec.Response.Body), "the key replays the first outcome")
}

// Finishing a payment replaces the provisional 202 of the key record it was
// accepted under, and no other: not a record that expired and was claimed
// again for something else.
func testPaymentFinishReplacesProvisional(t *testing.T, setup setupFunc) {
	store, bundle := setup(t)
	req := claimRequest(bundle.account, newKey(), fingerprint("POST /payments a"))
	p := acceptPayment(t, store, bundle, req)
	rec := claimRecord(t, bundle.ctx, store, req)
	require.Equal(t, http.StatusAccepted, rec.Response.Status, "pending: the key replays the 202")

	_, err := store.FinishPayment(bundle.ctx, settled(p, payments.StatusSucceeded, "", "ch_1"), finalResponse(`{"status":"succeeded"}`))
	require.NoError(t, err, "finish")
	rec = claimRecord(t, bundle.ctx, store, req)
	require.Equal(t, http.StatusOK, rec.Response.Status, "final: the key replays the final response")
	require.Equal(t, `{"status":"succeeded"}`, string(rec.Response.Body))
	require.Equal(t, "application/json", rec.Response.Header.Get("Content-Type"))
	require.Equal(t, req.Fingerprint, rec.Fingerprint, "the fingerprint is the request's still")

	// A key that expired while its payment was pending and was claimed again.
	short := claimRequest(bundle.account, newKey(), fingerprint("POST /payments b"))
	short.TTL = time.Millisecond
	old := acceptPayment(t, store, bundle, short)
	time.Sleep(expiryPause)
	short.TTL = time.Hour
	lease := claimTx(t, bundle.ctx, store, short)
	require.NoError(t, lease.Commit(bundle.ctx, idempotency.Response{Status: http.StatusAccepted, Header: http.Header{}, Body: []byte("new")}))
	_, err = store.FinishPayment(bundle.ctx, settled(old, payments.StatusFailed, payments.ReasonCardDeclined, ""), finalResponse("old"))
	require.NoError(t, err, "finish the old payment")
	rec = claimRecord(t, bundle.ctx, store, short)
	require.Equal(t, "new", string(rec.Response.Body), "the old payment's outcome must not land on the key's new record")
}

// An order has at most one pending or succeeded payment, as the store
// itself holds it: a second is refused even from a caller that skipped the
// check (retrying is the answer, so the error is ErrUnavailable), and a
// failed payment does not count.
func testOneActivePaymentPerOrder(t *testing.T, setup setupFunc) {
	store, bundle := setup(t)
	first := acceptPayment(t, store, bundle, claimRequest(bundle.account, newKey(), fingerprint("POST /payments a")))

	lease := claimTx(t, bundle.ctx, store, claimRequest(bundle.account, newKey(), fingerprint("POST /payments b")))
	active, err := lease.Unit().ActivePayment(bundle.ctx, bundle.account, first.OrderID)
	require.NoError(t, err, "the pending payment is the order's active one")
	require.Equal(t, first.ID, active.ID)
	second := first
	second.ID = uuid.New()
	err = lease.Unit().CreatePayment(bundle.ctx, second)
	require.ErrorIs(t, err, idempotency.ErrUnavailable, "a second pending payment of the order must be refused")
	require.NoError(t, lease.Rollback(bundle.ctx))

	_, err = store.FinishPayment(bundle.ctx, settled(first, payments.StatusFailed, payments.ReasonCardDeclined, ""), finalResponse(`{"status":"failed"}`))
	require.NoError(t, err)
	req := claimRequest(bundle.account, newKey(), fingerprint("POST /payments c"))
	lease = claimTx(t, bundle.ctx, store, req)
	_, err = lease.Unit().ActivePayment(bundle.ctx, bundle.account, first.OrderID)
	require.ErrorIs(t, err, payments.ErrNotFound, "a failed payment is not active")
	second.KeyClaimedAt, second.Key = lease.Ref().ClaimedAt, req.Key
	require.NoError(t, lease.Unit().CreatePayment(bundle.ctx, second), "after a failed payment the order can be paid")
	require.NoError(t, lease.Commit(bundle.ctx, idempotency.Response{Status: http.StatusAccepted, Header: http.Header{}, Body: []byte("{}")}))
	got, err := store.GetPayment(bundle.ctx, bundle.account, second.ID)
	require.NoError(t, err)
	require.Equal(t, payments.StatusPending, got.Status)
}
