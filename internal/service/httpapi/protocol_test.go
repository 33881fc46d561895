package httpapi_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/orders"
	"github.com/oncekey/oncekey/internal/wire/problem"
)

func TestSameMeaningDifferentBytesReplays(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{})
		const key = "same-meaning"

		first := b.postOrder(t, key, seedBody)
		requireFresh(t, first, "first request")

		// The seed with keys reordered at both levels and whitespace added.
		const respelled = "{\n  \"currency\" : \"RUB\",\t\"amount\": 1200 ,\r\n  \"items\" : [ { \"qty\": 2, \"sku\": \"SKU-1\" } ]\n}\n"
		again := b.postOrder(t, key, respelled)
		requireReplayOf(t, first, again, "respelled body")
		require.Equal(t, key, again.Header.Get("Idempotency-Key"), "replay must echo the key")
		require.Equal(t, 1, b.orderCount(t), "a respelled retry must not create a second order")
	})
}

func TestSameKeyDifferentRequestConflicts(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{})
		const key = "conflict-key"

		requireFresh(t, b.postOrder(t, key, seedBody), "first request")

		const qty3 = `{"items":[{"sku":"SKU-1","qty":3}],"amount":1200,"currency":"RUB"}`
		other := b.postOrder(t, key, qty3)
		requireProblem(t, other, problem.KeyMismatch, "same key, qty 3")
		require.Equal(t, key, other.Header.Get("Idempotency-Key"), "409 must echo the key")
		require.Empty(t, other.Header.Get("Idempotent-Replayed"), "a conflict is not a replay")

		resp := b.post(t, "/orders?x=1", key, seedBody)
		query := reply{Status: resp.StatusCode, Header: resp.Header, Body: readAll(t, resp.Body)}
		requireProblem(t, query, problem.KeyMismatch, "same key and body, different query")
		require.Equal(t, key, query.Header.Get("Idempotency-Key"), "409 must echo the key")

		require.Equal(t, 1, b.orderCount(t), "conflicting requests must not create orders")
	})
}

func TestKeysAreScopedPerAccount(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		store := be.open(t)
		a := setup(t, store, options{})
		b := setup(t, store, options{})
		require.NotEqual(t, a.account, b.account)
		const key = "shared-key"

		orderA := requireFresh(t, a.postOrder(t, key, seedBody), "account A")
		orderB := requireFresh(t, b.postOrder(t, key, seedBody), "account B, same key")
		require.NotEqual(t, orderA.Id, orderB.Id, "the same key in two accounts must make two orders")

		requireProblem(t, a.get(t, "/orders/"+orderB.Id), problem.NotFound, "account A reading B's order")
		requireProblem(t, b.get(t, "/orders/"+orderA.Id), problem.NotFound, "account B reading A's order")

		for _, c := range []struct {
			name string
			b    *testBundle
			want string
		}{{"A", a, orderA.Id}, {"B", b, orderB.Id}} {
			list, err := c.b.client.ListOrdersWithResponse(context.Background(), nil)
			require.NoError(t, err, "list orders of %s", c.name)
			require.Equal(t, http.StatusOK, list.StatusCode(), "list orders of %s: %s", c.name, list.Body)
			require.Len(t, list.JSON200.Items, 1, "account %s must see only its own order", c.name)
			require.Equal(t, c.want, list.JSON200.Items[0].Id, "account %s lists the wrong order", c.name)
		}
	})
}

func TestBusinessOutcomeIsStoredAndReplayed(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{})
		const key = "unknown-currency"
		// Matches the contract's ^[A-Z]{3}$, but is no ISO 4217 code.
		const xyz = `{"items":[{"sku":"SKU-1","qty":2}],"amount":1200,"currency":"XYZ"}`

		first := b.postOrder(t, key, xyz)
		requireProblem(t, first, httpapi.ProblemFor(orders.ErrUnknownCurrency), "currency XYZ")
		require.Equal(t, key, first.Header.Get("Idempotency-Key"), "422 must echo the key")
		require.Empty(t, first.Header.Get("Idempotent-Replayed"), "the first 422 is not a replay")

		again := b.postOrder(t, key, xyz)
		requireReplayOf(t, first, again, "currency XYZ again")

		fixed := b.postOrder(t, key, seedBody)
		requireProblem(t, fixed, problem.KeyMismatch, "a stored 422 binds the key; a corrected body needs a new key")
		require.Zero(t, b.orderCount(t), "a refused order must not be stored")
	})
}

