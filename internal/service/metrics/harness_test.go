package metrics_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/metrics"
	"github.com/oncekey/oncekey/internal/service/orders"
	"github.com/oncekey/oncekey/internal/service/servicetest"
	"github.com/oncekey/oncekey/internal/service/store"
	"github.com/oncekey/oncekey/internal/service/store/memory"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// backend is a store the service runs on.
type backend = store.Backend

// backends are the stores the request-driven metrics are proved on: the
// metrics must not depend on which one the service uses.
var backends = []struct {
	name string
	open func(t *testing.T) backend
}{
	{"memory", func(*testing.T) backend { return memory.New() }},
	{"postgres", func(t *testing.T) backend { return postgres.New(testdb.Pool(t), nil) }},
}

// seedBody is a valid order request.
const seedBody = `{"items":[{"sku":"SKU-1","qty":2}],"amount":1200,"currency":"RUB"}`

// testBundle is the full service on one store, with its metrics and an
// account to act as.
type testBundle struct {
	url     string // the service; GET url+"/metrics" is its scrape endpoint
	metrics *metrics.Metrics
	store   backend
	account uuid.UUID
	apiKey  string
	client  *http.Client
}

// options adjust the service a test runs; zero values mean the defaults.
type options struct {
	cfg  httpapi.Config                    // fields copied over the defaults when set
	repo func(orders.Writer) orders.Writer // wraps the order writes (fault injection)
}

// setup starts the full service (httpapi.New with metrics.New() unless
// opts sets Metrics) on store and creates an account on it.
func setup(t *testing.T, store backend, opts options) *testBundle {
	t.Helper()
	cfg := opts.cfg
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New()
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	svc := servicetest.Start(t, store, servicetest.Options{Config: cfg, Orders: opts.repo})
	return &testBundle{url: svc.URL, metrics: cfg.Metrics, store: store, client: &http.Client{Timeout: 30 * time.Second},
		account: svc.Account, apiKey: svc.APIKey}
}

// newAccount creates an account on store and returns its id and API key.
func newAccount(t *testing.T, store auth.Store) (uuid.UUID, string) {
	t.Helper()
	creds, err := auth.CreateAccount(context.Background(), store, "metrics-"+t.Name(), "")
	require.NoError(t, err, "create account")
	return creds.AccountID, creds.APIKey
}

// reply is a whole response (see servicetest.Reply).
type reply = servicetest.Reply

// request builds a request to the service with the bundle's API key (see
// servicetest.NewRequest for the header pairs).
func (b *testBundle) request(t *testing.T, method, path, body string, header ...string) *http.Request {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := servicetest.NewRequest(method, b.url+path, b.apiKey, r, header...)
	require.NoError(t, err)
	return req
}

// exchange sends req and reads the whole reply; it returns errors instead
// of failing the test, so goroutines can use it.
func (b *testBundle) exchange(req *http.Request) (reply, error) {
	return servicetest.Exchange(b.client, req)
}

// do sends method path with the bundle's API key and requires the status.
func (b *testBundle) do(t *testing.T, want int, method, path, body string, header ...string) reply {
	t.Helper()
	r, err := b.exchange(b.request(t, method, path, body, header...))
	require.NoError(t, err)
	require.Equal(t, want, r.Status, "%s %s: unexpected answer %s", method, path, r)
	return r
}

// createOrder posts body under key, requires a 201 and returns the order id.
func (b *testBundle) createOrder(t *testing.T, key, body string) string {
	t.Helper()
	r := b.do(t, http.StatusCreated, http.MethodPost, "/orders", body, idempotency.HeaderKey, key)
	var o struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal(r.Body, &o), "decode order %s", r.Body)
	require.NotEmpty(t, o.ID, "order without id: %s", r.Body)
	return o.ID
}

// families is one scrape of /metrics, by family name.
type families map[string]*dto.MetricFamily

// scrape fetches GET baseURL/metrics over HTTP and parses the Prometheus
// text format.
func scrape(t *testing.T, baseURL string) families {
	t.Helper()
	resp, err := http.Get(baseURL + "/metrics")
	require.NoError(t, err, "GET /metrics")
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "GET /metrics status")
	require.True(t, strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain"),
		"GET /metrics must serve the text format, got Content-Type %q", resp.Header.Get("Content-Type"))
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err, "parse /metrics")
	return fams
}

// scrapeMetrics serves m alone over HTTP and scrapes it: for collectors
// that need no service around them.
func scrapeMetrics(t *testing.T, m *metrics.Metrics) families {
	t.Helper()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	return scrape(t, srv.URL)
}

