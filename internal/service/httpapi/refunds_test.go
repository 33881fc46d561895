package httpapi_test

import (
	"context"
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
	"github.com/oncekey/oncekey/internal/service/payments"
	"github.com/oncekey/oncekey/internal/service/provider"
	"github.com/oncekey/oncekey/internal/service/servicetest"
	"github.com/oncekey/oncekey/internal/wire/problem"
)

// paidPayment creates an order of amount, pays it and waits until the
// payment succeeded; it returns the payment's id.
func (b *payBundle) paidPayment(t *testing.T, amount int64) string {
	t.Helper()
	order := b.orderOf(t, amount)
	accepted := b.pay(t, uuid.NewString(), fmt.Sprintf(`{"order_id":%q,"amount":%d,"currency":"RUB"}`, order, amount))
	require.Equal(t, http.StatusAccepted, accepted.Status, "pay: %s", accepted)
	p := b.awaitFinal(t, decodePayment(t, accepted).Id)
	require.Equal(t, api.PaymentStatus(payments.StatusSucceeded), p.Status, "the payment to refund: %+v", p)
	return p.Id
}

// refund posts a refund of payment under key.
func (b *payBundle) refund(t *testing.T, payment, key, body string) reply {
	t.Helper()
	reply, err := b.tryRefund(payment, key, body)
	require.NoError(t, err)
	return reply
}

// tryRefund is refund for goroutines: it returns errors instead of failing.
func (b *payBundle) tryRefund(payment, key, body string) (reply, error) {
	req, err := servicetest.NewRequest(http.MethodPost, b.url+"/payments/"+payment+"/refunds", b.apiKey, strings.NewReader(body), idempotency.HeaderKey, key)
	if err != nil {
		return reply{}, err
	}
	return servicetest.Exchange(b.http, req)
}

func decodeRefund(t *testing.T, r reply) api.Refund {
	t.Helper()
	var out api.Refund
	require.NoError(t, json.Unmarshal(r.Body, &out), "decode refund from %s", r)
	return out
}

// awaitRefund polls GET /refunds/{id} until the refund is final.
func (b *payBundle) awaitRefund(t *testing.T, id string) api.Refund {
	t.Helper()
	var last api.Refund
	require.Eventually(t, func() bool {
		r := b.do(t, b.newRequest(t, http.MethodGet, "/refunds/"+id, nil))
		require.Equal(t, http.StatusOK, r.Status, "get refund: %s", r)
		last = decodeRefund(t, r)
		return last.Status != api.RefundStatus(payments.StatusPending)
	}, 30*time.Second, 10*time.Millisecond, "refund %s never became final", id)
	return last
}

// providerRefunds are the refunds the provider holds for one of ours.
func (b *payBundle) providerRefunds(t *testing.T, refundID string) []provider.Refund {
	t.Helper()
	list, err := b.provider.RefundsByReference(context.Background(), refundID)
	require.NoError(t, err, "list the provider's refunds")
	return list
}

