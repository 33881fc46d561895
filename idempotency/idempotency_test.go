package idempotency_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
)

func TestParseKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		values  []string
		want    string
		wantErr error
	}{
		{"uuid", []string{"8e03978e-40d5-43e8-bc93-6894a57f9324"}, "8e03978e-40d5-43e8-bc93-6894a57f9324", nil},
		{"printable ascii with spaces", []string{"order 42 / retry-safe ~!"}, "order 42 / retry-safe ~!", nil},
		{"quoted is kept as sent", []string{`"abc"`}, `"abc"`, nil},
		{"255 bytes", []string{strings.Repeat("k", 255)}, strings.Repeat("k", 255), nil},
		{"missing", nil, "", idempotency.ErrMissingKey},
		{"empty", []string{""}, "", idempotency.ErrInvalidKey},
		{"256 bytes", []string{strings.Repeat("k", 256)}, "", idempotency.ErrInvalidKey},
		{"tab", []string{"a\tb"}, "", idempotency.ErrInvalidKey},
		{"control character", []string{"a\x01b"}, "", idempotency.ErrInvalidKey},
		{"DEL", []string{"a\x7fb"}, "", idempotency.ErrInvalidKey},
		{"non-ASCII", []string{"ключ"}, "", idempotency.ErrInvalidKey},
		{"two headers", []string{"a", "b"}, "", idempotency.ErrInvalidKey},
		{"two equal headers", []string{"a", "a"}, "", idempotency.ErrInvalidKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := http.Header{}
			for _, v := range tt.values {
				h.Add(idempotency.HeaderKey, v)
			}
			got, err := idempotency.ParseKey(h.Values(idempotency.HeaderKey))
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestRequestFingerprint(t *testing.T) {
	t.Parallel()
	const body = `{"items":[{"sku":"SKU-1","qty":2}],"amount":1200,"currency":"RUB"}`
	base := func() (string, string, string, url.Values, string) {
		return "POST", "/orders", "/orders", url.Values{}, body
	}
	fp := func(t *testing.T, method, route, path string, q url.Values, b string) idempotency.Fingerprint {
		t.Helper()
		f, err := idempotency.Request{Method: method, Route: route, Path: path, Query: q.Encode(), Body: []byte(b)}.Fingerprint()
		require.NoError(t, err)
		return f
	}
	m0, r0, p0, q0, b0 := base()
	ref := fp(t, m0, r0, p0, q0, b0)

	same := []struct {
		name string
		edit func(m, r, p *string, q *url.Values, b *string)
	}{
		{"keys reordered and whitespace", func(_, _, _ *string, _ *url.Values, b *string) {
			*b = "{ \"currency\": \"RUB\",\n \"amount\": 1200, \"items\": [ {\"qty\": 2, \"sku\": \"SKU-1\"} ] }"
		}},
		{"number spelled differently", func(_, _, _ *string, _ *url.Values, b *string) {
			*b = `{"items":[{"sku":"SKU-1","qty":2.0}],"amount":1.2e3,"currency":"RUB"}`
		}},
		{"string escape", func(_, _, _ *string, _ *url.Values, b *string) {
			*b = `{"items":[{"sku":"SKU\u002d1","qty":2}],"amount":1200,"currency":"\u0052UB"}`
		}},
	}
	for _, tt := range same {
		t.Run("same/"+tt.name, func(t *testing.T) {
			t.Parallel()
			m, r, p, q, b := base()
			tt.edit(&m, &r, &p, &q, &b)
			require.Equal(t, ref, fp(t, m, r, p, q, b))
		})
	}

	different := []struct {
		name string
		edit func(m, r, p *string, q *url.Values, b *string)
	}{
		{"method", func(m, _, _ *string, _ *url.Values, _ *string) { *m = "PUT" }},
		{"method case (methods are case-sensitive)", func(m, _, _ *string, _ *url.Values, _ *string) { *m = "post" }},
		{"route", func(_, r, _ *string, _ *url.Values, _ *string) { *r = "/payments" }},
		{"path", func(_, _, p *string, _ *url.Values, _ *string) { *p = "/orders/2" }},
		{"query", func(_, _, _ *string, q *url.Values, _ *string) { *q = url.Values{"dry_run": {"1"}} }},
		{"qty", func(_, _, _ *string, _ *url.Values, b *string) { *b = strings.Replace(*b, `"qty":2`, `"qty":3`, 1) }},
		{"string vs number", func(_, _, _ *string, _ *url.Values, b *string) {
			*b = strings.Replace(*b, `"amount":1200`, `"amount":"1200"`, 1)
		}},
		{"empty body", func(_, _, _ *string, _ *url.Values, b *string) { *b = "" }},
		// Length-prefixing keeps part boundaries: shifting bytes from the
		// route to the path must not collide.
		{"boundary shift", func(_, r, p *string, _ *url.Values, _ *string) { *r = "/order"; *p = "s/orders" }},
	}
	for _, tt := range different {
		t.Run("different/"+tt.name, func(t *testing.T) {
			t.Parallel()
			m, r, p, q, b := base()
			tt.edit(&m, &r, &p, &q, &b)
			require.NotEqual(t, ref, fp(t, m, r, p, q, b))
		})
	}

	t.Run("query order does not matter", func(t *testing.T) {
		t.Parallel()
		a, err := idempotency.Request{Method: "POST", Route: "/x", Path: "/x", Query: url.Values{"a": {"1"}, "b": {"2"}}.Encode(), Body: nil}.Fingerprint()
		require.NoError(t, err)
		q, err := url.ParseQuery("b=2&a=1")
		require.NoError(t, err)
		b, err := idempotency.Request{Method: "POST", Route: "/x", Path: "/x", Query: q.Encode(), Body: nil}.Fingerprint()
		require.NoError(t, err)
		require.Equal(t, a, b)
	})

	t.Run("ambiguous body is rejected", func(t *testing.T) {
		t.Parallel()
		_, err := idempotency.Request{Method: "POST", Route: "/orders", Path: "/orders", Body: []byte(`{"amount":1,"amount":2}`)}.Fingerprint()
		require.ErrorIs(t, err, idempotency.ErrMalformedBody)
	})
}

// middlewareBundle is an operation on the memory store in front of a
// handler the test controls.
type middlewareBundle struct {
	handler  http.Handler
	runs     *atomic.Int64
	outcomes *outcomes
}

// outcomes records what the engine reports, for metrics.
type outcomes struct {
	mu   sync.Mutex
	seen []idempotency.Outcome
}

func (o *outcomes) Outcome(_ string, out idempotency.Outcome) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seen = append(o.seen, out)
}

func (o *outcomes) DuplicateWait(string, idempotency.Outcome, time.Duration) {}
func (o *outcomes) SettleFailed(string)                                      {}
func (o *outcomes) SettlesPending(int)                                       {}
func (o *outcomes) SettleDropped(string, string)                             {}
func (o *outcomes) Repeated(string, bool)                                    {}

func (o *outcomes) last() idempotency.Outcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.seen[len(o.seen)-1]
}

