package client_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/client"
	"github.com/oncekey/oncekey/gen/api"
	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/auth"
	"github.com/oncekey/oncekey/internal/httpapi"
	"github.com/oncekey/oncekey/internal/problem"
	"github.com/oncekey/oncekey/internal/store/postgres"
	"github.com/oncekey/oncekey/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// fault is what the injector does to one request.
type fault int

const (
	pass            fault = iota // let it through
	dropAfterCommit              // run it to completion, then cut the connection before the answer
	unavailable                  // 503 with Retry-After: 0, without running it
	inProgress                   // 202 request-in-progress with Retry-After: 0, without running it
)

// injector sits in front of the real service and applies a script of
// faults, one per request, recording the Idempotency-Key of each.
type injector struct {
	next http.Handler

	mu     sync.Mutex
	script []fault
	keys   []string
}

func (f *injector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.keys = append(f.keys, r.Header.Get(idempotency.HeaderKey))
	action := pass
	if len(f.script) > 0 {
		action, f.script = f.script[0], f.script[1:]
	}
	f.mu.Unlock()

	switch action {
	case dropAfterCommit:
		f.next.ServeHTTP(httptest.NewRecorder(), r) // committed, answer thrown away
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

type testBundle struct {
	client   *client.Client
	injector *injector
	count    func() int
}

func setup(t *testing.T, script ...fault) *testBundle {
	t.Helper()
	store := postgres.New(testdb.Pool(t), nil)
	handler, err := httpapi.New(httpapi.Config{Backend: store})
	require.NoError(t, err)
	inj := &injector{next: handler, script: script}
	srv := httptest.NewServer(inj)
	t.Cleanup(srv.Close)

	creds, err := auth.CreateAccount(context.Background(), store, "sdk-"+t.Name(), "")
	require.NoError(t, err)
	c, err := client.New(client.Config{
		BaseURL: srv.URL, APIKey: creds.APIKey,
		// A connection per request: Go's transport would otherwise retry a
		// request cut on a reused connection by itself, hiding what the SDK does.
		HTTPClient:  &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second},
		MaxAttempts: 4,
		BaseDelay:   time.Millisecond,
		MaxDelay:    10 * time.Millisecond,
	})
	require.NoError(t, err)
	return &testBundle{client: c, injector: inj, count: func() int {
		list, err := store.ListOrders(context.Background(), creds.AccountID, nil, 1000)
		require.NoError(t, err)
		return len(list)
	}}
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

			keys := b.injector.seen()
			require.Len(t, keys, len(tt.script)+1, "one attempt per fault plus the one that got through")
			for _, k := range keys {
				require.Equal(t, keys[0], k, "every attempt of one operation carries the same key")
			}
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
