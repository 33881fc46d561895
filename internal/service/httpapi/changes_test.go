package httpapi_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/gen/api"
	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/orders"
	"github.com/oncekey/oncekey/internal/service/payments"
	"github.com/oncekey/oncekey/internal/service/servicetest"
	"github.com/oncekey/oncekey/internal/wire/problem"
)

// mergePatch is PATCH's media type.
const mergePatch = "application/merge-patch+json"

// patchOrder sends PATCH /orders/{id} with body under key.
func (b *testBundle) patchOrder(t *testing.T, id, key, body string) reply {
	t.Helper()
	return b.do(t, b.newRequest(t, http.MethodPatch, "/orders/"+id, strings.NewReader(body), "Content-Type", mergePatch, idempotency.HeaderKey, key))
}

// cancelOrder sends DELETE /orders/{id} under key (none if empty).
func (b *testBundle) cancelOrder(t *testing.T, id, key string) reply {
	t.Helper()
	return b.do(t, b.newRequest(t, http.MethodDelete, "/orders/"+id, nil, idempotency.HeaderKey, key))
}

// newOrderID creates an order from seedBody and returns its id.
func (b *testBundle) newOrderID(t *testing.T) string {
	t.Helper()
	return b.orderOf(t, 1200)
}

// orderOf creates an order of amount (RUB) and returns its id.
func (b *testBundle) orderOf(t *testing.T, amount int64) string {
	t.Helper()
	body := fmt.Sprintf(`{"items":[{"sku":"SKU-1","qty":1}],"amount":%d,"currency":"RUB"}`, amount)
	return requireFresh(t, b.do(t, b.newRequest(t, http.MethodPost, "/orders", strings.NewReader(body), idempotency.HeaderKey, uuid.NewString())), "create order").Id
}

func decodeOrder(t *testing.T, r reply) api.Order {
	t.Helper()
	var o api.Order
	require.NoError(t, json.Unmarshal(r.Body, &o), "decode order from %s", r)
	return o
}

// getOrder reads an order back.
func (b *testBundle) getOrder(t *testing.T, id string) api.Order {
	t.Helper()
	r := b.do(t, b.newRequest(t, http.MethodGet, "/orders/"+id, nil))
	require.Equal(t, http.StatusOK, r.Status, "get order: %s", r)
	return decodeOrder(t, r)
}

func TestPatchOrder(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{})
		id, key := b.newOrderID(t), uuid.NewString()

		// A body against the contract consumes no key.
		for _, bad := range []string{`{"amount":0}`, `{}`, `{"amount":10,"colour":"red"}`, `{"amount":null}`} {
			requireProblem(t, b.patchOrder(t, id, key, bad), problem.Validation, bad)
		}
		wrongType := b.do(t, b.newRequest(t, http.MethodPatch, "/orders/"+id, strings.NewReader(`{"amount":10}`), idempotency.HeaderKey, key))
		requireProblem(t, wrongType, problem.UnsupportedMediaType, "a PATCH as application/json")

		first := b.patchOrder(t, id, key, `{"amount":1800,"items":[{"sku":"SKU-1","qty":3}]}`)
		require.Equal(t, http.StatusOK, first.Status, "patch: %s", first)
		require.Empty(t, first.Header.Get(idempotency.HeaderReplayed))
		changed := decodeOrder(t, first)
		require.EqualValues(t, 1800, changed.Amount)
		require.Equal(t, []api.OrderItem{{Sku: "SKU-1", Qty: 3}}, changed.Items, "items are replaced as a whole")
		require.Equal(t, "RUB", changed.Currency, "a member left out keeps its value")
		require.Equal(t, changed, b.getOrder(t, id), "the order as stored")

		requireReplayOf(t, first, b.patchOrder(t, id, key, `{"amount":1800,"items":[{"sku":"SKU-1","qty":3}]}`), "the same patch again")
		requireReplayOf(t, first, b.patchOrder(t, id, key, `{ "items":[{"qty":3,"sku":"SKU-1"}], "amount":1800 }`), "the same patch, written differently")
		requireProblem(t, b.patchOrder(t, id, key, `{"amount":1900}`), problem.KeyMismatch, "another patch under the key")
		other := b.newOrderID(t)
		requireProblem(t, b.patchOrder(t, other, key, `{"amount":1800,"items":[{"sku":"SKU-1","qty":3}]}`), problem.KeyMismatch, "the same patch of another order under the key")
		require.EqualValues(t, 1200, b.getOrder(t, other).Amount, "the other order is untouched")

		unknown := b.patchOrder(t, uuid.NewString(), uuid.NewString(), `{"amount":5}`)
		requireProblem(t, unknown, problem.NotFound, "an order that does not exist")
		currency := uuid.NewString()
		refused := b.patchOrder(t, id, currency, `{"currency":"XYZ"}`)
		requireProblem(t, refused, httpapi.ProblemFor(orders.ErrUnknownCurrency), "an unknown currency")
		requireReplayOf(t, refused, b.patchOrder(t, id, currency, `{"currency":"XYZ"}`), "a business outcome is stored")

		cancelled := b.cancelOrder(t, id, uuid.NewString())
		require.Equal(t, http.StatusOK, cancelled.Status, "cancel: %s", cancelled)
		late := uuid.NewString()
		tooLate := b.patchOrder(t, id, late, `{"amount":10}`)
		requireProblem(t, tooLate, httpapi.ProblemFor(orders.ErrNotModifiable), "a cancelled order")
		requireReplayOf(t, tooLate, b.patchOrder(t, id, late, `{"amount":10}`), "order-not-modifiable is stored")
	})
}

