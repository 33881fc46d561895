package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
)

// heldServer is a held operation on a fresh memstore whose handler is run,
// counting its runs.
func heldServer(t *testing.T, held idempotency.HeldConfig, handler func(w http.ResponseWriter, r *http.Request, run int64)) (http.Handler, *atomic.Int64) {
	t.Helper()
	var runs atomic.Int64
	return heldOn(memstore.New(), held, &runs, handler), &runs
}

// heldOn is a held operation of an engine of its own (a process) on store.
func heldOn(store *memstore.Store, held idempotency.HeldConfig, runs *atomic.Int64, handler func(w http.ResponseWriter, r *http.Request, run int64)) http.Handler {
	e := idempotency.New(idempotency.Config{
		Scope:           func(*http.Request) (string, error) { return "tenant", nil },
		Wait:            200 * time.Millisecond,
		ProblemTypeBase: "https://example.com/problems/",
	})
	op := idempotency.NewOperation(e, store, idempotency.OperationConfig{Name: "upstream", Held: &held})
	return op.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handler(w, r, runs.Add(1))
	}))
}

func heldPost(h http.Handler, key string) *httptest.ResponseRecorder {
	return heldPostBody(h, key, `{"amount":5}`)
}

func heldPostBody(h http.Handler, key, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/transfers", strings.NewReader(body))
	req.Header.Set(idempotency.HeaderKey, key)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// TestHeldOperationOutcomes pins what a held operation's key becomes for
// each way its handler ends, by what a retry with the same key gets and
// how often the handler ran.
func TestHeldOperationOutcomes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		held    idempotency.HeldConfig
		handler func(w http.ResponseWriter, r *http.Request, run int64)
		// first and retry are the statuses of the first request and of
		// its retry; runs is how often the handler ran in all.
		first, retry int
		runs         int64
		// retrySays is in the retry's body.
		retrySays string
	}{
		{
			name: "answered: stored and replayed",
			handler: func(w http.ResponseWriter, _ *http.Request, run int64) {
				w.Header().Set("Set-Cookie", "session=1")
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write([]byte(`{"run":1}`))
			},
			first: http.StatusCreated, retry: http.StatusCreated, runs: 1, retrySays: `{"run":1}`,
		},
		{
			name: "client error: stored and replayed",
			handler: func(w http.ResponseWriter, _ *http.Request, _ int64) {
				w.WriteHeader(http.StatusUnprocessableEntity)
			},
			first: http.StatusUnprocessableEntity, retry: http.StatusUnprocessableEntity, runs: 1,
		},
		{
			name: "server error: key freed, the retry runs",
			handler: func(w http.ResponseWriter, _ *http.Request, run int64) {
				if run == 1 {
					w.WriteHeader(http.StatusInternalServerError)
					return
				}
				w.WriteHeader(http.StatusCreated)
			},
			first: http.StatusInternalServerError, retry: http.StatusCreated, runs: 2,
		},
		{
			name: "unknown: never run again",
			handler: func(w http.ResponseWriter, r *http.Request, _ int64) {
				idempotency.MarkUnknown(r, errors.New("the upstream reset the connection"))
			},
			first: http.StatusConflict, retry: http.StatusConflict, runs: 1, retrySays: idempotency.ProblemOf(idempotency.ErrOutcomeUnknown).Slug,
		},
		{
			name: "unknown, retried where the upstream deduplicates",
			held: idempotency.HeldConfig{RetryUnknown: true},
			handler: func(w http.ResponseWriter, r *http.Request, run int64) {
				if run == 1 {
					idempotency.MarkUnknown(r, errors.New("timeout"))
					return
				}
				w.WriteHeader(http.StatusCreated)
			},
			first: http.StatusConflict, retry: http.StatusCreated, runs: 2,
		},
		{
			name: "too large: passed through once, never run again",
			held: idempotency.HeldConfig{MaxStored: 8},
			handler: func(w http.ResponseWriter, _ *http.Request, _ int64) {
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write([]byte("0123456789abcdef"))
			},
			first: http.StatusCreated, retry: http.StatusConflict, runs: 1, retrySays: idempotency.ProblemOf(idempotency.ErrNotStored).Slug,
		},
		{
			name: "an operation that stores no responses: passed through once, never run again",
			held: idempotency.HeldConfig{MaxStored: -1},
			handler: func(w http.ResponseWriter, _ *http.Request, _ int64) {
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write([]byte("0"))
			},
			first: http.StatusCreated, retry: http.StatusConflict, runs: 1, retrySays: idempotency.ProblemOf(idempotency.ErrNotStored).Slug,
		},
		{
			name: "a stream: stored as it passes, replayed",
			handler: func(w http.ResponseWriter, _ *http.Request, _ int64) {
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = w.Write([]byte("data: 1\n\n"))
			},
			first: http.StatusOK, retry: http.StatusOK, runs: 1, retrySays: "data: 1\n\n",
		},
		{
			name: "a stream that fails: passed through once, the key freed",
			handler: func(w http.ResponseWriter, _ *http.Request, _ int64) {
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte("data: 1\n\n"))
			},
			first: http.StatusServiceUnavailable, retry: http.StatusServiceUnavailable, runs: 2, retrySays: "data: 1\n\n",
		},
		{
			name: "broken off after its status: never run again",
			handler: func(w http.ResponseWriter, _ *http.Request, _ int64) {
				w.WriteHeader(http.StatusCreated)
				panic(http.ErrAbortHandler)
			},
			first: 0, retry: http.StatusConflict, runs: 1, retrySays: idempotency.ProblemOf(idempotency.ErrNotStored).Slug,
		},
		{
			name: "gave up before an answer: unknown",
			handler: func(http.ResponseWriter, *http.Request, int64) {
				panic(http.ErrAbortHandler)
			},
			first: 0, retry: http.StatusConflict, runs: 1, retrySays: idempotency.ProblemOf(idempotency.ErrOutcomeUnknown).Slug,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h, runs := heldServer(t, tt.held, tt.handler)
			first := func() (status int) {
				defer func() {
					if p := recover(); p != nil {
						require.Equal(t, http.ErrAbortHandler, p, "the handler's panic goes on")
					}
				}()
				return heldPost(h, "k1").Code
			}()
			require.Equal(t, tt.first, first, "first request")
			retry := heldPost(h, "k1")
			require.Equal(t, tt.retry, retry.Code, "retry: %s", retry.Body)
			require.Contains(t, retry.Body.String(), tt.retrySays, "retry's body")
			require.Empty(t, retry.Header().Values("Set-Cookie"), "a replay never carries cookies")
			require.Equal(t, tt.runs, runs.Load(), "runs of the handler")
		})
	}
}

