package client_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/client"
	"github.com/oncekey/oncekey/gen/api"
	"github.com/oncekey/oncekey/gen/apiclient"
	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/metrics"
	"github.com/oncekey/oncekey/internal/service/orders"
	"github.com/oncekey/oncekey/internal/service/payments"
	"github.com/oncekey/oncekey/internal/service/provider"
	"github.com/oncekey/oncekey/internal/service/servicetest"
	"github.com/oncekey/oncekey/internal/service/store"
	"github.com/oncekey/oncekey/internal/service/store/memory"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
	"github.com/oncekey/oncekey/internal/wire/problem"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// fault is what the injector does to one request.
type fault int

const (
	pass             fault = iota // let it through
	dropAfterCommit               // run it to completion, then cut the connection before the answer
	unavailable                   // 503 with Retry-After: 0, without running it
	inProgress                    // 202 request-in-progress with Retry-After: 0, without running it
	dropAfterSettled              // run it to completion, wait for the injector's settle, then cut the connection
)

// injector sits in front of the real service and applies a script of
// faults, one per request, recording the Idempotency-Key and Content-Type
// of each.
type injector struct {
	next http.Handler
	// settle is what dropAfterSettled waits for (set before the request).
	settle func()

	mu     sync.Mutex
	script []fault
	keys   []string
	types  []string
}

func (f *injector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.keys = append(f.keys, r.Header.Get(idempotency.HeaderKey))
	f.types = append(f.types, r.Header.Get("Content-Type"))
	action := pass
	if len(f.script) > 0 {
		action, f.script = f.script[0], f.script[1:]
	}
	f.mu.Unlock()

	switch action {
	case dropAfterCommit, dropAfterSettled:
		f.next.ServeHTTP(httptest.NewRecorder(), r) // committed, answer thrown away
		if action == dropAfterSettled {
			f.settle()
		}
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	case unavailable:
		w.Header().Set("Retry-After", "0")
		problem.Write(w, problem.Unavailable, "injected")
	case inProgress:
		w.Header().Set("Retry-After", "0")
		problem.Write(w, problem.InProgress, "injected")
	default:
		f.next.ServeHTTP(w, r)
	}
}

func (f *injector) seen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.keys...)
}

// contentTypes are the Content-Type headers of the requests seen.
func (f *injector) contentTypes() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.types...)
}

// then forgets the requests seen so far and scripts the next ones: a test
// prepares what it needs, then runs the operation under test with faults.
func (f *injector) then(script ...fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.script, f.keys, f.types = script, nil, nil
}

type testBundle struct {
	client   *client.Client
	injector *injector
	count    func() int
	// metrics are the service's own, which count what each operation did.
	metrics *metrics.Metrics
	// api calls the service without the SDK, for what it has no method for.
	api *apiclient.ClientWithResponses
	// backend and account are the service's store and the client's account.
	backend store.Backend
	account uuid.UUID
	// provider is the sandbox payment provider (setupPayments only).
	provider *provider.Client
	// svc is where the service listens, and the account's API key.
	svc servicetest.Service
}

// setup runs the service on PostgreSQL behind an injector with script.
func setup(t *testing.T, script ...fault) *testBundle {
	t.Helper()
	return start(t, postgres.New(testdb.Pool(t), nil), httpapi.Config{}, script...)
}

