package gateway_test

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/recordcache"
	"github.com/oncekey/oncekey/idempotency/redisstore"
	"github.com/oncekey/oncekey/idempotency/redisstore/redistest"
	"github.com/oncekey/oncekey/internal/gateway"
	"github.com/oncekey/oncekey/internal/gateway/keyscope"
	"github.com/oncekey/oncekey/internal/gateway/upstreamtest"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// stores are the key stores a gateway runs on, each giving a fresh store
// (or one shared by the gateways of one test, through the returned
// function).
var stores = []struct {
	name string
	open func(t *testing.T) func(cfg gateway.Config) http.Handler
}{
	{"memory", func(t *testing.T) func(gateway.Config) http.Handler {
		s := memstore.New()
		return func(cfg gateway.Config) http.Handler { return newGateway(t, cfg, s) }
	}},
	// As oncekey proxy wires PostgreSQL: the deferred store (a claim and
	// its hold in one round trip), with the record cache in front.
	{"postgres", func(t *testing.T) func(gateway.Config) http.Handler {
		cache, err := recordcache.New(1000, nil)
		require.NoError(t, err)
		s := recordcache.Wrap(cache, deferredStore(t))
		return func(cfg gateway.Config) http.Handler { return newGateway(t, cfg, s) }
	}},
	{"redis", func(t *testing.T) func(gateway.Config) http.Handler {
		fast := redisstore.New(redistest.Shared(t), redisstore.Config{Prefix: "gateway-test:" + rand.Text() + ":"})
		s := redisstore.Wrap(fast, deferredStore(t))
		return func(cfg gateway.Config) http.Handler { return newGateway(t, cfg, s) }
	}},
}

// deferredStore is pgstore's deferred store on the test database.
func deferredStore(t *testing.T) idempotency.Store[*pgstore.Batch] {
	t.Helper()
	pg, err := pgstore.New(testdb.Pool(t), pgstore.Options{})
	require.NoError(t, err)
	s, err := pg.ClaimAtCommit()
	require.NoError(t, err)
	return s
}

func newGateway[U any](t *testing.T, cfg gateway.Config, store idempotency.Store[U]) http.Handler {
	t.Helper()
	h, err := gateway.New(cfg, store)
	require.NoError(t, err)
	return h
}

// routes covers POST /transfers (validated by the upstream's document) and
// POST /transfers/{id}, which the upstream answers 404.
func routes(t *testing.T, up *upstreamtest.Upstream) []gateway.Route {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromFile(up.Spec)
	require.NoError(t, err)
	rs, err := gateway.SpecRoutes(doc)
	require.NoError(t, err)
	return append(rs, gateway.Route{Method: "POST", Path: "/transfers/{id}"})
}

// client is a gateway's client: its requests carry a scope of the test's
// own and a fresh connection each (a connection the gateway left broken
// would otherwise fail the next request).
type client struct {
	t     *testing.T
	url   string
	scope string
}

func (c client) post(path, key, body string, header ...string) (*http.Response, string) {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodPost, c.url+path, strings.NewReader(body))
	require.NoError(c.t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Account-Id", c.scope)
	if key != "" {
		req.Header.Set(idempotency.HeaderKey, key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}).Do(req)
	require.NoError(c.t, err, "POST %s", path)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	return resp, string(b)
}

const transfer = `{"amount":500,"currency":"EUR"}`

