package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/gen/api"
	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/jobs"
	"github.com/oncekey/oncekey/internal/service/payments"
	"github.com/oncekey/oncekey/internal/service/provider"
	"github.com/oncekey/oncekey/internal/service/servicetest"
	"github.com/oncekey/oncekey/internal/service/store"
	"github.com/oncekey/oncekey/internal/service/store/memory"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// payBundle is the whole service with its payment worker (River on
// PostgreSQL, the in-process worker in memory) and a sandbox provider of
// its own, whose charges the tests count.
type payBundle struct {
	*testBundle
	provider *provider.Client
	// idle returns once the worker has nothing left to do: every attempt
	// it made has ended and none is queued. It may stop the worker.
	idle func(t *testing.T)
}

// payOptions configure a payment test's provider and worker.
type payOptions struct {
	faults  provider.Faults
	policy  payments.RetryPolicy
	timeout time.Duration // the worker's HTTP timeout towards the provider (default 5s)
	// wrap, when set, stands between the worker and the sandbox provider,
	// for faults the sandbox has no flag for.
	wrap func(http.Handler) http.Handler
}

// fastPolicy retries quickly so fault tests take seconds.
var fastPolicy = payments.RetryPolicy{Attempts: 30, Base: 5 * time.Millisecond, Limit: 50 * time.Millisecond, Timeout: 10 * time.Second}

// payBackends are the stores the payment tests run on. Each PostgreSQL
// case gets a database of its own: a River worker works every job in its
// database, and must not charge another test's payments on its provider.
// The last two read through a streaming replica that lags (the reads that
// may lag; the worker reads the primary whatever the replica shows), as a
// deployment with DATABASE_REPLICA_URL does.
var payBackends = []struct {
	name string
	run  func(t *testing.T, opts payOptions) *payBundle
}{
	{"memory", func(t *testing.T, opts payOptions) *payBundle {
		store := memory.New()
		b := startPayments(t, store, store, opts)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			payments.RunLocal(ctx, store, b.worker, b.policy, 4, slog.New(slog.DiscardHandler))
		}()
		t.Cleanup(func() { cancel(); <-done })
		b.idle = func(t *testing.T) {
			// Stopped, the worker lets its running attempts end; a retry
			// any of them scheduled stays in the queue.
			cancel()
			<-done
			require.Zero(t, store.QueuedTasks(), "tasks the worker would still run")
		}
		return b.payBundle
	}},
	{"postgres", func(t *testing.T, opts payOptions) *payBundle {
		_, pool := testdb.Fresh(t)
		return onRiver(t, pool, nil, opts)
	}},
	{"postgres, delayed replica", func(t *testing.T, opts payOptions) *payBundle {
		return onLaggingReplica(t, testdb.Delayed, opts)
	}},
	{"postgres, paused replica", func(t *testing.T, opts payOptions) *payBundle {
		return onLaggingReplica(t, testdb.Paused, opts)
	}},
}

// onRiver is the service on pool with River's payment worker; reads, when
// not nil, wraps the store for the API's reads (a replica).
func onRiver(t *testing.T, pool *pgxpool.Pool, reads func(*postgres.Store) store.Reads, opts payOptions) *payBundle {
	t.Helper()
	runner, err := jobs.New(pool, jobs.Config{Policy: opts.retryPolicy(), Workers: 4, PollInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err, "River runner")
	pg := postgres.New(pool, runner)
	var r store.Reads = pg
	if reads != nil {
		r = reads(pg)
	}
	b := startPayments(t, pg, r, opts)
	require.NoError(t, runner.Start(context.Background(), b.worker), "start River")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, runner.Stop(ctx), "stop River")
	})
	b.idle = func(t *testing.T) {
		// The database is the test's own: each of its jobs is this test's.
		require.Eventually(t, func() bool {
			var unfinished int
			err := pool.QueryRow(context.Background(), `SELECT count(*) FROM river_job WHERE state NOT IN ('completed', 'cancelled', 'discarded')`).Scan(&unfinished)
			return err == nil && unfinished == 0
		}, 10*time.Second, 10*time.Millisecond, "River's jobs all end")
	}
	return b.payBundle
}