// setupPayments runs the service on the in-memory store with payments: its
// in-process worker charges and refunds through a sandbox provider of the
// test's own, with faults.
func setupPayments(t *testing.T, faults provider.Faults) *testBundle {
	t.Helper()
	backend := memory.New()
	sandbox := httptest.NewServer(provider.NewServer(provider.NewMemoryStore(), faults, slog.New(slog.DiscardHandler)))
	t.Cleanup(sandbox.Close)
	worker := payments.NewWorker(payments.WorkerConfig{
		Repo: backend, Render: httpapi.PaymentOutcome, RenderRefund: httpapi.RefundOutcome,
		Provider: provider.NewClient(sandbox.URL, &http.Client{Timeout: 5 * time.Second}),
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		policy := payments.RetryPolicy{Attempts: 30, Base: 5 * time.Millisecond, Limit: 50 * time.Millisecond, Timeout: 10 * time.Second}
		payments.RunLocal(ctx, backend, worker, policy, 2, slog.New(slog.DiscardHandler))
	}()
	t.Cleanup(func() { cancel(); <-done })
	b := start(t, backend, httpapi.Config{Payments: payments.NewService(backend)})
	b.provider = provider.NewClient(sandbox.URL, nil)
	return b
}

// start runs the service on backend with cfg behind an injector with
// script, and returns an SDK client of a new account.
func start(t *testing.T, backend store.Backend, cfg httpapi.Config, script ...fault) *testBundle {
	t.Helper()
	cfg.Metrics = metrics.New()
	var inj *injector
	svc := servicetest.Start(t, backend, servicetest.Options{Config: cfg, Wrap: func(h http.Handler) http.Handler {
		inj = &injector{next: h, script: script}
		return inj
	}})
	bearer := apiclient.WithRequestEditorFn(func(_ context.Context, r *http.Request) error {
		r.Header.Set("Authorization", "Bearer "+svc.APIKey)
		return nil
	})
	raw, err := apiclient.NewClientWithResponses(svc.URL, bearer)
	require.NoError(t, err)
	c, err := client.New(client.Config{
		BaseURL: svc.URL, APIKey: svc.APIKey,
		// A connection per request: Go's transport would otherwise retry a
		// request cut on a reused connection by itself, hiding what the SDK does.
		HTTPClient:  &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second},
		MaxAttempts: 4,
		BaseDelay:   time.Millisecond,
		MaxDelay:    10 * time.Millisecond,
	})
	require.NoError(t, err)
	return &testBundle{client: c, injector: inj, metrics: cfg.Metrics, api: raw, backend: backend, account: svc.Account, svc: svc, count: func() int {
		list, err := backend.ListOrders(context.Background(), svc.Account, nil, 1000)
		require.NoError(t, err)
		return len(list)
	}}
}

// outcomes is what the service did with the requests to one idempotent
// operation ("PATCH /orders/{id}"), by its own metrics: how many ran it
// ("executed"), how many got the stored response ("replayed"), and so on.
func (b *testBundle) outcomes(t *testing.T, operation string) map[string]int {
	t.Helper()
	families, err := b.metrics.Registry.Gather()
	require.NoError(t, err)
	out := map[string]int{}
	for _, f := range families {
		if f.GetName() != "oncekey_idempotency_requests_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if n := int(m.GetCounter().GetValue()); labels["operation"] == operation && n > 0 {
				out[labels["outcome"]] = n
			}
		}
	}
	return out
}

// requireOneKey requires n attempts, all with the same key.
func requireOneKey(t *testing.T, inj *injector, n int) {
	t.Helper()
	keys := inj.seen()
	require.Len(t, keys, n, "one attempt per fault plus the one that got through")
	for _, k := range keys {
		require.NotEmpty(t, k)
		require.Equal(t, keys[0], k, "every attempt of one operation carries the same key")
	}
}

var seedOrder = api.NewOrder{Items: []api.OrderItem{{Sku: "SKU-1", Qty: 2}}, Amount: 1200, Currency: "RUB"}

func TestCreateOrderHappensOnceUnderFaults(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		script []fault
	}{
		{"no fault", nil},
		{"connection dropped after the server committed", []fault{dropAfterCommit}},
		{"dropped twice after commit", []fault{dropAfterCommit, dropAfterCommit}},
		{"503 then dropped after commit", []fault{unavailable, dropAfterCommit}},
		{"in progress then 503", []fault{inProgress, unavailable}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tt.script...)
			order, err := b.client.CreateOrder(context.Background(), seedOrder)
			require.NoError(t, err)
			require.NotEmpty(t, order.Id)
			require.Equal(t, 1, b.count(), "the order must exist exactly once")
			requireOneKey(t, b.injector, len(tt.script)+1)
			fetched, err := b.client.GetOrder(context.Background(), order.Id)
			require.NoError(t, err)
			require.Equal(t, order.Id, fetched.Id)
		})
	}
}