// problemType is the slug of a problem+json body's type.
func problemType(t *testing.T, body string) string {
	t.Helper()
	var p struct {
		Type string `json:"type"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &p), "a problem+json body: %s", body)
	return p.Type[strings.LastIndex(p.Type, "/")+1:]
}

// TestOutcomes is docs/gateway.md's table of outcomes, one case a row, on
// every store: what the first request gets, what its retry with the same
// key gets, and how often the upstream ran the transfer.
func TestOutcomes(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t)
	dead := closedPort(t)
	type exchange struct {
		status int
		// problem is the problem type's slug, when the answer is one.
		problem  string
		replayed bool
	}
	tests := []struct {
		name string
		// path is /transfers unless given; body is a valid transfer
		// unless given.
		path, body string
		// retryBody and retryHeader, if given, make the retry another
		// request under the same key.
		retryBody   string
		retryHeader []string
		// fault is the first request's X-Fault; the retry has none.
		fault string
		cfg   func(*gateway.Config)
		// deadFirst sends the first request through a gateway whose
		// upstream is not there, on the same store.
		deadFirst     bool
		first, retry  exchange
		runs          int
		sameResponse  bool // the retry's body is the first's
		firstUpstream bool // the first answer is the upstream's own
	}{
		{
			name:  "2xx: stored and replayed",
			first: exchange{status: 201}, retry: exchange{status: 201, replayed: true}, runs: 1, sameResponse: true,
		},
		{
			name: "4xx: stored and replayed", path: "/transfers/" + uuid.NewString(),
			first: exchange{status: 404}, retry: exchange{status: 404, replayed: true}, runs: 0, sameResponse: true,
		},
		{
			name:  "4xx that refuses the request before it runs (400, 401, 403, 408, 413, 415, 429): key freed",
			cfg:   func(c *gateway.Config) { c.Routes = []gateway.Route{{Method: "POST", Path: "/transfers"}} },
			body:  `{"amount":0,"currency":"EUR"}`,
			first: exchange{status: 400}, retry: exchange{status: 400}, runs: 0,
		},
		{
			name: "5xx: not stored, key freed", fault: upstreamtest.Fail,
			first: exchange{status: 500}, retry: exchange{status: 201}, runs: 1,
		},
		{
			name: "connecting failed: 502, key freed", deadFirst: true,
			first: exchange{status: 502, problem: "upstream-unreachable"}, retry: exchange{status: 201}, runs: 1,
		},
		{
			name: "written, then reset: outcome unknown, never run again", fault: upstreamtest.Reset,
			first: exchange{status: 409, problem: idempotency.ProblemOf(idempotency.ErrOutcomeUnknown).Slug}, retry: exchange{status: 409, problem: idempotency.ProblemOf(idempotency.ErrOutcomeUnknown).Slug}, runs: 1,
		},
		{
			name: "written, then no answer in time: outcome unknown, never run again", fault: upstreamtest.Hang,
			cfg:   func(c *gateway.Config) { c.UpstreamTimeout = 300 * time.Millisecond },
			first: exchange{status: 409, problem: idempotency.ProblemOf(idempotency.ErrOutcomeUnknown).Slug}, retry: exchange{status: 409, problem: idempotency.ProblemOf(idempotency.ErrOutcomeUnknown).Slug}, runs: 1,
		},
		{
			name: "outcome unknown on a route that retries it (--on-unknown=retry)", fault: upstreamtest.Reset,
			cfg:   func(c *gateway.Config) { c.RetryUnknown = true },
			first: exchange{status: 409, problem: idempotency.ProblemOf(idempotency.ErrOutcomeUnknown).Slug}, retry: exchange{status: 201}, runs: 2,
		},
		{
			name:  "larger than --max-stored-bytes: passed through once, never run again",
			cfg:   func(c *gateway.Config) { c.MaxStored = 16 },
			first: exchange{status: 201}, retry: exchange{status: 409, problem: idempotency.ProblemOf(idempotency.ErrNotStored).Slug}, runs: 1,
		},
		{
			name: "against the document: 400, no key consumed", body: `{"amount":"five","currency":"EUR"}`,
			first: exchange{status: 400, problem: "validation-error"}, retry: exchange{status: 400, problem: "validation-error"}, runs: 0,
		},
		{
			name: "a number that differs beyond a double's precision is another request: 422 (409 under oncekey)", cfg: noValidation,
			retryBody: `{"amount":500.0000000000000000001,"currency":"EUR"}`,
			first:     exchange{status: 201}, retry: exchange{status: 422, problem: idempotency.ProblemOf(idempotency.ErrKeyMismatch).Slug}, runs: 1,
		},
		{
			name: "the same body as another JSON media type is another request: 422 (409 under oncekey)", cfg: noValidation,
			retryHeader: []string{"Content-Type", "application/merge-patch+json"},
			first:       exchange{status: 201}, retry: exchange{status: 422, problem: idempotency.ProblemOf(idempotency.ErrKeyMismatch).Slug}, runs: 1,
		},
		{
			name: "a query that does not parse: 400, nothing sent, no key consumed", path: "/transfers?note=a;b",
			first: exchange{status: 400, problem: idempotency.ProblemOf(idempotency.ErrMalformedQuery).Slug}, retry: exchange{status: 400, problem: idempotency.ProblemOf(idempotency.ErrMalformedQuery).Slug}, runs: 0,
		},
	}
	for _, store := range stores {
		t.Run(store.name, func(t *testing.T) {
			t.Parallel()
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					t.Parallel()
					open := store.open(t)
					cfg := gateway.Config{Upstream: mustURL(t, up.URL), Routes: routes(t, up), Scope: keyscope.Header("X-Account-Id"), Wait: 200 * time.Millisecond}
					if tt.cfg != nil {
						tt.cfg(&cfg)
					}
					live := httptest.NewServer(open(cfg))
					t.Cleanup(live.Close)
					first := live
					if tt.deadFirst {
						deadCfg := cfg
						deadCfg.Upstream = mustURL(t, "http://"+dead)
						first = httptest.NewServer(open(deadCfg))
						t.Cleanup(first.Close)
					}
					scope := "acct-" + rand.Text()
					path, body, key := "/transfers", transfer, uuid.NewString()
					if tt.path != "" {
						path = tt.path
					}
					if tt.body != "" {
						body = tt.body
					}
					check := func(what string, want exchange, resp *http.Response, got string) {
						t.Helper()
						require.Equal(t, want.status, resp.StatusCode, "%s: %s", what, got)
						if want.problem != "" {
							require.Equal(t, want.problem, problemType(t, got), "%s", what)
						}
						replayed := resp.Header.Get(idempotency.HeaderReplayed) == "true"
						require.Equal(t, want.replayed, replayed, "%s: Idempotent-Replayed", what)
					}
					var fault []string
					if tt.fault != "" {
						fault = []string{upstreamtest.Header, tt.fault}
					}
					resp1, body1 := client{t, first.URL, scope}.post(path, key, body, fault...)
					check("first", tt.first, resp1, body1)
					retryBody := body
					if tt.retryBody != "" {
						retryBody = tt.retryBody
					}
					resp2, body2 := client{t, live.URL, scope}.post(path, key, retryBody, tt.retryHeader...)
					check("retry", tt.retry, resp2, body2)
					if tt.sameResponse {
						require.Equal(t, body1, body2, "a replay is byte-exact")
					}
					_, byKey := up.Executions(t)
					require.Equal(t, tt.runs, byKey[key], "upstream executions of the key")
				})
			}
		})
	}
}

// noValidation covers POST /transfers without the document's body
// schema, so that a request the schema would refuse reaches the protocol.
func noValidation(c *gateway.Config) {
	c.Routes = []gateway.Route{{Method: "POST", Path: "/transfers"}}
}

// TestEdges: what the gateway passes, refuses and forwards.
func TestEdges(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t)
	var seen sync.Map // Idempotency-Key → the request's headers upstream
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Store(r.Header.Get(idempotency.HeaderKey), r.Header.Clone())
		w.Header().Set("Set-Cookie", "session=secret")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	t.Cleanup(echo.Close)
	for _, store := range stores {
		t.Run(store.name, func(t *testing.T) {
			t.Parallel()
			open := store.open(t)
			gw := httptest.NewServer(open(gateway.Config{Upstream: mustURL(t, up.URL), Routes: routes(t, up), Scope: keyscope.Header("X-Account-Id")}))
			t.Cleanup(gw.Close)

			// No scope: 401, and nothing reaches the upstream.
			req, _ := http.NewRequest(http.MethodPost, gw.URL+"/transfers", strings.NewReader(transfer))
			key := uuid.NewString()
			req.Header.Set(idempotency.HeaderKey, key)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "%s", b)
			require.Equal(t, idempotency.ProblemOf(idempotency.ErrNoScope).Slug, problemType(t, string(b)))
			_, byKey := up.Executions(t)
			require.Zero(t, byKey[key], "a request without a scope never reaches the upstream")

			// A request outside the covered routes passes through untouched.
			c := client{t, gw.URL, "acct-" + rand.Text()}
			resp, body := c.post("/transfers", "", transfer)
			require.Equal(t, http.StatusBadRequest, resp.StatusCode, "a covered route needs a key: %s", body)
			require.Equal(t, idempotency.ProblemOf(idempotency.ErrMissingKey).Slug, problemType(t, body))
			get, err := http.Get(gw.URL + "/transfers/" + uuid.NewString())
			require.NoError(t, err)
			get.Body.Close()
			require.Equal(t, http.StatusNotFound, get.StatusCode, "GET passes through to the upstream")

			// A key mismatch is 422 (the ietf profile), and runs nothing.
			key = uuid.NewString()
			resp, _ = c.post("/transfers", key, transfer)
			require.Equal(t, http.StatusCreated, resp.StatusCode)
			resp, body = c.post("/transfers", key, `{"amount":501,"currency":"EUR"}`)
			require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode, "%s", body)
			require.Equal(t, idempotency.ProblemOf(idempotency.ErrKeyMismatch).Slug, problemType(t, body))
			_, byKey = up.Executions(t)
			require.Equal(t, 1, byKey[key])

			// Forwarded headers, and what a replay never carries.
			eg := httptest.NewServer(open(gateway.Config{Upstream: mustURL(t, echo.URL), Routes: []gateway.Route{{Method: "POST", Path: "/echo"}}, Scope: keyscope.Header("X-Account-Id")}))
			t.Cleanup(eg.Close)
			ec := client{t, eg.URL, c.scope}
			key = uuid.NewString()
			resp, _ = ec.post("/echo", key, `{}`)
			require.Equal(t, http.StatusCreated, resp.StatusCode)
			got, ok := seen.Load(key)
			require.True(t, ok, "the key goes upstream")
			upstream := got.(http.Header)
			require.Equal(t, "127.0.0.1", upstream.Get("X-Forwarded-For"))
			require.Equal(t, "http", upstream.Get("X-Forwarded-Proto"))
			require.Equal(t, strings.TrimPrefix(eg.URL, "http://"), upstream.Get("X-Forwarded-Host"))
			require.Equal(t, `for=127.0.0.1;host="`+strings.TrimPrefix(eg.URL, "http://")+`";proto=http`, upstream.Get("Forwarded"))
			require.Equal(t, "session=secret", resp.Header.Get("Set-Cookie"), "the first answer is the upstream's whole")
			resp, body = ec.post("/echo", key, `{}`)
			require.Equal(t, http.StatusCreated, resp.StatusCode)
			require.Equal(t, `{"ok":true}`, body)
			require.Equal(t, "true", resp.Header.Get(idempotency.HeaderReplayed))
			require.Empty(t, resp.Header.Values("Set-Cookie"), "a replay never carries cookies")
		})
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	require.NoError(t, err)
	return u
}