// onLaggingReplica is onRiver on a database of the test's own whose API
// reads come from a replica that lags as lag says.
func onLaggingReplica(t *testing.T, lag testdb.Lag, opts payOptions) *payBundle {
	t.Helper()
	db := testdb.FreshReplicated(t, lag)
	replicaPool, err := postgres.OpenReplica(context.Background(), db.ReplicaURL)
	require.NoError(t, err)
	t.Cleanup(replicaPool.Close)
	return onRiver(t, db.Pool, func(pg *postgres.Store) store.Reads {
		replica := postgres.NewReplica(pg, replicaPool, postgres.ReplicaConfig{})
		t.Cleanup(replica.Close)
		return replica
	}, opts)
}

type started struct {
	*payBundle
	worker *payments.Worker
	policy payments.RetryPolicy
}

// retryPolicy is the worker's policy: fastPolicy unless the test set one.
func (o payOptions) retryPolicy() payments.RetryPolicy {
	if o.policy.Attempts == 0 {
		return fastPolicy
	}
	return o.policy
}

func startPayments(t *testing.T, store backend, reads store.Reads, opts payOptions) started {
	t.Helper()
	sandbox := provider.NewServer(provider.NewMemoryStore(), opts.faults, slog.New(slog.DiscardHandler))
	psrv := httptest.NewServer(sandbox)
	t.Cleanup(psrv.Close)
	workerURL := psrv.URL
	if opts.wrap != nil {
		wrapped := httptest.NewServer(opts.wrap(sandbox))
		t.Cleanup(wrapped.Close)
		workerURL = wrapped.URL
	}
	if opts.timeout == 0 {
		opts.timeout = 5 * time.Second
	}
	policy := opts.retryPolicy()
	worker := payments.NewWorker(payments.WorkerConfig{
		Repo: store, Render: httpapi.PaymentOutcome, RenderRefund: httpapi.RefundOutcome,
		Provider: provider.NewClient(workerURL, &http.Client{Timeout: opts.timeout}),
	})
	tb := setup(t, store, options{cfg: httpapi.Config{Reads: reads, Payments: payments.NewService(reads)}})
	return started{payBundle: &payBundle{testBundle: tb, provider: provider.NewClient(psrv.URL, nil)}, worker: worker, policy: policy}
}

func forEachPayBackend(t *testing.T, opts payOptions, test func(t *testing.T, b *payBundle)) {
	t.Helper()
	for _, be := range payBackends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			test(t, be.run(t, opts))
		})
	}
}

// order creates an order to pay and returns its id.
func (b *payBundle) order(t *testing.T) string {
	t.Helper()
	resp := b.createOrder(t, uuid.NewString(), seedBody)
	require.Equal(t, http.StatusCreated, resp.StatusCode(), "create order: %s", resp.Body)
	return resp.JSON201.Id
}

func paymentBody(orderID string) string {
	return fmt.Sprintf(`{"order_id":%q,"amount":1200,"currency":"RUB"}`, orderID)
}

// pay posts a payment under key and returns the whole reply.
func (b *payBundle) pay(t *testing.T, key, body string) servicetest.Reply {
	t.Helper()
	req, err := servicetest.NewRequest(http.MethodPost, b.url+"/payments", b.apiKey, strings.NewReader(body), idempotency.HeaderKey, key)
	require.NoError(t, err)
	reply, err := servicetest.Exchange(b.http, req)
	require.NoError(t, err)
	return reply
}

func decodePayment(t *testing.T, r servicetest.Reply) api.Payment {
	t.Helper()
	var p api.Payment
	require.NoError(t, json.Unmarshal(r.Body, &p), "decode payment from %s", r)
	return p
}

// awaitFinal polls GET /payments/{id} until the payment is final.
func (b *payBundle) awaitFinal(t *testing.T, id string) api.Payment {
	t.Helper()
	var last api.Payment
	require.Eventually(t, func() bool {
		resp, err := b.client.GetPaymentWithResponse(context.Background(), id, nil)
		require.NoError(t, err, "get payment")
		require.Equal(t, http.StatusOK, resp.StatusCode(), "get payment: %s", resp.Body)
		last = *resp.JSON200
		return last.Status != api.PaymentStatus(payments.StatusPending)
	}, 30*time.Second, 10*time.Millisecond, "payment %s never became final", id)
	return last
}

// charges counts the provider's charges for a payment: the truth about how
// often money moved, whatever our side recorded.
func (b *payBundle) charges(t *testing.T, paymentID string) []provider.Charge {
	t.Helper()
	list, err := b.provider.ChargesByReference(context.Background(), paymentID)
	require.NoError(t, err, "list the provider's charges")
	return list
}