func TestClientErrorsAreNotRetried(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.client.CreateOrder(context.Background(), api.NewOrder{Items: []api.OrderItem{{Sku: "S", Qty: 1}}, Amount: 1, Currency: "rub"})
	var pe *client.ProblemError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, http.StatusBadRequest, pe.Status)
	require.Equal(t, problem.Validation.Type(), pe.Problem.Type)
	require.Len(t, b.injector.seen(), 1, "a 4xx will not change on retry")

	_, err = b.client.CreateOrder(context.Background(), api.NewOrder{Items: []api.OrderItem{{Sku: "S", Qty: 1}}, Amount: 1, Currency: "XYZ"})
	require.ErrorAs(t, err, &pe)
	require.Equal(t, http.StatusUnprocessableEntity, pe.Status)
	require.Len(t, b.injector.seen(), 2)
	require.Equal(t, 0, b.count())
}

func TestAttemptsAreBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, unavailable, unavailable, unavailable, unavailable, unavailable)
	_, err := b.client.CreateOrder(context.Background(), seedOrder)
	require.Error(t, err)
	require.Contains(t, err.Error(), "gave up after 4 attempts")
	require.Len(t, b.injector.seen(), 4)
	require.Equal(t, 0, b.count())
}

func TestEachOperationHasItsOwnKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first, err := b.client.CreateOrder(context.Background(), seedOrder)
	require.NoError(t, err)
	second, err := b.client.CreateOrder(context.Background(), seedOrder)
	require.NoError(t, err)
	require.NotEqual(t, first.Id, second.Id, "two logical operations are two orders")
	keys := b.injector.seen()
	require.Len(t, keys, 2)
	require.NotEqual(t, keys[0], keys[1])
	require.Equal(t, 2, b.count())
}

func TestContextEndsRetrying(t *testing.T) {
	t.Parallel()
	b := setup(t, inProgress, inProgress, inProgress)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := b.client.CreateOrder(ctx, seedOrder)
	require.ErrorIs(t, err, context.Canceled)
}

// faultsAfterCommit are the scripts under which each unsafe method must
// still act exactly once: the first attempt that reaches the service
// commits but its answer is lost, and a retry gets the stored response.
var faultsAfterCommit = []struct {
	name   string
	script []fault
}{
	{"connection dropped after the server committed", []fault{dropAfterCommit}},
	{"503 then dropped after commit", []fault{unavailable, dropAfterCommit}},
	{"dropped after commit then in progress", []fault{dropAfterCommit, inProgress}},
}

// forFaultsAfterCommit runs test in parallel once per script of
// faultsAfterCommit.
func forFaultsAfterCommit(t *testing.T, test func(t *testing.T, script []fault)) {
	t.Helper()
	for _, tt := range faultsAfterCommit {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			test(t, tt.script)
		})
	}
}

// requireRanOnce requires that the operation under test took attempts
// attempts with one key, and that the service ran it once: the one attempt
// that reached it first ran it, the one after got its stored answer.
func (b *testBundle) requireRanOnce(t *testing.T, operation string, attempts int) {
	t.Helper()
	requireOneKey(t, b.injector, attempts)
	ranOnce := map[string]int{string(idempotency.OutcomeExecuted): 1, string(idempotency.OutcomeReplayed): 1}
	require.Equal(t, ranOnce, b.outcomes(t, operation), "%s ran once, its retry was answered from the stored response", operation)
}

// orderUnderFaults sets up the service with an order, and script for the
// requests after it.
func orderUnderFaults(t *testing.T, script []fault) (*testBundle, *api.Order) {
	t.Helper()
	b := setup(t)
	order, err := b.client.CreateOrder(context.Background(), seedOrder)
	require.NoError(t, err)
	b.injector.then(script...)
	return b, order
}

// requireStored requires that the service holds order as it is.
func (b *testBundle) requireStored(t *testing.T, order *api.Order) {
	t.Helper()
	fetched, err := b.client.GetOrder(context.Background(), order.Id)
	require.NoError(t, err)
	require.Equal(t, order, fetched)
}

func TestUpdateOrderHappensOnceUnderFaults(t *testing.T) {
	t.Parallel()
	forFaultsAfterCommit(t, func(t *testing.T, script []fault) {
		b, order := orderUnderFaults(t, script)
		amount := int64(1800)
		changed, err := b.client.UpdateOrder(context.Background(), order.Id, api.OrderPatch{Amount: &amount})
		require.NoError(t, err)
		require.Equal(t, amount, changed.Amount)
		require.Equal(t, seedOrder.Items, changed.Items, "a merge patch keeps what it leaves out")
		require.Equal(t, seedOrder.Currency, changed.Currency)
		b.requireRanOnce(t, "PATCH /orders/{id}", len(script)+1)
		for _, ct := range b.injector.contentTypes() {
			require.Equal(t, "application/merge-patch+json", ct, "every attempt is a JSON Merge Patch")
		}
		b.requireStored(t, changed)
	})
}

