package metrics_test

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/oapi"
	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/store/memory"
)

// operation is the idempotent operation the outcome test drives, as its
// metrics label it.
const operation = "POST /orders"

// idempotentOperations are the operations openapi.yaml puts under the
// protocol, as the metrics label them: the fixed set of the operation
// label, read from the spec as the server reads it, so that a new
// operation needs no edit here.
var idempotentOperations = func() []string {
	doc, err := httpapi.LoadSpec()
	if err != nil {
		panic(err)
	}
	ops, err := oapi.New(doc, idempotency.New(idempotency.Config{}))
	if err != nil {
		panic(err)
	}
	var names []string
	for _, op := range ops.Covered() {
		names = append(names, idempotency.OperationName(op.Method, op.Path))
	}
	slices.Sort(names)
	return names
}()

var allOutcomes = []idempotency.Outcome{
	idempotency.OutcomeExecuted, idempotency.OutcomeReplayed, idempotency.OutcomeConflict,
	idempotency.OutcomeInFlight, idempotency.OutcomeRejected, idempotency.OutcomeError,
	idempotency.OutcomeUnknown, idempotency.OutcomeNotStored,
}

// outcomeCounts reads oncekey_idempotency_requests_total for every outcome
// of POST /orders; all of them exist from the start.
func outcomeCounts(t *testing.T, f families) map[idempotency.Outcome]float64 {
	t.Helper()
	counts := map[idempotency.Outcome]float64{}
	for _, o := range allOutcomes {
		counts[o] = f.value(t, "oncekey_idempotency_requests_total", "operation", operation, "outcome", string(o))
	}
	return counts
}

// Every idempotent operation of openapi.yaml has all its outcome series
// from the start, at zero: a dashboard or an alert on a new operation sees
// a zero before its first request, not a missing series.
func TestEveryIdempotentOperationHasItsSeries(t *testing.T) {
	t.Parallel()
	require.Subset(t, idempotentOperations, []string{operation, "PATCH /orders/{id}", "POST /payments"}, "the operations read from openapi.yaml")
	b := setup(t, memory.New(), options{})
	f := scrape(t, b.url)
	for _, op := range idempotentOperations {
		for _, o := range allOutcomes {
			require.Zero(t, f.value(t, "oncekey_idempotency_requests_total", "operation", op, "outcome", string(o)), "%s %s", op, o)
		}
	}
}