// TestHeldKeyWhileRunning: a duplicate waits for a running held operation
// within its wait and replays its outcome, gets 202 past its wait, and
// finds the outcome unknown on another process once the lease ran out
// with no settle: a holder past its lease is presumed gone, and its key
// never runs again.
func TestHeldKeyWhileRunning(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	store, runs := memstore.New(), &atomic.Int64{}
	handler := func(w http.ResponseWriter, r *http.Request, _ int64) {
		if r.Header.Get("X-Hold") != "" {
			<-release
		} else {
			// pacing: the first request runs a while, so that a duplicate
			// sent meanwhile meets it running; nothing is waited for.
			time.Sleep(50 * time.Millisecond)
		}
		w.WriteHeader(http.StatusCreated)
	}
	held := idempotency.HeldConfig{Lease: 400 * time.Millisecond}
	h, other := heldOn(store, held, runs, handler), heldOn(store, held, runs, handler)
	quick := make(chan int)
	go func() { quick <- heldPost(h, "quick").Code }()
	// Polls until the first request is there, then waits for its outcome.
	require.Eventually(t, func() bool { return runs.Load() == 1 }, 5*time.Second, time.Millisecond)
	dup := heldPost(h, "quick")
	require.Equal(t, http.StatusCreated, <-quick, "first")
	require.Equal(t, http.StatusCreated, dup.Code, "a duplicate within the wait gets the outcome: %s", dup.Body)
	require.Equal(t, "true", dup.Header().Get(idempotency.HeaderReplayed))

	slow := make(chan int)
	go func() {
		req := httptest.NewRequest(http.MethodPost, "/transfers", strings.NewReader(`{"amount":5}`))
		req.Header.Set(idempotency.HeaderKey, "slow")
		req.Header.Set("X-Hold", "1")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		slow <- rec.Code
	}()
	require.Eventually(t, func() bool { return runs.Load() == 2 }, 5*time.Second, time.Millisecond)
	require.Equal(t, http.StatusAccepted, heldPost(other, "slow").Code, "a duplicate past its wait, within the lease")
	var late *httptest.ResponseRecorder
	require.Eventually(t, func() bool {
		late = heldPost(other, "slow")
		return late.Code != http.StatusAccepted
	}, 5*time.Second, 50*time.Millisecond)
	require.Equal(t, http.StatusConflict, late.Code, "past the lease: %s", late.Body)
	require.Contains(t, late.Body.String(), idempotency.ProblemOf(idempotency.ErrOutcomeUnknown).Slug)
	close(release)
	require.Equal(t, http.StatusCreated, <-slow, "the holder answers its own client")
	require.Equal(t, http.StatusCreated, heldPost(other, "slow").Code, "a holder that settles late still settles the key")
	require.EqualValues(t, 2, runs.Load(), "no key ran twice")
}