func TestCancelOrderHappensOnceUnderFaults(t *testing.T) {
	t.Parallel()
	forFaultsAfterCommit(t, func(t *testing.T, script []fault) {
		b, order := orderUnderFaults(t, script)
		cancelled, err := b.client.CancelOrder(context.Background(), order.Id)
		require.NoError(t, err)
		require.Equal(t, order.Id, cancelled.Id)
		require.Equal(t, api.OrderStatus("cancelled"), cancelled.Status)
		require.NotNil(t, cancelled.CancelledAt)
		b.requireRanOnce(t, "DELETE /orders/{id}", len(script)+1)
		b.requireStored(t, cancelled)
	})
}

func TestCreateRefundHappensOnceUnderFaults(t *testing.T) {
	t.Parallel()
	forFaultsAfterCommit(t, func(t *testing.T, script []fault) {
		// The provider's latency keeps the refund pending while the SDK
		// retries: it returns the refund as accepted.
		b := setupPayments(t, provider.Faults{Latency: time.Second})
		payment := b.pay(t)
		require.Equal(t, api.PaymentStatus(payments.StatusSucceeded), payment.Status)

		b.injector.then(script...)
		refund, err := b.client.CreateRefund(context.Background(), payment.Id, api.NewRefund{Amount: 500, Reason: "one item returned"})
		require.NoError(t, err)
		require.Equal(t, api.RefundStatus(payments.StatusPending), refund.Status, "accepted, not waited for")
		require.Equal(t, payment.Id, refund.PaymentId)
		require.Equal(t, int64(500), refund.Amount)
		b.requireRanOnce(t, "POST /payments/{id}/refunds", len(script)+1)

		final := b.awaitRefund(t, refund.Id)
		require.Equal(t, api.RefundStatus(payments.StatusSucceeded), final.Status)
		b.requireRefundedOnce(t, payment.Id, final)
	})
}

func TestCreateRefundRetriedAfterItBecameFinal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupPayments(t, provider.Faults{})
	payment := b.pay(t)

	// The answer is lost, and the retry comes once the refund is final.
	b.injector.settle = func() {
		assert.Eventually(t, func() bool {
			list, err := b.backend.ListRefunds(ctx, b.account, uuid.MustParse(payment.Id))
			return err == nil && len(list) == 1 && list[0].Final()
		}, 30*time.Second, 5*time.Millisecond, "the refund never became final")
	}
	b.injector.then(dropAfterSettled)
	refund, err := b.client.CreateRefund(ctx, payment.Id, api.NewRefund{Amount: payment.Amount, Reason: "order returned"})
	require.NoError(t, err)
	require.Equal(t, api.RefundStatus(payments.StatusSucceeded), refund.Status, "the retry gets the final refund")
	require.NotNil(t, refund.ProviderRefundId)
	b.requireRanOnce(t, "POST /payments/{id}/refunds", 2)
	b.requireRefundedOnce(t, payment.Id, *refund)
}

func TestOrderChangeProblemsAreNotRetried(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	order, err := b.client.CreateOrder(ctx, seedOrder)
	require.NoError(t, err)
	_, err = b.client.CancelOrder(ctx, order.Id)
	require.NoError(t, err)
	b.injector.then()

	amount := int64(1800)
	_, err = b.client.UpdateOrder(ctx, order.Id, api.OrderPatch{Amount: &amount})
	requireProblem(t, err, httpapi.ProblemFor(orders.ErrNotModifiable))
	lower := "rub"
	_, err = b.client.UpdateOrder(ctx, order.Id, api.OrderPatch{Currency: &lower})
	requireProblem(t, err, problem.Validation)
	_, err = b.client.CancelOrder(ctx, uuid.NewString())
	requireProblem(t, err, problem.NotFound)
	require.Len(t, b.injector.seen(), 3, "a 4xx will not change on retry")
}