func TestPaymentFlow(t *testing.T) {
	t.Parallel()
	// Latency keeps the payment pending long enough to see the pending replay.
	forEachPayBackend(t, payOptions{faults: provider.Faults{Latency: 300 * time.Millisecond}}, func(t *testing.T, b *payBundle) {
		key, body := uuid.NewString(), paymentBody(b.order(t))

		first := b.pay(t, key, body)
		require.Equal(t, http.StatusAccepted, first.Status, "accepted at once: %s", first)
		pending := decodePayment(t, first)
		require.Equal(t, api.PaymentStatus(payments.StatusPending), pending.Status)
		require.Equal(t, "/payments/"+pending.Id, first.Header.Get("Location"))
		require.Equal(t, "1", first.Header.Get("Retry-After"))
		require.Empty(t, first.Header.Get(idempotency.HeaderReplayed))

		again := b.pay(t, key, body)
		require.Equal(t, http.StatusAccepted, again.Status, "a retry while pending: %s", again)
		require.Equal(t, "true", again.Header.Get(idempotency.HeaderReplayed))
		require.Equal(t, first.Body, again.Body, "the same pending payment, byte for byte")

		final := b.awaitFinal(t, pending.Id)
		require.Equal(t, api.PaymentStatus(payments.StatusSucceeded), final.Status)
		require.NotNil(t, final.ProviderChargeId, "a succeeded payment names its charge")
		require.NotNil(t, final.CompletedAt)

		done := b.pay(t, key, body)
		require.Equal(t, http.StatusOK, done.Status, "a retry after the payment is final: %s", done)
		require.Equal(t, "true", done.Header.Get(idempotency.HeaderReplayed))
		require.Equal(t, "/payments/"+pending.Id, done.Header.Get("Location"))
		replayed := decodePayment(t, done)
		require.Equal(t, final, replayed, "the retry answers with the final payment")

		conflict := b.pay(t, key, paymentBody(b.order(t)))
		require.Equal(t, http.StatusConflict, conflict.Status, "another body under the key: %s", conflict)

		charges := b.charges(t, pending.Id)
		require.Len(t, charges, 1, "one charge per payment")
		require.Equal(t, *final.ProviderChargeId, charges[0].ID)
		require.Equal(t, provider.ChargeRequest{Amount: 1200, Currency: "RUB", Reference: pending.Id},
			provider.ChargeRequest{Amount: charges[0].Amount, Currency: charges[0].Currency, Reference: charges[0].Reference})

		resp, err := b.client.GetPaymentWithResponse(context.Background(), uuid.NewString(), nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusNotFound, resp.StatusCode(), "an unknown payment: %s", resp.Body)
	})
}

func TestPaymentRefusals(t *testing.T) {
	t.Parallel()
	forEachPayBackend(t, payOptions{}, func(t *testing.T, b *payBundle) {
		for _, tc := range []struct {
			name, body, problem string
		}{
			{"unknown order", paymentBody(uuid.NewString()), "unknown-order"},
			{"unknown currency", fmt.Sprintf(`{"order_id":%q,"amount":1200,"currency":"XYZ"}`, b.order(t)), "unknown-currency"},
			{"less than the order", fmt.Sprintf(`{"order_id":%q,"amount":1,"currency":"RUB"}`, b.order(t)), "payment-amount-mismatch"},
			{"more than the order", fmt.Sprintf(`{"order_id":%q,"amount":2000,"currency":"RUB"}`, b.order(t)), "payment-amount-mismatch"},
			{"another currency", fmt.Sprintf(`{"order_id":%q,"amount":1200,"currency":"USD"}`, b.order(t)), "payment-amount-mismatch"},
		} {
			key := uuid.NewString()
			first := b.pay(t, key, tc.body)
			require.Equal(t, http.StatusUnprocessableEntity, first.Status, "%s: %s", tc.name, first)
			require.Contains(t, string(first.Body), "https://oncekey.dev/problems/"+tc.problem, tc.name)
			again := b.pay(t, key, tc.body)
			require.Equal(t, first.Body, again.Body, "%s: the refusal is stored and replayed", tc.name)
			require.Equal(t, "true", again.Header.Get(idempotency.HeaderReplayed), tc.name)
		}
		// An order id that is no UUID breaks the contract: 400, and the key
		// is not consumed.
		key := uuid.NewString()
		malformed := b.pay(t, key, paymentBody("order-1"))
		require.Equal(t, http.StatusBadRequest, malformed.Status, "%s", malformed)
		require.Contains(t, string(malformed.Body), "https://oncekey.dev/problems/validation-error")
		require.Equal(t, http.StatusUnprocessableEntity, b.pay(t, key, paymentBody(uuid.NewString())).Status, "the key is still free")

		// Another account cannot see, or pay, this account's order.
		other := b.pay(t, uuid.NewString(), `{"order_id":"`+uuid.NewString()+`","amount":1,"currency":"RUB"}`)
		require.Equal(t, http.StatusUnprocessableEntity, other.Status, "%s", other)
		stats, err := b.provider.Stats(context.Background())
		require.NoError(t, err)
		require.Zero(t, stats.Requests, "a refused payment never reaches the provider")
	})
}