// closedPort is a loopback address nothing listens on any more.
func closedPort(t *testing.T) string {
	t.Helper()
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	return gone.Listener.Addr().String()
}

// TestNoLeaksUnderFaults: requests through the gateway to an upstream that
// is down, slow, resetting, failing and hanging each get the answer the
// table of outcomes gives, and once they are answered the gateway holds no
// more goroutines than before: no request, connection or timer is left
// behind.
func TestNoLeaksUnderFaults(t *testing.T) {
	// Not parallel: it counts the process's goroutines.
	up := upstreamtest.Start(t)
	transport := &http.Transport{ResponseHeaderTimeout: 300 * time.Millisecond}
	t.Cleanup(transport.CloseIdleConnections)
	open := stores[0].open(t)
	cfg := gateway.Config{Upstream: mustURL(t, up.URL), Routes: routes(t, up), Scope: keyscope.Header("X-Account-Id"),
		Wait: 100 * time.Millisecond, UpstreamTimeout: 300 * time.Millisecond, Transport: transport}
	gw := httptest.NewServer(open(cfg))
	t.Cleanup(gw.Close)
	downCfg := cfg
	downCfg.Upstream = mustURL(t, "http://"+closedPort(t))
	down := httptest.NewServer(open(downCfg))
	t.Cleanup(down.Close)

	settle := func() int {
		transport.CloseIdleConnections()
		gw.CloseClientConnections()
		down.CloseClientConnections()
		return runtime.NumGoroutine()
	}
	before := settle()
	c, d := client{t, gw.URL, "acct-" + rand.Text()}, client{t, down.URL, "acct-" + rand.Text()}
	for round := range 3 {
		for _, f := range []struct {
			via    client
			fault  string
			status int
		}{
			{d, "", http.StatusBadGateway},
			{c, upstreamtest.Slow(50 * time.Millisecond), http.StatusCreated},
			{c, upstreamtest.Reset, http.StatusConflict},
			{c, upstreamtest.Fail, http.StatusInternalServerError},
			{c, upstreamtest.Hang, http.StatusConflict},
		} {
			resp, body := f.via.post("/transfers", uuid.NewString(), transfer, upstreamtest.Header, f.fault)
			require.Equal(t, f.status, resp.StatusCode, "round %d, fault %q: %s", round, f.fault, body)
		}
	}
	// Polled here on a ticker, not with require.Eventually, whose own
	// goroutines would be counted.
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	after := settle()
	for deadline := time.Now().Add(10 * time.Second); after > before && time.Now().Before(deadline); after = settle() {
		<-poll.C
	}
	if after > before {
		buf := make([]byte, 1<<20)
		t.Fatalf("goroutines: %d before the faults, %d after:\n%s", before, after, buf[:runtime.Stack(buf, true)])
	}
}

