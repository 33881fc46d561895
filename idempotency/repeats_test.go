package idempotency_test

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/internal/clock"
	"github.com/oncekey/oncekey/idempotency/memstore"
)

// repeatCounter is an Observer that counts Repeated by refused.
type repeatCounter struct {
	outcomes
	seen, refused atomic.Int64
}

func (c *repeatCounter) Repeated(_ string, refused bool) {
	if refused {
		c.refused.Add(1)
		return
	}
	c.seen.Add(1)
}

// repeatFixture is an operation that creates widgets (201 with a
// Location), counting its runs, whose handler can be held running.
type repeatFixture struct {
	handler http.Handler
	runs    atomic.Int64
	obs     *repeatCounter
	now     atomic.Pointer[time.Time]
	status  atomic.Int64 // the handler's status (201 unless set)
	hold    chan struct{}
	started chan struct{}
}

func newRepeatFixture(t *testing.T, cfg idempotency.OperationConfig, held bool) *repeatFixture {
	t.Helper()
	f := &repeatFixture{obs: &repeatCounter{}, started: make(chan struct{}, 8)}
	f.status.Store(http.StatusCreated)
	start := time.Now()
	f.now.Store(&start)
	e := idempotency.New(idempotency.Config{
		Scope:    func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil },
		Observer: f.obs,
		Wait:     50 * time.Millisecond,
	})
	clock.Set(e, func() time.Time { return *f.now.Load() })
	if held {
		f.hold = make(chan struct{})
	}
	op := idempotency.NewOperation(e, memstore.New(), cfg)
	f.handler = op.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := f.runs.Add(1)
		f.started <- struct{}{}
		if f.hold != nil {
			<-f.hold
		}
		w.Header().Set("Location", "/widgets/"+string(rune('0'+n)))
		w.WriteHeader(int(f.status.Load()))
	}))
	return f
}

// later moves the engine's clock on by d.
func (f *repeatFixture) later(d time.Duration) {
	next := f.now.Load().Add(d)
	f.now.Store(&next)
}

func (f *repeatFixture) post(account, body string, header ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/widgets", strings.NewReader(body))
	r.Header.Set(idempotency.HeaderKey, rand.Text()) // a new key per attempt
	r.Header.Set("X-Account", account)
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	f.handler.ServeHTTP(w, r)
	return w
}

// problemOf reads a problem document's type slug and detail.
func problemOf(t *testing.T, w *httptest.ResponseRecorder) (slug, detail string) {
	t.Helper()
	var p struct{ Type, Detail string }
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p), "%s", w.Body)
	return p.Type, p.Detail
}