// Under each fault of the provider, every payment is charged exactly once:
// counted on the provider's side.
func TestPaymentChargedOnceUnderProviderFaults(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		faults  provider.Faults
		timeout time.Duration
		fired   func(provider.Stats) int64
	}{
		{"provider 500s", provider.Faults{FailRate: 0.5, Seed: 1}, 0, func(s provider.Stats) int64 { return s.Faults.Fail }},
		{"timeouts after charging", provider.Faults{TimeoutRate: 0.5, Seed: 2}, 200 * time.Millisecond, func(s provider.Stats) int64 { return s.Faults.Timeout }},
		{"latency", provider.Faults{Latency: 50 * time.Millisecond, FailRate: 0.2, TimeoutRate: 0.2, Seed: 3}, 300 * time.Millisecond, func(s provider.Stats) int64 { return s.Faults.Fail + s.Faults.Timeout }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			forEachPayBackend(t, payOptions{faults: tc.faults, timeout: tc.timeout}, func(t *testing.T, b *payBundle) {
				const n = 12
				ids := make([]string, n)
				for i := range n {
					r := b.pay(t, uuid.NewString(), paymentBody(b.order(t)))
					require.Equal(t, http.StatusAccepted, r.Status, "%s", r)
					ids[i] = decodePayment(t, r).Id
				}
				for _, id := range ids {
					final := b.awaitFinal(t, id)
					require.Equal(t, api.PaymentStatus(payments.StatusSucceeded), final.Status, "payment %s: %+v", id, final)
					charges := b.charges(t, id)
					require.Len(t, charges, 1, "payment %s must be charged exactly once", id)
					require.Equal(t, *final.ProviderChargeId, charges[0].ID, "the payment names the one charge")
				}
				stats, err := b.provider.Stats(context.Background())
				require.NoError(t, err)
				require.Positive(t, tc.fired(stats), "the fault must really have fired: %+v", stats)
				require.EqualValues(t, n, stats.Charges, "charges made in all")
			})
		})
	}
}

// 50 concurrent retries of one POST: one payment, one charge.
func TestPaymentConcurrentRetries(t *testing.T) {
	t.Parallel()
	forEachPayBackend(t, payOptions{}, func(t *testing.T, b *payBundle) {
		key, body := uuid.NewString(), paymentBody(b.order(t))
		const n = 50
		replies := b.stampede(t, n, func(int) *http.Request {
			return b.newRequest(t, http.MethodPost, "/payments", strings.NewReader(body), idempotency.HeaderKey, key)
		})
		ids := map[string]bool{}
		for _, r := range replies {
			switch r.Status {
			case http.StatusAccepted, http.StatusOK:
				if strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
					ids[decodePayment(t, r).Id] = true
				}
			default:
				require.Failf(t, "unexpected reply", "%s", r)
			}
		}
		require.Len(t, ids, 1, "every reply names the one payment: %v", ids)
		for id := range ids {
			b.awaitFinal(t, id)
			require.Len(t, b.charges(t, id), 1, "one charge")
		}
		stats, err := b.provider.Stats(context.Background())
		require.NoError(t, err)
		require.EqualValues(t, 1, stats.Charges, "one charge in all")
		require.Equal(t, 1, b.paymentCount(t), "one payment row")
	})
}