// roundTripFunc is a Transport that is a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestForwardedKeyIsNeverResentByTheTransport: the idempotency headers go
// upstream in a spelling that net/http's transport does not take for a
// request it may resend (Request.isReplayable looks the canonical names up
// in the header map), and a covered request's Accept-Encoding is left to
// the transport, which then decodes what it asked for.
func TestForwardedKeyIsNeverResentByTheTransport(t *testing.T) {
	t.Parallel()
	var sent http.Header
	transport := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		sent = r.Header.Clone()
		_, _ = io.Copy(io.Discard, r.Body)
		return &http.Response{StatusCode: http.StatusCreated, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(`{}`)), Request: r}, nil
	})
	gw := httptest.NewServer(stores[0].open(t)(gateway.Config{Upstream: mustURL(t, "http://upstream.invalid"),
		Routes: []gateway.Route{{Method: "POST", Path: "/echo"}}, Scope: keyscope.Header("X-Account-Id"), Transport: transport}))
	t.Cleanup(gw.Close)
	key := uuid.NewString()
	resp, body := client{t, gw.URL, "acct-" + rand.Text()}.post("/echo", key, `{}`, "X-Idempotency-Key", key, "Accept-Encoding", "gzip")
	require.Equal(t, http.StatusCreated, resp.StatusCode, body)
	for _, name := range []string{"Idempotency-Key", "X-Idempotency-Key"} {
		require.NotContains(t, sent, name, "%s under its canonical name", name)
		require.Equal(t, []string{key}, sent[strings.ToLower(name)], "%s goes upstream", name)
	}
	require.Empty(t, sent.Values("Accept-Encoding"), "the client's Accept-Encoding is not passed on a covered route")
}