// TestHeldOperationOutlivesItsClientNotItsLease: a held operation's
// context does not end when its client goes away (its outcome is settled
// all the same), and ends before its lease does, so that no live holder
// outlasts the lease that tells other processes it is gone.
func TestHeldOperationOutlivesItsClientNotItsLease(t *testing.T) {
	t.Parallel()
	held := idempotency.HeldConfig{Lease: 400 * time.Millisecond}
	// The client gives up after 10ms; the operation runs on past that.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	h, runs := heldServer(t, held, func(w http.ResponseWriter, r *http.Request, _ int64) {
		if r.Header.Get("X-Hang") != "" {
			<-r.Context().Done()
			idempotency.MarkUnknown(r, r.Context().Err())
			return
		}
		<-ctx.Done() // the client is gone
		if r.Context().Err() != nil {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})

	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/transfers", strings.NewReader(`{"amount":5}`))
	req.Header.Set(idempotency.HeaderKey, "gone")
	h.ServeHTTP(httptest.NewRecorder(), req)
	replay := heldPost(h, "gone")
	require.Equal(t, http.StatusCreated, replay.Code, "the outcome was settled though its client left: %s", replay.Body)
	require.Equal(t, "true", replay.Header().Get(idempotency.HeaderReplayed))

	// An operation that never ends by itself is ended before its lease.
	began := time.Now()
	req = httptest.NewRequest(http.MethodPost, "/transfers", strings.NewReader(`{"amount":5}`))
	req.Header.Set(idempotency.HeaderKey, "hang")
	req.Header.Set("X-Hang", "1")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Less(t, time.Since(began), held.Lease, "the operation's context ended before its lease")
	require.Equal(t, http.StatusConflict, rec.Code, "%s", rec.Body)
	require.EqualValues(t, 2, runs.Load())
}

// TestHeldKeyLivesAsLongAsItsLease: an operation whose TTL is half its
// lease keeps its key for the lease at least: a duplicate sent past the
// TTL, while the operation still runs within its lease, finds it running
// (a key that expired while its operation ran would be claimed, and run,
// again), and the operation runs once.
func TestHeldKeyLivesAsLongAsItsLease(t *testing.T) {
	t.Parallel()
	const ttl, lease = time.Second, 2 * time.Second
	var runs atomic.Int64
	release := make(chan struct{})
	store := memstore.New()
	// process is an engine of its own on store: the duplicate goes to
	// another, as this one's would queue behind its first request.
	process := func() http.Handler {
		e := idempotency.New(idempotency.Config{
			Scope: func(*http.Request) (string, error) { return "tenant", nil },
			Wait:  10 * time.Millisecond,
		})
		op := idempotency.NewOperation(e, store, idempotency.OperationConfig{TTL: ttl, Held: &idempotency.HeldConfig{Lease: lease}})
		return op.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			if runs.Add(1) == 1 {
				<-release // past the TTL and its own context's end, within the lease
			}
			w.WriteHeader(http.StatusCreated)
		}))
	}
	h, other := process(), process()
	first := make(chan int)
	go func() { first <- heldPost(h, "k").Code }()
	require.Eventually(t, func() bool { return runs.Load() == 1 }, 5*time.Second, time.Millisecond)
	// The key was claimed before the handler ran: from here, past the TTL
	// by a margin, well within the lease.
	running := time.Now()
	require.Eventually(t, func() bool { return time.Since(running) > ttl+100*time.Millisecond }, 5*time.Second, 10*time.Millisecond)
	dup := heldPost(other, "k")
	require.Less(t, time.Since(running), lease-200*time.Millisecond, "the duplicate was sent within the lease")
	require.Equal(t, http.StatusAccepted, dup.Code, "a duplicate past the TTL, within the lease, finds the operation running: %s", dup.Body)
	close(release)
	require.Equal(t, http.StatusCreated, <-first)
	require.Equal(t, http.StatusCreated, heldPost(other, "k").Code, "replayed, not run again")
	require.EqualValues(t, 1, runs.Load(), "the operation ran once")
}