// A payment the provider never answers ends failed after the attempt limit,
// and its key replays that outcome; a declined one ends failed at once.
func TestPaymentFailures(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		faults   provider.Faults
		reason   string
		requests int64 // POSTs the provider saw
	}{
		{"provider keeps failing", provider.Faults{FailRate: 1}, payments.ReasonProviderUnavailable, 3},
		{"card declined", provider.Faults{DeclineRate: 1}, payments.ReasonCardDeclined, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			policy := fastPolicy
			policy.Attempts = 3
			forEachPayBackend(t, payOptions{faults: tc.faults, policy: policy}, func(t *testing.T, b *payBundle) {
				key, body := uuid.NewString(), paymentBody(b.order(t))
				first := b.pay(t, key, body)
				require.Equal(t, http.StatusAccepted, first.Status, "%s", first)
				id := decodePayment(t, first).Id
				final := b.awaitFinal(t, id)
				require.Equal(t, api.PaymentStatus(payments.StatusFailed), final.Status)
				require.NotNil(t, final.FailureReason)
				require.Equal(t, tc.reason, string(*final.FailureReason))

				again := b.pay(t, key, body)
				require.Equal(t, http.StatusOK, again.Status, "the key replays the final outcome: %s", again)
				require.Equal(t, final, decodePayment(t, again))

				// Counted once the worker has nothing left to do, so that an
				// attempt it should not make is counted too.
				b.idle(t)
				stats, err := b.provider.Stats(context.Background())
				require.NoError(t, err)
				require.Equal(t, tc.requests, stats.Requests, "charge requests: %+v", stats)
				succeeded := 0
				for _, c := range b.charges(t, id) {
					if c.Status == provider.StatusSucceeded {
						succeeded++
					}
				}
				require.Zero(t, succeeded, "a failed payment moved no money")
			})
		})
	}
}

// paymentCount counts the account's payments in the store.
func (b *payBundle) paymentCount(t *testing.T) int {
	t.Helper()
	counter, ok := b.store.(interface {
		CountPayments(ctx context.Context, account uuid.UUID) (int, error)
	})
	require.True(t, ok, "the store counts payments")
	n, err := counter.CountPayments(context.Background(), b.account)
	require.NoError(t, err)
	return n
}