// TestCompressedAnswersAreStoredDecoded: an upstream that gzips when asked
// is answered through the gateway, and replayed, as the JSON it is, to a
// client that asked for gzip itself.
func TestCompressedAnswersAreStoredDecoded(t *testing.T) {
	t.Parallel()
	gzipping := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"ok":true}`))
			return
		}
		w.Header().Set("Content-Encoding", "gzip")
		w.WriteHeader(http.StatusCreated)
		zw := gzip.NewWriter(w)
		_, _ = zw.Write([]byte(`{"ok":true}`))
		_ = zw.Close()
	}))
	t.Cleanup(gzipping.Close)
	gw := httptest.NewServer(stores[0].open(t)(gateway.Config{Upstream: mustURL(t, gzipping.URL),
		Routes: []gateway.Route{{Method: "POST", Path: "/echo"}}, Scope: keyscope.Header("X-Account-Id")}))
	t.Cleanup(gw.Close)
	c, key := client{t, gw.URL, "acct-" + rand.Text()}, uuid.NewString()
	for _, what := range []string{"first", "replay"} {
		resp, b := c.postUndecoded("/echo", key, "gzip")
		require.Equal(t, http.StatusCreated, resp.StatusCode, what)
		require.Empty(t, resp.Header.Get("Content-Encoding"), what)
		require.Equal(t, `{"ok":true}`, string(b), "%s: the body as JSON", what)
	}
}

// postUndecoded posts {} to path under key with the Accept-Encoding given
// (none if empty), through a client that neither asks for an encoding nor
// decodes one, so the body arrives as the gateway sends it.
func (c client) postUndecoded(path, key, acceptEncoding string) (*http.Response, []byte) {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodPost, c.url+path, strings.NewReader(`{}`))
	require.NoError(c.t, err)
	req.Header.Set("X-Account-Id", c.scope)
	req.Header.Set(idempotency.HeaderKey, key)
	if acceptEncoding != "" {
		req.Header.Set("Accept-Encoding", acceptEncoding)
	}
	resp, err := (&http.Client{Transport: &http.Transport{DisableCompression: true, DisableKeepAlives: true}}).Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	return resp, b
}

// TestAnswersEncodedUnaskedAreReplayedWithTheirEncoding: an upstream that
// deflates its answer though nobody asked (the gateway forwards no
// Accept-Encoding) has it stored as sent, so its replay must say how it is
// encoded, or a retry gets bytes it cannot read.
func TestAnswersEncodedUnaskedAreReplayedWithTheirEncoding(t *testing.T) {
	t.Parallel()
	var deflated bytes.Buffer
	zw, err := flate.NewWriter(&deflated, flate.BestSpeed)
	require.NoError(t, err)
	_, _ = zw.Write([]byte(`{"ok":true}`))
	require.NoError(t, zw.Close())
	deflating := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", "deflate")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(deflated.Bytes())
	}))
	t.Cleanup(deflating.Close)
	for _, s := range stores {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			gw := httptest.NewServer(s.open(t)(gateway.Config{Upstream: mustURL(t, deflating.URL),
				Routes: []gateway.Route{{Method: "POST", Path: "/echo"}}, Scope: keyscope.Header("X-Account-Id")}))
			t.Cleanup(gw.Close)
			c, key := client{t, gw.URL, "acct-" + rand.Text()}, uuid.NewString()
			for _, what := range []string{"first", "replay"} {
				resp, b := c.postUndecoded("/echo", key, "")
				require.Equal(t, http.StatusCreated, resp.StatusCode, what)
				require.Equal(t, "deflate", resp.Header.Get("Content-Encoding"), "%s: the body says how it is encoded", what)
				require.Equal(t, deflated.Bytes(), b, "%s: the bytes the upstream sent", what)
				require.Equal(t, what == "replay", resp.Header.Get(idempotency.HeaderReplayed) == "true", what)
			}
		})
	}
}

// TestPassedThroughRequestThatMayHaveRun: a request outside the covered
// routes that the upstream took and did not answer is a 502 that says it
// may have run, never "nothing was sent, retry".
func TestPassedThroughRequestThatMayHaveRun(t *testing.T) {
	t.Parallel()
	up := upstreamtest.Start(t)
	gw := httptest.NewServer(stores[0].open(t)(gateway.Config{Upstream: mustURL(t, up.URL),
		Routes: []gateway.Route{{Method: "POST", Path: "/other"}}, Scope: keyscope.Header("X-Account-Id")}))
	t.Cleanup(gw.Close)
	key := uuid.NewString()
	resp, body := client{t, gw.URL, "acct-" + rand.Text()}.post("/transfers", key, transfer, upstreamtest.Header, upstreamtest.Reset)
	require.Equal(t, http.StatusBadGateway, resp.StatusCode, body)
	require.Equal(t, gateway.UpstreamFailed.Slug, problemType(t, body))
	_, byKey := up.Executions(t)
	require.Equal(t, 1, byKey[key], "it ran upstream")
}

// TestStreamsAndBrokenAnswers: the outcomes table's rows for streams and
// answers that break off, on every store: a stream (text/event-stream)
// passes as it comes, is stored as it passes, and replays whole; a stream
// or an answer whose body breaks off midway is recorded as run and not
// stored, and its key is never run again.
func TestStreamsAndBrokenAnswers(t *testing.T) {
	t.Parallel()
	var runs sync.Map // key → *atomic.Int64
	count := func(key string) *atomic.Int64 {
		n, _ := runs.LoadOrStore(key, &atomic.Int64{})
		return n.(*atomic.Int64)
	}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		count(r.Header.Get(idempotency.HeaderKey)).Add(1)
		switch r.URL.Path {
		case "/events":
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			for i := range 3 {
				_, _ = fmt.Fprintf(w, "data: %d\n\n", i)
				http.NewResponseController(w).Flush()
			}
		case "/broken-events":
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			_, _ = fmt.Fprint(w, "data: 0\n\n")
			http.NewResponseController(w).Flush()
			panic(http.ErrAbortHandler) // the stream is cut midway
		case "/broken":
			w.Header().Set("Content-Length", "100")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"partial":`))
			http.NewResponseController(w).Flush()
			panic(http.ErrAbortHandler) // the connection is cut midway
		}
	}))
	t.Cleanup(upstream.Close)
	for _, store := range stores {
		t.Run(store.name, func(t *testing.T) {
			t.Parallel()
			gw := httptest.NewServer(store.open(t)(gateway.Config{Upstream: mustURL(t, upstream.URL),
				Routes: []gateway.Route{{Method: "POST", Path: "/events"}, {Method: "POST", Path: "/broken-events"}, {Method: "POST", Path: "/broken"}}, Scope: keyscope.Header("X-Account-Id")}))
			t.Cleanup(gw.Close)
			c := client{t, gw.URL, "acct-" + rand.Text()}

			key := uuid.NewString()
			resp, body := c.post("/events", key, `{}`)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.Equal(t, "data: 0\n\ndata: 1\n\ndata: 2\n\n", body, "the stream passes through whole")
			// The settle follows the stream's end: a retry just after it
			// may find the key running, and follow it to its end.
			resp, body = c.post("/events", key, `{}`)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
			require.Equal(t, "true", resp.Header.Get(idempotency.HeaderReplayed))
			require.Equal(t, "data: 0\n\ndata: 1\n\ndata: 2\n\n", body, "the stream is replayed whole")
			require.EqualValues(t, 1, count(key).Load(), "the stream ran once")

			for _, path := range []string{"/broken-events", "/broken"} {
				key = uuid.NewString()
				req, err := http.NewRequest(http.MethodPost, gw.URL+path, strings.NewReader(`{}`))
				require.NoError(t, err)
				req.Header.Set("X-Account-Id", c.scope)
				req.Header.Set(idempotency.HeaderKey, key)
				if resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req); err == nil {
					_, err = io.ReadAll(resp.Body)
					resp.Body.Close()
					require.Error(t, err, "%s: an answer that broke off upstream is not handed on as whole: %d", path, resp.StatusCode)
				}
				resp, body = c.post(path, key, `{}`)
				require.Equal(t, http.StatusConflict, resp.StatusCode, "%s: %s", path, body)
				require.Equal(t, idempotency.ProblemOf(idempotency.ErrNotStored).Slug, problemType(t, body), path)
				require.EqualValues(t, 1, count(key).Load(), "%s: the broken answer's operation ran once", path)
			}
		})
	}
}