func TestRefundProblemsAreNotRetried(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupPayments(t, provider.Faults{})
	payment := b.pay(t)
	b.injector.then()

	_, err := b.client.CreateRefund(ctx, payment.Id, api.NewRefund{Amount: payment.Amount + 1, Reason: "too much"})
	requireProblem(t, err, httpapi.ProblemFor(payments.ErrRefundExceedsPayment))
	_, err = b.client.CancelOrder(ctx, payment.OrderId)
	requireProblem(t, err, httpapi.ProblemFor(orders.ErrNotCancellable))
	_, err = b.client.GetRefund(ctx, uuid.NewString())
	requireProblem(t, err, problem.NotFound)
	_, err = b.client.ListRefunds(ctx, uuid.NewString())
	requireProblem(t, err, problem.NotFound)
	require.Len(t, b.injector.seen(), 4, "a 4xx will not change on retry")
	list, err := b.client.ListRefunds(ctx, payment.Id)
	require.NoError(t, err)
	require.Empty(t, list)

	declined := setupPayments(t, provider.Faults{DeclineRate: 1})
	failed := declined.pay(t)
	require.Equal(t, api.PaymentStatus(payments.StatusFailed), failed.Status)
	declined.injector.then()
	_, err = declined.client.CreateRefund(ctx, failed.Id, api.NewRefund{Amount: 1, Reason: "never paid"})
	requireProblem(t, err, httpapi.ProblemFor(payments.ErrNotRefundable))
	require.Len(t, declined.injector.seen(), 1)
}

// requireProblem requires err to be the SDK's *ProblemError of kind.
func requireProblem(t *testing.T, err error, kind problem.Kind) {
	t.Helper()
	var pe *client.ProblemError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, kind.Status, pe.Status)
	require.Equal(t, kind.Type(), pe.Problem.Type)
}

// pay creates an order and pays for it through Idempotent (the SDK has no
// payment method), then waits until the payment is final.
func (b *testBundle) pay(t *testing.T) api.Payment {
	t.Helper()
	ctx := context.Background()
	order, err := b.client.CreateOrder(ctx, seedOrder)
	require.NoError(t, err)
	var accepted *api.Payment
	err = b.client.Idempotent(ctx, func(ctx context.Context, key string) (*http.Response, error) {
		resp, err := b.api.CreatePaymentWithResponse(ctx, &api.CreatePaymentParams{IdempotencyKey: key},
			api.NewPayment{OrderId: order.Id, Amount: order.Amount, Currency: order.Currency})
		if err != nil {
			return nil, err
		}
		accepted = resp.JSON202
		return resp.HTTPResponse, nil
	})
	require.NoError(t, err)
	require.NotNil(t, accepted, "the payment is accepted, pending")
	return await(t, func() (*api.Payment, error) {
		resp, err := b.api.GetPaymentWithResponse(ctx, accepted.Id, nil)
		if err != nil || resp.JSON200 == nil {
			return nil, err
		}
		return resp.JSON200, nil
	}, func(p api.Payment) bool { return p.Status != api.PaymentStatus(payments.StatusPending) })
}

// awaitRefund polls GetRefund until the refund is final.
func (b *testBundle) awaitRefund(t *testing.T, id string) api.Refund {
	t.Helper()
	return await(t, func() (*api.Refund, error) { return b.client.GetRefund(context.Background(), id) },
		func(r api.Refund) bool { return r.Status != api.RefundStatus(payments.StatusPending) })
}

// await polls get until final holds of what it returns, and returns that.
func await[T any](t *testing.T, get func() (*T, error), final func(T) bool) T {
	t.Helper()
	var last T
	require.Eventually(t, func() bool {
		v, err := get()
		if err != nil || v == nil {
			return false
		}
		last = *v
		return final(last)
	}, 30*time.Second, 10*time.Millisecond, "never final")
	return last
}

// requireRefundedOnce requires that the payment has one refund, refund,
// and that the provider refunded it once.
func (b *testBundle) requireRefundedOnce(t *testing.T, paymentID string, refund api.Refund) {
	t.Helper()
	list, err := b.client.ListRefunds(context.Background(), paymentID)
	require.NoError(t, err)
	require.Equal(t, []api.Refund{refund}, list, "one refund")
	atProvider, err := b.provider.RefundsByReference(context.Background(), refund.Id)
	require.NoError(t, err)
	require.Len(t, atProvider, 1, "the provider refunded once")
}
