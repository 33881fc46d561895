package httpapi_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/gen/api"
	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/metrics"
	"github.com/oncekey/oncekey/internal/service/orders"
	"github.com/oncekey/oncekey/internal/service/servicetest"
	"github.com/oncekey/oncekey/internal/service/store/memory"
)

func TestCreateOrderFirstAndReplay(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{})
		key := "8e03978e-40d5-43e8-bc93-6894a57f9324"

		first := b.createOrder(t, key, seedBody)
		require.Equal(t, http.StatusCreated, first.StatusCode(), "first attempt: %s", first.Body)
		require.NotNil(t, first.JSON201)
		require.Equal(t, "/orders/"+first.JSON201.Id, first.HTTPResponse.Header.Get("Location"))
		require.Equal(t, key, first.HTTPResponse.Header.Get("Idempotency-Key"))
		require.Empty(t, first.HTTPResponse.Header.Get("Idempotent-Replayed"), "a first response is not a replay")

		retry := b.createOrder(t, key, seedBody)
		require.Equal(t, http.StatusCreated, retry.StatusCode(), "retry: %s", retry.Body)
		require.Equal(t, first.Body, retry.Body, "the replay must be byte-identical")
		require.Equal(t, "true", retry.HTTPResponse.Header.Get("Idempotent-Replayed"))
		require.Equal(t, first.HTTPResponse.Header.Get("Location"), retry.HTTPResponse.Header.Get("Location"))
		require.Equal(t, key, retry.HTTPResponse.Header.Get("Idempotency-Key"))
		require.Equal(t, 1, b.orderCount(t), "the retry must not create a second order")
	})
}

// TestOperationReadsNumbersByValue: the operation reads the body as sent,
// and its numbers by their exact value, as the fingerprint compares them:
// two spellings of one request (2.0 and 2, 1.2e3 and 1200) are one
// operation whichever arrives first.
func TestOperationReadsNumbersByValue(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{})
		key := "numbers-by-value"
		first := b.createOrder(t, key, `{"items":[{"sku":"SKU-1","qty":2.0}],"amount":1.2e3,"currency":"RUB"}`)
		require.Equal(t, http.StatusCreated, first.StatusCode(), "1.2e3 is the integer 1200: %s", first.Body)
		require.EqualValues(t, 1200, first.JSON201.Amount)
		require.EqualValues(t, 2, first.JSON201.Items[0].Qty)

		again := b.createOrder(t, key, seedBody)
		require.Equal(t, http.StatusCreated, again.StatusCode())
		require.Equal(t, "true", again.HTTPResponse.Header.Get("Idempotent-Replayed"))
		require.Equal(t, first.Body, again.Body)
		require.Equal(t, 1, b.orderCount(t))
	})
}

func TestDocsPage(t *testing.T) {
	t.Parallel()
	b := setup(t, memory.New(), options{})
	page, err := b.http.Get(b.url + "/docs")
	require.NoError(t, err)
	defer page.Body.Close()
	require.Equal(t, http.StatusOK, page.StatusCode)
	require.Contains(t, page.Header.Get("Content-Type"), "text/html")
	require.Contains(t, page.Header.Get("Content-Security-Policy"), "default-src 'self'", "nothing may load from elsewhere")
	html := string(readAll(t, page.Body))
	require.Contains(t, html, `spec-url="/openapi.yaml"`)
	require.Contains(t, html, `src="/docs/assets/redoc.standalone.js"`)

	bundle, err := http.Get(b.url + "/docs/assets/redoc.standalone.js")
	require.NoError(t, err)
	defer bundle.Body.Close()
	require.Equal(t, http.StatusOK, bundle.StatusCode)
	require.Greater(t, len(readAll(t, bundle.Body)), 100_000, "the vendored Redoc bundle is served")

	post, err := http.Post(b.url+"/docs/assets/redoc.standalone.js", "text/plain", strings.NewReader("x"))
	require.NoError(t, err)
	post.Body.Close()
	require.Equal(t, http.StatusMethodNotAllowed, post.StatusCode, "static files only answer GET and HEAD")
	require.Equal(t, []string{"GET", "HEAD"}, post.Header.Values("Allow"), "a 405 says what is allowed")

	for _, path := range []string{"/docs/assets/missing.js", "/docs/assets/"} {
		missing, err := b.http.Get(b.url + path)
		require.NoError(t, err)
		missing.Body.Close()
		require.Equal(t, http.StatusNotFound, missing.StatusCode, path)
		require.Equal(t, "application/problem+json", missing.Header.Get("Content-Type"), path)
	}
}