func TestIdempotencyOutcomeMetrics(t *testing.T) {
	t.Parallel()
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			const wait = 100 * time.Millisecond
			repo := newFaultyRepo()
			b := setup(t, be.open(t), options{cfg: httpapi.Config{Wait: wait}, repo: repo.wrap})
			t.Cleanup(repo.unblock) // after setup's, so it runs before the server's Close

			counts := outcomeCounts(t, scrape(t, b.url))
			for o, n := range counts {
				require.Zero(t, n, "outcome %s starts at zero", o)
			}
			// step runs one action and requires that exactly the outcome
			// counts in delta changed, by exactly those amounts.
			step := func(what string, delta map[idempotency.Outcome]float64, action func()) {
				t.Helper()
				action()
				after := outcomeCounts(t, scrape(t, b.url))
				for _, o := range allOutcomes {
					require.Equal(t, counts[o]+delta[o], after[o], "%s: change of outcome %q", what, o)
				}
				counts = after
			}

			key := uuid.NewString()
			step("first request", map[idempotency.Outcome]float64{idempotency.OutcomeExecuted: 1}, func() {
				b.do(t, http.StatusCreated, http.MethodPost, "/orders", seedBody, idempotency.HeaderKey, key)
			})
			step("repeat", map[idempotency.Outcome]float64{idempotency.OutcomeReplayed: 1}, func() {
				r := b.do(t, http.StatusCreated, http.MethodPost, "/orders", seedBody, idempotency.HeaderKey, key)
				require.Equal(t, "true", r.Header.Get(idempotency.HeaderReplayed), "the repeat is a replay")
			})
			step("same key, other body", map[idempotency.Outcome]float64{idempotency.OutcomeConflict: 1}, func() {
				b.do(t, http.StatusConflict, http.MethodPost, "/orders", orderBody(1300), idempotency.HeaderKey, key)
			})

			heldKey := uuid.NewString()
			var firstC <-chan reply
			step("duplicate while the first runs", map[idempotency.Outcome]float64{idempotency.OutcomeInFlight: 1}, func() {
				firstC = b.startHeld(t, repo, heldKey)
				r := b.do(t, http.StatusAccepted, http.MethodPost, "/orders", orderBody(holdAmount), idempotency.HeaderKey, heldKey)
				require.NotEmpty(t, r.Header.Get("Retry-After"), "202 carries Retry-After")
			})
			step("the held first request finishes", map[idempotency.Outcome]float64{idempotency.OutcomeExecuted: 1}, func() {
				repo.unblock()
				r := receive(t, firstC, "the held first request")
				require.Equal(t, http.StatusCreated, r.Status, "the held first request: %s", r)
			})

			// Rejected by the contract gate before the idempotency layer
			// saw them: each is counted once, as rejected.
			step("no Idempotency-Key", map[idempotency.Outcome]float64{idempotency.OutcomeRejected: 1}, func() {
				b.do(t, http.StatusBadRequest, http.MethodPost, "/orders", seedBody)
			})
			step("invalid body", map[idempotency.Outcome]float64{idempotency.OutcomeRejected: 1}, func() {
				b.do(t, http.StatusBadRequest, http.MethodPost, "/orders", `{"amount":"lots"}`, idempotency.HeaderKey, uuid.NewString())
			})
			step("no API key", map[idempotency.Outcome]float64{idempotency.OutcomeRejected: 1}, func() {
				b.do(t, http.StatusUnauthorized, http.MethodPost, "/orders", seedBody, idempotency.HeaderKey, uuid.NewString(), "Authorization", "")
			})
			step("wrong media type", map[idempotency.Outcome]float64{idempotency.OutcomeRejected: 1}, func() {
				b.do(t, http.StatusUnsupportedMediaType, http.MethodPost, "/orders", seedBody, idempotency.HeaderKey, uuid.NewString(), "Content-Type", "text/plain")
			})
			step("the operation fails", map[idempotency.Outcome]float64{idempotency.OutcomeError: 1}, func() {
				b.do(t, http.StatusInternalServerError, http.MethodPost, "/orders", orderBody(failAmount), idempotency.HeaderKey, uuid.NewString())
			})
			step("the operation panics", map[idempotency.Outcome]float64{idempotency.OutcomeError: 1}, func() {
				b.do(t, http.StatusInternalServerError, http.MethodPost, "/orders", orderBody(panicAmount), idempotency.HeaderKey, uuid.NewString())
			})
			step("safe requests", nil, func() {
				b.do(t, http.StatusOK, http.MethodGet, "/orders", "")
				b.do(t, http.StatusNotFound, http.MethodGet, "/orders/"+uuid.NewString(), "")
			})

			// The duplicate-wait histogram has one observation per request
			// that did not run the operation, and none for the others.
			f := scrape(t, b.url)
			for _, o := range []idempotency.Outcome{idempotency.OutcomeReplayed, idempotency.OutcomeInFlight, idempotency.OutcomeConflict} {
				require.Equal(t, counts[o], f.value(t, "oncekey_idempotency_duplicate_wait_seconds_count", "operation", operation, "outcome", string(o)),
					"duplicate waits observed for %s equal its requests", o)
			}
			for _, o := range []idempotency.Outcome{idempotency.OutcomeExecuted, idempotency.OutcomeRejected, idempotency.OutcomeError} {
				require.Zero(t, f.valueOrZero("oncekey_idempotency_duplicate_wait_seconds_count", "operation", operation, "outcome", string(o)),
					"no duplicate wait is observed for %s", o)
			}
			inFlight := f.value(t, "oncekey_idempotency_duplicate_wait_seconds_sum", "operation", operation, "outcome", string(idempotency.OutcomeInFlight))
			require.GreaterOrEqual(t, inFlight, wait.Seconds(), "the in_flight duplicate waited the whole Wait before its 202")
			require.Less(t, inFlight, 5.0, "the in_flight wait is bounded by Wait, not the held request")
			for _, o := range []idempotency.Outcome{idempotency.OutcomeReplayed, idempotency.OutcomeConflict} {
				d := f.value(t, "oncekey_idempotency_duplicate_wait_seconds_sum", "operation", operation, "outcome", string(o))
				require.Less(t, d, 1.0, "a %s duplicate of a finished request does not wait for anything", o)
			}
		})
	}
}