// TestRepeatsUnderNewKeysAreSeen: the same request (scope, operation,
// fingerprint) under a new key within the window is reported once per
// repeat and runs; with RefuseRepeats it is refused with 409
// repeated-request, which names the earlier answer's Location, and runs
// nothing, unless the client says Idempotency-Repeat: ?1. Another scope,
// another body, a window gone by, an earlier run that stored nothing, and
// an operation with the window off are not repeats.
func TestRepeatsUnderNewKeysAreSeen(t *testing.T) {
	t.Parallel()
	const body = `{"name":"gear"}`

	t.Run("reported, and run", func(t *testing.T) {
		t.Parallel()
		f := newRepeatFixture(t, idempotency.OperationConfig{}, false)
		for range 3 {
			require.Equal(t, http.StatusCreated, f.post("a", body).Code)
		}
		require.EqualValues(t, 3, f.runs.Load(), "observing refuses nothing")
		require.EqualValues(t, 2, f.obs.seen.Load(), "the second and third attempts repeat the first")
		require.Zero(t, f.obs.refused.Load())
	})

	t.Run("refused", func(t *testing.T) {
		t.Parallel()
		f := newRepeatFixture(t, idempotency.OperationConfig{RefuseRepeats: true}, false)
		require.Equal(t, http.StatusCreated, f.post("a", body).Code)
		f.later(time.Minute)
		for range 3 {
			w := f.post("a", `{ "name" : "gear" }`) // spelled otherwise: the same request
			require.Equal(t, http.StatusConflict, w.Code, "%s", w.Body)
			slug, detail := problemOf(t, w)
			require.Equal(t, "about:blank", slug)
			require.Contains(t, w.Body.String(), "An identical request was made under another Idempotency-Key")
			require.Contains(t, detail, "1m0s ago and was answered 201 with Location /widgets/1")
			require.Contains(t, detail, "Idempotency-Repeat: ?1")
		}
		require.EqualValues(t, 1, f.runs.Load(), "a refused repeat runs nothing")
		require.EqualValues(t, 3, f.obs.refused.Load())

		w := f.post("a", body, "Idempotency-Repeat", "?1")
		require.Equal(t, http.StatusCreated, w.Code, "a repeat the client means runs")
		require.EqualValues(t, 2, f.runs.Load())
		require.EqualValues(t, 3, f.obs.refused.Load(), "and is not counted")

		w = f.post("a", body, "Idempotency-Repeat", "yes")
		require.Equal(t, http.StatusBadRequest, w.Code, "%s", w.Body)
		require.Contains(t, w.Body.String(), "Idempotency-Repeat header is invalid")

		for name, w := range map[string]*httptest.ResponseRecorder{
			"another scope": f.post("b", body),
			"another body":  f.post("a", `{"name":"cog"}`),
		} {
			require.Equal(t, http.StatusCreated, w.Code, "%s: %s", name, w.Body)
		}
		f.later(5*time.Minute + time.Second)
		require.Equal(t, http.StatusCreated, f.post("a", body).Code, "the window (5m by default) has gone by")
		require.EqualValues(t, 3, f.obs.refused.Load())
	})

	t.Run("refused while the earlier one runs", func(t *testing.T) {
		t.Parallel()
		f := newRepeatFixture(t, idempotency.OperationConfig{RefuseRepeats: true}, true)
		var wg sync.WaitGroup
		var first *httptest.ResponseRecorder
		wg.Add(1)
		go func() {
			defer wg.Done()
			first = f.post("a", body)
		}()
		<-f.started
		w := f.post("a", body)
		require.Equal(t, http.StatusConflict, w.Code, "%s", w.Body)
		_, detail := problemOf(t, w)
		require.Contains(t, detail, "is still running")
		close(f.hold)
		wg.Wait()
		require.Equal(t, http.StatusCreated, first.Code)
		require.EqualValues(t, 1, f.runs.Load())
	})

	t.Run("an earlier run that stored nothing", func(t *testing.T) {
		t.Parallel()
		f := newRepeatFixture(t, idempotency.OperationConfig{RefuseRepeats: true}, false)
		f.status.Store(http.StatusServiceUnavailable)
		require.Equal(t, http.StatusServiceUnavailable, f.post("a", body).Code)
		f.status.Store(http.StatusCreated)
		require.Equal(t, http.StatusCreated, f.post("a", body).Code, "a retry of a failure under a new key repeats nothing")
		require.Zero(t, f.obs.refused.Load())
	})

	t.Run("the window off", func(t *testing.T) {
		t.Parallel()
		f := newRepeatFixture(t, idempotency.OperationConfig{RefuseRepeats: true, RepeatWindow: -1}, false)
		for range 2 {
			require.Equal(t, http.StatusCreated, f.post("a", body).Code)
		}
		require.Zero(t, f.obs.seen.Load()+f.obs.refused.Load())
	})
}

// TestRepeatsLogNoKeys: the line that reports a repeat names the
// operation and the scope, and the keys only by a hash.
func TestRepeatsLogNoKeys(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer // requests one after another: one writer at a time
	e := idempotency.New(idempotency.Config{
		Scope:  func(*http.Request) (string, error) { return "acct-1", nil },
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	op := idempotency.NewOperation(e, memstore.New(), idempotency.OperationConfig{})
	h := op.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) }))
	var keys []string
	for range 2 {
		key := rand.Text()
		keys = append(keys, key)
		r := httptest.NewRequest(http.MethodPost, "/widgets", strings.NewReader(`{}`))
		r.Header.Set(idempotency.HeaderKey, key)
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	out := logs.String()
	require.Contains(t, out, "a request repeats one made under another key")
	require.Contains(t, out, "acct-1")
	for _, key := range keys {
		require.NotContains(t, out, key, "no key in clear")
	}
}