// find returns the sample of the series name{labels} (label name, value
// pairs; the series' label set must be exactly these). A histogram's
// name_count and name_sum are samples too.
func (f families) find(name string, labels ...string) (float64, bool) {
	fam, part := f[name], ""
	if fam == nil {
		for _, suffix := range []string{"_count", "_sum"} {
			base, ok := strings.CutSuffix(name, suffix)
			if ok && f[base] != nil && f[base].GetType() == dto.MetricType_HISTOGRAM {
				fam, part = f[base], suffix
			}
		}
	}
	if fam == nil {
		return 0, false
	}
	for _, m := range fam.GetMetric() {
		if !sameLabels(m.GetLabel(), labels) {
			continue
		}
		switch {
		case part == "_count":
			return float64(m.GetHistogram().GetSampleCount()), true
		case part == "_sum":
			return m.GetHistogram().GetSampleSum(), true
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Untyped != nil:
			return m.GetUntyped().GetValue(), true
		}
	}
	return 0, false
}

// value is find for a series that must exist.
func (f families) value(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	v, ok := f.find(name, labels...)
	require.True(t, ok, "no series %s%v in /metrics; the family has: %s", name, labels, f.series(name))
	return v
}

// valueOrZero is find for a counter series that may not have been created
// yet (vectors create a series on its first observation).
func (f families) valueOrZero(name string, labels ...string) float64 {
	v, _ := f.find(name, labels...)
	return v
}

// series lists the label sets of a family, for failure messages.
func (f families) series(name string) string {
	fam := f[name]
	if fam == nil {
		fam = f[strings.TrimSuffix(strings.TrimSuffix(name, "_count"), "_sum")]
	}
	if fam == nil {
		return "(no such family)"
	}
	var out []string
	for _, m := range fam.GetMetric() {
		var pairs []string
		for _, l := range m.GetLabel() {
			pairs = append(pairs, l.GetName()+"="+l.GetValue())
		}
		out = append(out, "{"+strings.Join(pairs, ",")+"}")
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

func sameLabels(got []*dto.LabelPair, want []string) bool {
	if len(want)%2 != 0 || len(got) != len(want)/2 {
		return false
	}
	for i := 0; i < len(want); i += 2 {
		found := false
		for _, l := range got {
			if l.GetName() == want[i] && l.GetValue() == want[i+1] {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// faultyRepo passes orders through, except by amount: failAmount fails,
// panicAmount panics, and holdAmount is held inside CreateOrder, before
// anything is written, until release is closed, so a first request stays
// in flight while a test sends its duplicate.
type faultyRepo struct {
	held    chan struct{} // receives once per held order, when it is held
	release chan struct{}
	once    sync.Once
}

const (
	holdAmount  = 4242
	failAmount  = 5000
	panicAmount = 6000
)

var errInjected = errors.New("injected repository failure")

// newFaultyRepo returns the repository; a test wraps the store with it
// through options.repo and registers unblock with t.Cleanup after setup, so
// a failed test releases the held request before the server's Close waits
// for it.
func newFaultyRepo() *faultyRepo {
	return &faultyRepo{held: make(chan struct{}, 1), release: make(chan struct{})}
}

func (r *faultyRepo) unblock() { r.once.Do(func() { close(r.release) }) }

// wrap makes the writes of one request go through r.
func (r *faultyRepo) wrap(inner orders.Writer) orders.Writer {
	return writerFunc(func(ctx context.Context, o orders.Order) error { return r.create(ctx, inner, o) })
}

// writerFunc is an orders.Writer made of a function.
type writerFunc func(ctx context.Context, o orders.Order) error

func (f writerFunc) CreateOrder(ctx context.Context, o orders.Order) error { return f(ctx, o) }

func (r *faultyRepo) create(ctx context.Context, inner orders.Writer, o orders.Order) error {
	switch o.Amount {
	case failAmount:
		return errInjected
	case panicAmount:
		panic("injected repository panic")
	case holdAmount:
		select {
		case r.held <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		select {
		case <-r.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return inner.CreateOrder(ctx, o)
}

// startHeld sends an order of holdAmount under key from a goroutine and
// returns once repo holds it inside CreateOrder.
func (b *testBundle) startHeld(t *testing.T, repo *faultyRepo, key string) <-chan reply {
	t.Helper()
	out := servicetest.Async(b.client, b.request(t, http.MethodPost, "/orders", orderBody(holdAmount), idempotency.HeaderKey, key))
	select {
	case <-repo.held:
	case <-time.After(10 * time.Second):
		t.Fatal("the request never reached CreateOrder")
	}
	return out
}

// receive waits for the reply of a request sent from a goroutine.
func receive(t *testing.T, c <-chan reply, what string) reply {
	t.Helper()
	return servicetest.Receive(t, c, what, 10*time.Second)
}

// orderBody is a valid order request for amount.
func orderBody(amount int) string {
	return fmt.Sprintf(`{"items":[{"sku":"SKU-1","qty":1}],"amount":%d,"currency":"RUB"}`, amount)
}