func TestRefundFlow(t *testing.T) {
	t.Parallel()
	// Latency keeps the refund pending long enough to see the pending replay.
	forEachPayBackend(t, payOptions{faults: provider.Faults{Latency: 200 * time.Millisecond}}, func(t *testing.T, b *payBundle) {
		payment := b.paidPayment(t, 1000)
		key, body := uuid.NewString(), `{"amount":300,"reason":"one item returned"}`
		for _, bad := range []string{`{"amount":0,"reason":"x"}`, `{"amount":300}`, `{"amount":300,"reason":"x","extra":1}`} {
			requireProblem(t, b.refund(t, payment, key, bad), problem.Validation, bad)
		}

		first := b.refund(t, payment, key, body)
		require.Equal(t, http.StatusAccepted, first.Status, "accepted at once: %s", first)
		pending := decodeRefund(t, first)
		require.Equal(t, api.RefundStatus(payments.StatusPending), pending.Status)
		require.Equal(t, payment, pending.PaymentId)
		require.Equal(t, "RUB", pending.Currency, "the payment's currency")
		require.Equal(t, "/refunds/"+pending.Id, first.Header.Get("Location"))
		require.Equal(t, "1", first.Header.Get("Retry-After"))
		requireReplayOf(t, first, b.refund(t, payment, key, body), "a retry while pending")
		requireProblem(t, b.refund(t, payment, key, `{"amount":301,"reason":"one item returned"}`), problem.KeyMismatch, "another refund under the key")
		requireProblem(t, b.refund(t, b.paidPayment(t, 500), key, body), problem.KeyMismatch, "the refund of another payment under the key")

		final := b.awaitRefund(t, pending.Id)
		require.Equal(t, api.RefundStatus(payments.StatusSucceeded), final.Status, "%+v", final)
		require.NotNil(t, final.ProviderRefundId)
		done := b.refund(t, payment, key, body)
		require.Equal(t, http.StatusOK, done.Status, "the retry once final: %s", done)
		require.Equal(t, "true", done.Header.Get(idempotency.HeaderReplayed))
		require.Equal(t, final, decodeRefund(t, done), "the final refund, as GET shows it")
		require.Len(t, b.providerRefunds(t, pending.Id), 1, "one refund at the provider")

		// Reading its own writes, as a client does where reads may come
		// from a replica.
		list := b.do(t, b.newRequest(t, http.MethodGet, "/payments/"+payment+"/refunds", nil, "Consistency", "strong"))
		require.Equal(t, http.StatusOK, list.Status, "%s", list)
		var refunds api.RefundList
		require.NoError(t, json.Unmarshal(list.Body, &refunds))
		require.Equal(t, []api.Refund{final}, refunds.Items)

		over := uuid.NewString()
		tooMuch := b.refund(t, payment, over, `{"amount":701,"reason":"too much"}`)
		requireProblem(t, tooMuch, httpapi.ProblemFor(payments.ErrRefundExceedsPayment), "more than is left")
		requireReplayOf(t, tooMuch, b.refund(t, payment, over, `{"amount":701,"reason":"too much"}`), "refund-exceeds-payment is stored")
		rest := b.refund(t, payment, uuid.NewString(), `{"amount":700,"reason":"the rest"}`)
		require.Equal(t, http.StatusAccepted, rest.Status, "exactly what is left: %s", rest)

		requireProblem(t, b.refund(t, uuid.NewString(), uuid.NewString(), body), problem.NotFound, "a payment that does not exist")
		notFound := b.do(t, b.newRequest(t, http.MethodGet, "/payments/"+uuid.NewString()+"/refunds", nil))
		requireProblem(t, notFound, problem.NotFound, "the refunds of a payment that does not exist")
		requireProblem(t, b.do(t, b.newRequest(t, http.MethodGet, "/refunds/"+uuid.NewString(), nil)), problem.NotFound, "a refund that does not exist")
	})
}

// Only a succeeded payment is refunded; a declined one is not.
func TestRefundOfAnUnpaidPaymentIsRefused(t *testing.T) {
	t.Parallel()
	forEachPayBackend(t, payOptions{faults: provider.Faults{DeclineRate: 1}}, func(t *testing.T, b *payBundle) {
		accepted := b.pay(t, uuid.NewString(), paymentBody(b.newOrderID(t)))
		payment := decodePayment(t, accepted).Id
		require.Equal(t, api.PaymentStatus(payments.StatusFailed), b.awaitFinal(t, payment).Status)
		key := uuid.NewString()
		refused := b.refund(t, payment, key, `{"amount":100,"reason":"x"}`)
		requireProblem(t, refused, httpapi.ProblemFor(payments.ErrNotRefundable), "a failed payment")
		requireReplayOf(t, refused, b.refund(t, payment, key, `{"amount":100,"reason":"x"}`), "payment-not-refundable is stored")
	})
}

