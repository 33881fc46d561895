package httpapi_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/gen/api"
	"github.com/oncekey/oncekey/gen/apiclient"
	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/conformance"
	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/orders"
	"github.com/oncekey/oncekey/internal/service/servicetest"
	"github.com/oncekey/oncekey/internal/service/store"
	"github.com/oncekey/oncekey/internal/service/store/memory"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// backend is a store the HTTP layer runs on, with what tests count.
type backend interface {
	store.Backend
	CountBonusEntries(ctx context.Context, account uuid.UUID) (int, error)
	CountPayments(ctx context.Context, account uuid.UUID) (int, error)
}

// backendCase is one store the tests run on.
type backendCase struct {
	name string
	open func(t *testing.T) backend
}

// forEachBackend runs test once per backend, each in a parallel subtest
// named after it.
func forEachBackend(t *testing.T, test func(t *testing.T, be backendCase)) {
	t.Helper()
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			test(t, be)
		})
	}
}

// backends are the stores every component test runs against: the protocol
// must behave the same on both.
var backends = []backendCase{
	{"memory", func(t *testing.T) backend { return memory.New() }},
	{"postgres", func(t *testing.T) backend { return postgres.New(testdb.Pool(t), nil) }},
}

// testBundle is what a component test works with.
type testBundle struct {
	url     string // the service
	client  *apiclient.ClientWithResponses
	http    *http.Client // validates every response against openapi.yaml
	store   backend
	account uuid.UUID
	apiKey  string
}

// options adjust the server a test runs; zero values mean the defaults.
type options struct {
	cfg  httpapi.Config                    // fields copied over the defaults when set
	repo func(orders.Writer) orders.Writer // wraps the order writes (fault injection)
}

// setup starts the full service on store and creates an account on it.
func setup(t *testing.T, store backend, opts options) *testBundle {
	t.Helper()
	svc := servicetest.Start(t, store, servicetest.Options{Config: opts.cfg, Orders: opts.repo, Wrap: labelRequests})
	url := svc.URL
	b := &testBundle{url: url, store: store, account: svc.Account, apiKey: svc.APIKey}
	b.http = validatingClient(t)
	var err error
	b.client, err = apiclient.NewClientWithResponses(url, apiclient.WithHTTPClient(b.http), apiclient.WithRequestEditorFn(b.authorize))
	require.NoError(t, err, "build client")
	return b
}

func (b *testBundle) authorize(_ context.Context, r *http.Request) error {
	if r.Header.Get("Authorization") == "" {
		r.Header.Set("Authorization", "Bearer "+b.apiKey)
	}
	return nil
}

// seedBody is the seed's order request.
const seedBody = `{"items":[{"sku":"SKU-1","qty":2}],"amount":1200,"currency":"RUB"}`

// post sends a raw POST with the bundle's API key, for tests that need
// exact bytes or headers the generated client would not send.
func (b *testBundle) post(t *testing.T, path, key, body string, header ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.url+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+b.apiKey)
	if key != "" {
		req.Header.Set(idempotency.HeaderKey, key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	resp, err := b.http.Do(req)
	require.NoError(t, err, "POST %s", path)
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// createOrder posts the body under key through the generated client.
func (b *testBundle) createOrder(t *testing.T, key, body string) *apiclient.CreateOrderResponse {
	t.Helper()
	resp, err := b.client.CreateOrderWithBodyWithResponse(context.Background(), &api.CreateOrderParams{IdempotencyKey: key}, "application/json", strings.NewReader(body))
	require.NoError(t, err, "create order")
	return resp
}

// orderCount counts the account's orders through the repository.
func (b *testBundle) orderCount(t *testing.T) int {
	t.Helper()
	list, err := b.store.ListOrders(context.Background(), b.account, nil, 10_000)
	require.NoError(t, err, "list orders")
	return len(list)
}

func readAll(t *testing.T, r io.Reader) []byte {
	t.Helper()
	b, err := io.ReadAll(r)
	require.NoError(t, err)
	return b
}

// validatingClient returns a client that checks every response the test
// receives against openapi.yaml (status, headers, body) and fails the test
// on any violation, so the contract and the server cannot drift apart.
func validatingClient(t *testing.T) *http.Client {
	t.Helper()
	doc, err := httpapi.LoadSpec()
	require.NoError(t, err)
	v, err := conformance.NewValidatingTransport(doc, "", nil)
	require.NoError(t, err, "build validating transport")
	t.Cleanup(func() {
		for _, violation := range v.Violations() {
			t.Error(violation)
		}
	})
	return &http.Client{Transport: v, Timeout: 30 * time.Second}
}