func setupMiddleware(t *testing.T, next http.HandlerFunc) *middlewareBundle {
	t.Helper()
	runs, seen := &atomic.Int64{}, &outcomes{}
	engine := idempotency.New(idempotency.Config{
		Scope:    func(*http.Request) (string, error) { return "tenant", nil },
		Observer: seen,
	})
	op := idempotency.NewOperation(engine, memstore.New(), idempotency.OperationConfig{})
	return &middlewareBundle{
		handler: op.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			next(w, r)
		})),
		runs:     runs,
		outcomes: seen,
	}
}

func (b *middlewareBundle) do(t *testing.T, method, key, body string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, "/things", strings.NewReader(body))
	if key != "" {
		req.Header.Set(idempotency.HeaderKey, key)
	}
	rec := httptest.NewRecorder()
	b.handler.ServeHTTP(rec, req)
	return rec
}

func TestReplayCarriesOnlyAllowListedHeaders(t *testing.T) {
	t.Parallel()
	b := setupMiddleware(t, func(w http.ResponseWriter, _ *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Location", "/things/1")
		h.Set("Set-Cookie", "session=secret")
		h.Set("Authorization", "Bearer leaked")
		h.Set("X-Request-Id", "req-1")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"1"}`))
	})
	first := b.do(t, http.MethodPost, "k1", `{"a":1}`)
	require.Equal(t, http.StatusCreated, first.Code)
	require.Equal(t, "session=secret", first.Header().Get("Set-Cookie"), "the live response is the handler's own")

	replay := b.do(t, http.MethodPost, "k1", `{"a":1}`)
	require.Equal(t, http.StatusCreated, replay.Code)
	require.Equal(t, `{"id":"1"}`, replay.Body.String())
	require.Equal(t, "true", replay.Header().Get(idempotency.HeaderReplayed))
	require.Equal(t, "k1", replay.Header().Get(idempotency.HeaderKey))
	require.Equal(t, "application/json", replay.Header().Get("Content-Type"))
	require.Equal(t, "/things/1", replay.Header().Get("Location"))
	for _, h := range []string{"Set-Cookie", "Authorization", "X-Request-Id"} {
		require.Empty(t, replay.Header().Get(h), "a replay must not carry %s", h)
	}
	require.EqualValues(t, 1, b.runs.Load())
}

// A Scope that returns "" without an error, or a front door that prepares a
// request without one, is refused with ErrNoScope (401): an empty scope
// would be one namespace shared by every such caller, in which each could
// replay the others' responses.
func TestEmptyScopeIsNoScope(t *testing.T) {
	t.Parallel()
	runs := atomic.Int64{}
	engine := idempotency.New(idempotency.Config{Scope: func(*http.Request) (string, error) { return "", nil }})
	op := idempotency.NewOperation(engine, memstore.New(), idempotency.OperationConfig{})
	next := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	})
	send := func(h http.Handler) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/things", strings.NewReader(`{}`))
		req.Header.Set(idempotency.HeaderKey, "k")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	require.Equal(t, http.StatusUnauthorized, send(op.Handler(next)).Code, "Handler with an empty scope")
	require.Equal(t, http.StatusUnauthorized, send(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		op.Serve(w, r, idempotency.Request{Key: "k", Body: []byte(`{}`)}, next)
	})).Code, "Serve of a request prepared without a scope")
	require.Zero(t, runs.Load(), "nothing ran")
}

// TestScopeIsBoundedInEveryStore: a scope longer than MaxScopeLength is
// refused with ErrNoScope (401) before any store sees it, so that
// PostgreSQL's column never fails the claim with a 500 that says retrying
// is safe; one of MaxScopeLength bytes runs.
func TestScopeIsBoundedInEveryStore(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		scope  string
		status int
		runs   int64
	}{
		{"at the limit", strings.Repeat("s", idempotency.MaxScopeLength), http.StatusCreated, 1},
		{"one byte over", strings.Repeat("s", idempotency.MaxScopeLength+1), http.StatusUnauthorized, 0},
		{"300 bytes", strings.Repeat("s", 300), http.StatusUnauthorized, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var runs atomic.Int64
			op := idempotency.NewOperation(idempotency.New(idempotency.Config{ProblemTypeBase: "https://example.com/problems/"}), memstore.New(), idempotency.OperationConfig{})
			next := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				runs.Add(1)
				w.WriteHeader(http.StatusCreated)
			})
			for range 2 {
				req := httptest.NewRequest(http.MethodPost, "/things", strings.NewReader(`{}`))
				rec := httptest.NewRecorder()
				op.Serve(rec, req, idempotency.Request{Scope: tc.scope, Key: "k", Body: []byte(`{}`)}, next)
				require.Equal(t, tc.status, rec.Code, rec.Body.String())
				if tc.status == http.StatusUnauthorized {
					require.Contains(t, rec.Body.String(), idempotency.ProblemOf(idempotency.ErrNoScope).Slug)
					require.Contains(t, rec.Body.String(), "over the 255", "the detail says why")
					require.NotContains(t, rec.Body.String(), "retrying", "no answer says a retry is safe")
				}
			}
			require.Equal(t, tc.runs, runs.Load(), "the operation ran once at most, and never for a scope over the limit")
		})
	}
}

// TestBodiesAreReadWithinBounds: a body over the limit is 413 whether its
// size is announced or not, a body that breaks off is 400, and neither runs
// the operation nor consumes its key.
func TestBodiesAreReadWithinBounds(t *testing.T) {
	t.Parallel()
	const limit = 64
	for _, tc := range []struct {
		name   string
		body   io.Reader
		length int64
		status int
	}{
		{"announced too large", strings.NewReader(`{"a":"` + strings.Repeat("x", limit) + `"}`), limit + 10, http.StatusRequestEntityTooLarge},
		{"chunked too large", strings.NewReader(`{"a":"` + strings.Repeat("x", limit) + `"}`), -1, http.StatusRequestEntityTooLarge},
		{"broken off", io.MultiReader(strings.NewReader(`{"a":`), iotest.ErrReader(io.ErrUnexpectedEOF)), -1, http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			runs := atomic.Int64{}
			engine := idempotency.New(idempotency.Config{MaxBodyBytes: limit, Scope: func(*http.Request) (string, error) { return "s", nil }})
			h := idempotency.NewOperation(engine, memstore.New(), idempotency.OperationConfig{}).Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				runs.Add(1)
				w.WriteHeader(http.StatusCreated)
			}))
			send := func(body io.Reader, length int64) *httptest.ResponseRecorder {
				req := httptest.NewRequest(http.MethodPost, "/things", body)
				req.ContentLength = length
				req.Header.Set(idempotency.HeaderKey, "k")
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				return rec
			}
			refused := send(tc.body, tc.length)
			require.Equal(t, tc.status, refused.Code, "%s", refused.Body)
			require.Equal(t, "application/problem+json", refused.Header().Get("Content-Type"))
			require.Zero(t, runs.Load(), "nothing ran")
			require.Equal(t, http.StatusCreated, send(strings.NewReader(`{}`), 2).Code, "the key was not consumed")
		})
	}
}

// TestHandlerAndHandlerFuncAlike: Handler and HandlerFunc run every
// request, whatever its method, through the protocol: a GET without a key
// is refused and runs nothing, and one with a key runs once and is
// replayed, from either.
func TestHandlerAndHandlerFuncAlike(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		handler func(op *idempotency.Operation[*memstore.Tx], runs *atomic.Int64) http.Handler
	}{
		{"Handler", func(op *idempotency.Operation[*memstore.Tx], runs *atomic.Int64) http.Handler {
			return op.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if _, ok := op.Unit(r.Context()); !ok {
					t.Error("Handler's next finds no unit")
				}
				runs.Add(1)
				w.WriteHeader(http.StatusOK)
			}))
		}},
		{"HandlerFunc", func(op *idempotency.Operation[*memstore.Tx], runs *atomic.Int64) http.Handler {
			return op.HandlerFunc(func(w http.ResponseWriter, _ *http.Request, unit *memstore.Tx) {
				if unit == nil {
					t.Error("HandlerFunc's fn is handed no unit")
				}
				runs.Add(1)
				w.WriteHeader(http.StatusOK)
			})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			engine := idempotency.New(idempotency.Config{Scope: func(*http.Request) (string, error) { return "tenant", nil }})
			op := idempotency.NewOperation(engine, memstore.New(), idempotency.OperationConfig{})
			runs := &atomic.Int64{}
			h := tc.handler(op, runs)
			send := func(key string) *httptest.ResponseRecorder {
				req := httptest.NewRequest(http.MethodGet, "/things", nil)
				if key != "" {
					req.Header.Set(idempotency.HeaderKey, key)
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				return rec
			}
			require.Equal(t, http.StatusBadRequest, send("").Code, "a GET without a key is refused")
			require.Zero(t, runs.Load(), "a GET without a key runs nothing")
			require.Equal(t, http.StatusOK, send("k").Code)
			replay := send("k")
			require.Equal(t, http.StatusOK, replay.Code)
			require.Equal(t, "true", replay.Header().Get(idempotency.HeaderReplayed), "a GET with a key is replayed")
			require.EqualValues(t, 1, runs.Load(), "and runs once")
		})
	}
}

func TestNothingIsStoredOnError(t *testing.T) {
	t.Parallel()
	fail := atomic.Bool{}
	fail.Store(true)
	b := setupMiddleware(t, func(w http.ResponseWriter, _ *http.Request) {
		if fail.Swap(false) {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	require.Equal(t, http.StatusInternalServerError, b.do(t, http.MethodPost, "k", `{}`).Code)
	second := b.do(t, http.MethodPost, "k", `{}`)
	require.Equal(t, http.StatusCreated, second.Code)
	require.Empty(t, second.Header().Get(idempotency.HeaderReplayed), "the retry ran the operation")
	require.EqualValues(t, 2, b.runs.Load())
}

func TestPanicRollsBackAndPropagates(t *testing.T) {
	t.Parallel()
	boom := atomic.Bool{}
	boom.Store(true)
	b := setupMiddleware(t, func(w http.ResponseWriter, _ *http.Request) {
		if boom.Swap(false) {
			panic(errors.New("boom"))
		}
		w.WriteHeader(http.StatusCreated)
	})
	require.Panics(t, func() { b.do(t, http.MethodPost, "k", `{}`) }, "the panic reaches the recoverer above")
	require.Equal(t, http.StatusCreated, b.do(t, http.MethodPost, "k", `{}`).Code, "the key was freed")
}

func TestOutcomeIsReported(t *testing.T) {
	t.Parallel()
	b := setupMiddleware(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	outcome := func(key, body string) idempotency.Outcome {
		b.do(t, http.MethodPost, key, body)
		return b.outcomes.last()
	}
	require.Equal(t, idempotency.OutcomeExecuted, outcome("k", `{"a":1}`))
	require.Equal(t, idempotency.OutcomeReplayed, outcome("k", `{"a":1}`))
	require.Equal(t, idempotency.OutcomeConflict, outcome("k", `{"a":2}`))
	require.Equal(t, idempotency.OutcomeRejected, outcome("", `{"a":1}`))
	require.Equal(t, idempotency.OutcomeRejected, outcome("k2", `{"a":`))
}

// countingPurger counts cleanup runs and keeps the last batch size.
type countingPurger struct{ runs, batch atomic.Int64 }

func (p *countingPurger) PurgeExpired(_ context.Context, batch int) (int64, error) {
	p.runs.Add(1)
	p.batch.Store(int64(batch))
	return 0, nil
}

// A zero Cleanup's Batch and Interval take their defaults: a batch of 0
// would delete nothing forever, an interval of 0 would panic the ticker.
func TestCleanupZeroFieldsTakeDefaults(t *testing.T) {
	t.Parallel()
	p := &countingPurger{}
	c := idempotency.Cleanup{Purge: p.PurgeExpired, Logger: slog.New(slog.DiscardHandler)}
	_, err := c.Once(t.Context())
	require.NoError(t, err)
	require.EqualValues(t, 1000, p.batch.Load(), "the batch a zero Batch purges with, as Cleanup.Batch says")

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	require.NotPanics(t, func() { c.Run(ctx) }, "Run with a zero Interval")
}

func TestRunCleanupPurgesPeriodicallyUntilCancelled(t *testing.T) {
	t.Parallel()
	p := &countingPurger{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		idempotency.Cleanup{Purge: p.PurgeExpired, Interval: 5 * time.Millisecond, Batch: 100, Logger: slog.New(slog.DiscardHandler)}.Run(ctx)
		close(done)
	}()
	require.Eventually(t, func() bool { return p.runs.Load() >= 3 }, 5*time.Second, time.Millisecond, "cleanup should run every interval")
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("RunCleanup did not stop when its context ended")
	}
}