// 50 refunds of 30 at once on a 1000 payment, each retried by its client
// while the provider fails, loses answers and is slow: every answer a
// client gets names its one refund (three tries under one key never make
// two), the refunds accepted add up to at most 1000, every one of them
// succeeds, and the provider holds exactly one refund for each.
func TestConcurrentRefundsNeverExceedThePayment(t *testing.T) {
	t.Parallel()
	faults := provider.Faults{FailRate: 0.2, TimeoutRate: 0.2, TimeoutHold: 20 * time.Millisecond, Seed: 7}
	forEachPayBackend(t, payOptions{faults: faults, timeout: 2 * time.Second}, func(t *testing.T, b *payBundle) {
		payment := b.paidPayment(t, 1000)
		const clients, tries = 50, 3
		var (
			mu       sync.Mutex
			accepted = map[string]api.Refund{} // by refund id
			byClient = map[int]string{}        // the refund each client's key was answered with
			refused  int                       // answers, a client's retries included
			wg       sync.WaitGroup
		)
		start := make(chan struct{})
		for c := range clients {
			key, body := uuid.NewString(), fmt.Sprintf(`{"amount":30,"reason":"client %d"}`, c)
			for range tries { // the client's retries, at once with everyone
				wg.Go(func() {
					<-start
					r, err := b.tryRefund(payment, key, body)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					defer mu.Unlock()
					switch {
					case r.Header.Get("Content-Type") == "application/json" && (r.Status == http.StatusAccepted || r.Status == http.StatusOK):
						// Pending, or already final by the time a retry came.
						var out api.Refund
						if err := json.Unmarshal(r.Body, &out); err != nil {
							t.Error(err)
							return
						}
						if first, ok := byClient[c]; ok && first != out.Id {
							t.Errorf("client %d's key made two refunds, %s and %s: a retry ran again", c, first, out.Id)
						}
						byClient[c] = out.Id
						accepted[out.Id] = out
					case r.Status == http.StatusUnprocessableEntity:
						refused++
					case r.Status == http.StatusAccepted: // request-in-progress: the client retries later
					default:
						t.Errorf("refund answered %s", r)
					}
				})
			}
		}
		close(start)
		servicetest.Wait(t, &wg, time.Minute, "the refunds and their retries")
		var total int64
		for id, r := range accepted {
			total += r.Amount
			final := b.awaitRefund(t, id)
			require.Equal(t, api.RefundStatus(payments.StatusSucceeded), final.Status, "refund %s: %+v", id, final)
			held := b.providerRefunds(t, id)
			require.Len(t, held, 1, "the provider holds one refund for %s", id)
			require.Equal(t, provider.StatusSucceeded, held[0].Status)
		}
		t.Logf("%d refunds accepted (%d), %d answers refused", len(accepted), total, refused)
		require.Len(t, accepted, len(byClient), "one refund per client key that was accepted")
		require.LessOrEqual(t, total, int64(1000), "never more than the payment")
		require.Len(t, accepted, 33, "every refund that fits is accepted: 33 × 30 = 990")
		require.Positive(t, refused, "the rest are refused")

		list := b.do(t, b.newRequest(t, http.MethodGet, "/payments/"+payment+"/refunds", nil, "Consistency", "strong"))
		var refunds api.RefundList
		require.NoError(t, json.Unmarshal(list.Body, &refunds))
		require.Len(t, refunds.Items, 33, "no refund beyond the accepted ones was stored")
	})
}

// The refunds of a payment just created are listed, with or without
// Consistency: strong: never a 404 for a payment the client has just made,
// though the replica the list may come from does not hold it yet. (It was
// 404 with a replica: the payment was looked up there, and strong was not
// taken.)
func TestRefundsOfANewPaymentAreListed(t *testing.T) {
	t.Parallel()
	forEachPayBackend(t, payOptions{}, func(t *testing.T, b *payBundle) {
		accepted := b.pay(t, uuid.NewString(), paymentBody(b.order(t)))
		require.Equal(t, http.StatusAccepted, accepted.Status, "%s", accepted)
		id := decodePayment(t, accepted).Id
		for _, header := range [][]string{nil, {"Consistency", "strong"}, {"Consistency", "eventual"}} {
			list := b.do(t, b.newRequest(t, http.MethodGet, "/payments/"+id+"/refunds", nil, header...))
			require.Equal(t, http.StatusOK, list.Status, "%v: %s", header, list)
			require.JSONEq(t, `{"items":[]}`, string(list.Body), "%v", header)
		}
		b.awaitFinal(t, id)
	})
}