// unreachableAuth is a store whose API key lookups fail as they do when
// the database is down.
type unreachableAuth struct{ *memory.Store }

func (unreachableAuth) AccountByKeyHash(context.Context, auth.KeyHash) (uuid.UUID, error) {
	return uuid.UUID{}, fmt.Errorf("%w: connection refused", idempotency.ErrUnavailable)
}

// TestAuthLookupFailureIs503: a key that cannot be checked is not a bad
// key; a 401 would make clients give up on an operation they should retry.
func TestAuthLookupFailureIs503(t *testing.T) {
	t.Parallel()
	store := unreachableAuth{memory.New()}
	svc := servicetest.Start(t, store, servicetest.Options{NoAccount: true})

	req, err := http.NewRequest(http.MethodPost, svc.URL+"/orders", strings.NewReader(seedBody))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer ok_any")
	req.Header.Set("Idempotency-Key", "auth-down")
	req.Header.Set("Content-Type", "application/json")
	resp, err := validatingClient(t).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Equal(t, "1", resp.Header.Get("Retry-After"))
	require.Contains(t, string(readAll(t, resp.Body)), "https://oncekey.dev/problems/unavailable")
}

// blockUntilCancelled holds the first CreateOrder until its request is
// cancelled, as a slow database would; later calls pass through.
type blockUntilCancelled struct {
	first atomic.Bool
}

// wrap makes the writes of one request go through b.
func (b *blockUntilCancelled) wrap(inner orders.Writer) orders.Writer {
	return writerFunc(func(ctx context.Context, o orders.Order) error {
		if b.first.CompareAndSwap(false, true) {
			<-ctx.Done()
			return ctx.Err()
		}
		return inner.CreateOrder(ctx, o)
	})
}

// TestClientDisconnectIsNotAServerError: a client that gives up mid-operation
// leaves nothing stored, so its retry runs the operation, and the server
// counts the disconnect as a rejected request, not a 5xx.
func TestClientDisconnectIsNotAServerError(t *testing.T) {
	t.Parallel()
	m := metrics.New()
	b := setup(t, memory.New(), options{
		cfg:  httpapi.Config{Metrics: m},
		repo: (&blockUntilCancelled{}).wrap,
	})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := b.client.CreateOrderWithBodyWithResponse(ctx, &api.CreateOrderParams{IdempotencyKey: "gave-up"}, "application/json", strings.NewReader(seedBody))
	require.Error(t, err, "the client gave up")

	require.Eventually(t, func() bool {
		return counter(t, m, "oncekey_idempotency_requests_total", "rejected") == 1
	}, 5*time.Second, 10*time.Millisecond, "the disconnect is counted as rejected")
	require.Zero(t, counter(t, m, "oncekey_idempotency_requests_total", "error"), "and not as a server error")

	retry := b.createOrder(t, "gave-up", seedBody)
	require.Equal(t, http.StatusCreated, retry.StatusCode())
	require.Empty(t, retry.HTTPResponse.Header.Get("Idempotent-Replayed"), "nothing was stored: the retry runs the operation")
	require.Equal(t, 1, b.orderCount(t))
}

// counter reads one outcome's value of a counter vector from m.
func counter(t *testing.T, m *metrics.Metrics, name, outcome string) float64 {
	t.Helper()
	return metricValue(t, m, name, "operation", "POST /orders", "outcome", outcome)
}

// metricValue reads a counter's or a gauge's value from m: the series with
// every label pair given, or the only one when none is.
func metricValue(t *testing.T, m *metrics.Metrics, name string, labels ...string) float64 {
	t.Helper()
	families, err := m.Registry.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, metric := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range metric.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			match := true
			for i := 0; i+1 < len(labels); i += 2 {
				match = match && have[labels[i]] == labels[i+1]
			}
			if match {
				return metric.GetCounter().GetValue() + metric.GetGauge().GetValue()
			}
		}
	}
	return 0
}