// writeProviderProblem answers like a provider refusing a request.
func writeProviderProblem(w http.ResponseWriter, status int) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"type":"about:blank","title":"refused","status":%d}`, status)
}

// After the charges, the payment is settled from what the provider holds
// under its key: a charge whose every answer was lost, or that a provider
// refused to confirm (409 while "still processing"), is found and the
// payment succeeds with exactly that one charge; a request the provider
// refused without charging fails the payment.
func TestPaymentReconciliation(t *testing.T) {
	t.Parallel()
	policy := fastPolicy
	policy.Attempts = 2
	chargeThenRefuse := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodPost {
				next.ServeHTTP(w, r)
				return
			}
			next.ServeHTTP(httptest.NewRecorder(), r) // charged
			writeProviderProblem(w, http.StatusConflict)
		})
	}
	refuse := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodPost {
				next.ServeHTTP(w, r)
				return
			}
			writeProviderProblem(w, http.StatusBadRequest)
		})
	}
	for _, tc := range []struct {
		name    string
		opts    payOptions
		status  string
		reason  string
		charges int
	}{
		{"every answer lost", payOptions{faults: provider.Faults{TimeoutRate: 1}, timeout: 200 * time.Millisecond}, payments.StatusSucceeded, "", 1},
		{"charged, then refused", payOptions{wrap: chargeThenRefuse}, payments.StatusSucceeded, "", 1},
		{"refused without charging", payOptions{wrap: refuse}, payments.StatusFailed, payments.ReasonProviderRejected, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.opts.policy = policy
			forEachPayBackend(t, tc.opts, func(t *testing.T, b *payBundle) {
				r := b.pay(t, uuid.NewString(), paymentBody(b.order(t)))
				require.Equal(t, http.StatusAccepted, r.Status, "%s", r)
				id := decodePayment(t, r).Id
				final := b.awaitFinal(t, id)
				require.Equal(t, api.PaymentStatus(tc.status), final.Status, "%+v", final)
				if tc.reason != "" {
					require.Equal(t, tc.reason, string(*final.FailureReason))
				}
				charges := b.charges(t, id)
				require.Len(t, charges, tc.charges, "charges of payment %s", id)
				if tc.charges == 1 {
					require.Equal(t, charges[0].ID, *final.ProviderChargeId, "the payment names the charge found")
				}
			})
		})
	}
}

// outage makes the provider answer nothing but 503 while down.
type outage struct {
	down atomic.Bool
	seen atomic.Int64 // requests refused
}

func (o *outage) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if o.down.Load() {
			o.seen.Add(1)
			writeProviderProblem(w, http.StatusServiceUnavailable)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// While the provider can say nothing at all (charges and look-ups fail),
// a payment whose attempts ran out stays pending, however long it takes;
// once the provider answers again, it is settled from what the provider
// holds (here: nothing, so failed).
func TestPaymentStaysPendingWhileProviderCannotSay(t *testing.T) {
	t.Parallel()
	policy := fastPolicy
	policy.Attempts = 2
	for _, be := range payBackends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			o := &outage{}
			o.down.Store(true)
			b := be.run(t, payOptions{policy: policy, wrap: o.wrap})
			r := b.pay(t, uuid.NewString(), paymentBody(b.order(t)))
			require.Equal(t, http.StatusAccepted, r.Status, "%s", r)
			id := decodePayment(t, r).Id

			// Two charges and then look-ups, each refused: well past the
			// attempt limit.
			require.Eventually(t, func() bool { return o.seen.Load() >= int64(policy.Attempts)+3 }, 10*time.Second, 5*time.Millisecond)
			resp, err := b.client.GetPaymentWithResponse(context.Background(), id, nil)
			require.NoError(t, err)
			require.Equal(t, api.PaymentStatus(payments.StatusPending), resp.JSON200.Status, "not settled while the provider cannot say")

			o.down.Store(false)
			final := b.awaitFinal(t, id)
			require.Equal(t, api.PaymentStatus(payments.StatusFailed), final.Status)
			require.Equal(t, payments.ReasonProviderUnavailable, string(*final.FailureReason))
			require.Empty(t, b.charges(t, id), "nothing was charged")
		})
	}
}

// forger stands between the worker and the provider and answers every
// charge or refund under path, and every look-up of one, as made for an
// amount of 1: what a provider gone wrong, or a host that is not the
// provider, might answer.
type forger struct {
	path   string // "/v1/charges" or "/v1/refunds"
	forged atomic.Int64
}

func (f *forger) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, r)
		var doc map[string]any
		if r.URL.Path != f.path || rec.Code >= 300 || json.Unmarshal(rec.Body.Bytes(), &doc) != nil || doc["amount"] == nil {
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			_, _ = w.Write(rec.Body.Bytes())
			return
		}
		doc["amount"] = 1
		f.forged.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rec.Code)
		_ = json.NewEncoder(w).Encode(doc)
	})
}

// A charge or refund answered for another amount than asked is never taken
// for the one asked (an answer of amount 1 once settled a payment of 100):
// the payment or refund stays pending, asked about again, and shows up as
// stuck.
func TestNothingIsSettledFromAForeignAnswer(t *testing.T) {
	t.Parallel()
	policy := fastPolicy
	policy.Attempts = 2
	// Both attempts and a look-up after them, each answered forged.
	forgedEnough := func(f *forger) func() bool {
		return func() bool { return f.forged.Load() >= int64(policy.Attempts)+1 }
	}
	for _, be := range payBackends[:2] {
		t.Run(be.name+", a charge", func(t *testing.T) {
			t.Parallel()
			f := &forger{path: "/v1/charges"}
			b := be.run(t, payOptions{policy: policy, wrap: f.wrap})
			r := b.pay(t, uuid.NewString(), paymentBody(b.order(t)))
			require.Equal(t, http.StatusAccepted, r.Status, "%s", r)
			id := decodePayment(t, r).Id
			require.Eventually(t, forgedEnough(f), 10*time.Second, 5*time.Millisecond)
			resp, err := b.client.GetPaymentWithResponse(context.Background(), id, nil)
			require.NoError(t, err)
			require.Equal(t, api.PaymentStatus(payments.StatusPending), resp.JSON200.Status, "not settled from a charge of 1")
			require.Nil(t, resp.JSON200.ProviderChargeId)
		})
		t.Run(be.name+", a refund", func(t *testing.T) {
			t.Parallel()
			f := &forger{path: "/v1/refunds"}
			b := be.run(t, payOptions{policy: policy, wrap: f.wrap})
			payment := b.paidPayment(t, 1000)
			r := b.refund(t, payment, uuid.NewString(), `{"amount":300,"reason":"returned"}`)
			require.Equal(t, http.StatusAccepted, r.Status, "%s", r)
			id := decodeRefund(t, r).Id
			require.Eventually(t, forgedEnough(f), 10*time.Second, 5*time.Millisecond)
			got := decodeRefund(t, b.do(t, b.newRequest(t, http.MethodGet, "/refunds/"+id, nil)))
			require.Equal(t, api.RefundStatus(payments.StatusPending), got.Status, "not settled from a refund of 1")
		})
	}
}