// faultyRepo makes the first CreateOrder write the order and then fail,
// either by returning an error or by panicking; later calls pass through.
type faultyRepo struct {
	panics bool
	calls  atomic.Int32
}

var errInjected = errors.New("injected failure after the write")

// wrap makes the writes of one request go through r.
func (r *faultyRepo) wrap(inner orders.Writer) orders.Writer {
	return writerFunc(func(ctx context.Context, o orders.Order) error { return r.create(ctx, inner, o) })
}

func (r *faultyRepo) create(ctx context.Context, inner orders.Writer, o orders.Order) error {
	if err := inner.CreateOrder(ctx, o); err != nil {
		return err
	}
	if r.calls.Add(1) == 1 {
		if r.panics {
			panic(errInjected)
		}
		return errInjected
	}
	return nil
}

func TestServerErrorStoresNothingAndRollsBack(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		for _, fault := range []struct {
			name   string
			panics bool
		}{{"error", false}, {"panic", true}} {
			t.Run(fault.name, func(t *testing.T) {
				t.Parallel()
				repo := &faultyRepo{panics: fault.panics}
				b := setup(t, be.open(t), options{repo: repo.wrap})
				const key = "fails-first"

				failed := b.postOrder(t, key, seedBody)
				requireProblem(t, failed, problem.Internal, "first attempt fails after writing")
				require.Zero(t, b.orderCount(t), "the failed attempt's order must be rolled back")

				retry := b.postOrder(t, key, seedBody)
				requireFresh(t, retry, "retry after a 500 must run the operation")
				require.Equal(t, int32(2), repo.calls.Load(), "the retry must call CreateOrder again")
				require.Equal(t, 1, b.orderCount(t), "exactly the retry's order must exist")
			})
		}
	})
}

func TestExpiredKeyRunsAgain(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{cfg: httpapi.Config{TTL: 50 * time.Millisecond}})
		const key = "short-lived"

		firstReply := b.postOrder(t, key, seedBody)
		first := requireFresh(t, firstReply, "first request")
		// The key expires on the store's clock (the database's): until it
		// has, a retry replays the first answer; then one runs again.
		var again reply
		poll(t, 10*time.Second, "same key after the TTL", func() bool {
			again = b.postOrder(t, key, seedBody)
			if again.Header.Get("Idempotent-Replayed") == "" {
				return true
			}
			requireReplayOf(t, firstReply, again, "same key within the TTL")
			return false
		})
		second := requireFresh(t, again, "same key after the TTL")
		require.NotEqual(t, first.Id, second.Id, "an expired key must run the operation again")
		require.Equal(t, 2, b.orderCount(t))
	})
}

// TestAnswersSayHowLongKeysAreKept: every answer that repeats the key (the
// first, a replay, a mismatch) carries Idempotency-TTL, the configured
// retention in seconds, as openapi.yaml declares it (the validating client
// checks its form); an answer refusing a request without a key does not.
func TestAnswersSayHowLongKeysAreKept(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{cfg: httpapi.Config{TTL: 90 * time.Minute}})
		const key = "kept-how-long"

		first := b.postOrder(t, key, seedBody)
		requireFresh(t, first, "first request")
		require.Equal(t, "5400", first.Header.Get("Idempotency-TTL"), "the first answer says how long the key is kept")

		again := b.postOrder(t, key, seedBody)
		requireReplayOf(t, first, again, "same key, same request")
		require.Equal(t, "5400", again.Header.Get("Idempotency-TTL"), "a replay says it too")

		const qty3 = `{"items":[{"sku":"SKU-1","qty":3}],"amount":1200,"currency":"RUB"}`
		other := b.postOrder(t, key, qty3)
		requireProblem(t, other, problem.KeyMismatch, "same key, qty 3")
		require.Equal(t, "5400", other.Header.Get("Idempotency-TTL"), "a mismatch says it too")

		resp := b.post(t, "/orders", "", seedBody)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "no key")
		require.Empty(t, resp.Header.Values("Idempotency-TTL"), "a request refused for want of a key is told nothing of keys")
	})
}