func TestCancelOrder(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{})
		id := b.newOrderID(t)
		requireProblem(t, b.cancelOrder(t, id, ""), problem.MissingIdempotencyKey, "a cancel without a key")
		require.Equal(t, "created", string(b.getOrder(t, id).Status), "a refused cancel changes nothing")

		key := uuid.NewString()
		first := b.cancelOrder(t, id, key)
		require.Equal(t, http.StatusOK, first.Status, "cancel: %s", first)
		o := decodeOrder(t, first)
		require.Equal(t, api.OrderStatus("cancelled"), o.Status)
		require.NotNil(t, o.CancelledAt)
		require.Equal(t, o, b.getOrder(t, id), "the order as stored")
		for range 3 {
			requireReplayOf(t, first, b.cancelOrder(t, id, key), "a repeat replays the 200, never a 404")
		}
		again := b.cancelOrder(t, id, uuid.NewString())
		require.Equal(t, http.StatusOK, again.Status, "cancelling a cancelled order under a new key: %s", again)
		require.Equal(t, o, decodeOrder(t, again), "it stays as the first cancel left it")
		requireProblem(t, b.cancelOrder(t, b.newOrderID(t), key), problem.KeyMismatch, "the key on another order")
		requireProblem(t, b.cancelOrder(t, uuid.NewString(), uuid.NewString()), problem.NotFound, "an order that does not exist")
	})
}

// Different keys changing one order at once are applied one at a time:
// one sets the amount, the other the currency, and neither is lost; each
// answer is the order right after its own change.
func TestConcurrentPatchesAreSerialized(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{})
		for round := range 20 {
			id := b.newOrderID(t)
			replies := b.stampede(t, 2, func(i int) *http.Request {
				body := []string{`{"amount":5000}`, `{"currency":"EUR"}`}[i]
				return b.newRequest(t, http.MethodPatch, "/orders/"+id, strings.NewReader(body), "Content-Type", mergePatch, idempotency.HeaderKey, uuid.NewString())
			})
			amount, currency := decodeOrder(t, replies[0]), decodeOrder(t, replies[1])
			require.EqualValues(t, 5000, amount.Amount, "round %d: the amount patch's answer", round)
			require.Equal(t, "EUR", currency.Currency, "round %d: the currency patch's answer", round)
			final := b.getOrder(t, id)
			require.EqualValues(t, 5000, final.Amount, "round %d: no change is lost", round)
			require.Equal(t, "EUR", final.Currency, "round %d: no change is lost", round)
			// One ran first: its answer lacks the other's change, the
			// other's answer has both.
			require.True(t, (amount.Currency == "RUB") != (currency.Amount == 1200),
				"round %d: exactly one answer precedes the other's change: %+v, %+v", round, amount, currency)
		}
	})
}

// PATCH with one key from 20 goroutines at once runs once: one answer ran
// it, every other replays it or is told to come back.
func TestConcurrentPatchWithOneKeyRunsOnce(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{})
		id, key := b.newOrderID(t), uuid.NewString()
		replies := b.stampede(t, 20, func(int) *http.Request {
			return b.newRequest(t, http.MethodPatch, "/orders/"+id, strings.NewReader(`{"amount":4321}`), "Content-Type", mergePatch, idempotency.HeaderKey, key)
		})
		ran := 0
		var first reply
		for i, r := range replies {
			switch {
			case r.Status == http.StatusOK && r.Header.Get(idempotency.HeaderReplayed) == "":
				ran++
				first = r
			case r.Status == http.StatusOK:
			default:
				requireProblem(t, r, problem.InProgress, fmt.Sprintf("duplicate %d", i))
			}
		}
		require.Equal(t, 1, ran, "one execution")
		for _, r := range replies {
			if r.Status == http.StatusOK && r.Header.Get(idempotency.HeaderReplayed) != "" {
				requireReplayOf(t, first, r, "a duplicate")
			}
		}
	})
}

// A cancel and a payment of one order sent together: exactly one of them
// wins, 100 rounds, and the order agrees with the winner.
func TestCancelRacesPay(t *testing.T) {
	t.Parallel()
	forEachPayBackend(t, payOptions{}, func(t *testing.T, b *payBundle) {
		wins := map[string]int{}
		defer func() { t.Logf("winners of 100 rounds: %v", wins) }()
		for round := range 100 {
			id := b.newOrderID(t)
			var cancel, pay reply
			var wg sync.WaitGroup
			start := make(chan struct{})
			wg.Go(func() { <-start; cancel = b.cancelOrder(t, id, uuid.NewString()) })
			wg.Go(func() { <-start; pay = b.pay(t, uuid.NewString(), paymentBody(id)) })
			close(start)
			servicetest.Wait(t, &wg, 30*time.Second, "the cancel and the payment")
			switch {
			case cancel.Status == http.StatusOK:
				wins["cancel"]++
				requireProblem(t, pay, httpapi.ProblemFor(payments.ErrOrderCancelled), fmt.Sprintf("round %d: the payment after the cancel", round))
				// The order may be read from a replica that lags (the
				// replica backends): the cancel shows once it has caught up.
				poll(t, 10*time.Second, fmt.Sprintf("round %d: the cancelled order", round), func() bool {
					return b.getOrder(t, id).Status == api.OrderStatus("cancelled")
				})
			case pay.Status == http.StatusAccepted:
				wins["pay"]++
				requireProblem(t, cancel, httpapi.ProblemFor(orders.ErrNotCancellable), fmt.Sprintf("round %d: the cancel after the payment", round))
				require.Equal(t, api.OrderStatus("created"), b.getOrder(t, id).Status)
			default:
				t.Fatalf("round %d: neither won: cancel %s, pay %s", round, cancel, pay)
			}
		}
	})
}
