package idempotency_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/internal/testharness"
	"github.com/oncekey/oncekey/idempotency/memstore"
)

// flakySettler is a real memstore whose settles and releases fail while
// down is set, as a database that restarts fails them: every claim and
// read still reaches the store underneath.
type flakySettler struct {
	*memstore.Store
	down     atomic.Bool
	attempts atomic.Int64 // settles and releases tried while down
}

func (f *flakySettler) Settle(ctx context.Context, ref idempotency.Ref, resp idempotency.Response) (bool, error) {
	if f.down.Load() {
		f.attempts.Add(1)
		return false, fmt.Errorf("%w: the database is restarting", idempotency.ErrUnavailable)
	}
	return f.Store.Settle(ctx, ref, resp)
}

func (f *flakySettler) Release(ctx context.Context, ref idempotency.Ref) (bool, error) {
	if f.down.Load() {
		f.attempts.Add(1)
		return false, fmt.Errorf("%w: the database is restarting", idempotency.ErrUnavailable)
	}
	return f.Store.Release(ctx, ref)
}

// settleObserver records what an engine reports of its settles.
type settleObserver struct {
	failed, pending atomic.Int64
	mu              sync.Mutex
	dropped         map[string]int // by reason
}

func (o *settleObserver) Outcome(string, idempotency.Outcome)                      {}
func (o *settleObserver) DuplicateWait(string, idempotency.Outcome, time.Duration) {}
func (o *settleObserver) SettleFailed(string)                                      { o.failed.Add(1) }
func (o *settleObserver) Repeated(string, bool)                                    {}
func (o *settleObserver) SettlesPending(delta int)                                 { o.pending.Add(int64(delta)) }
func (o *settleObserver) SettleDropped(_, reason string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.dropped == nil {
		o.dropped = map[string]int{}
	}
	o.dropped[reason]++
}

func (o *settleObserver) droppedFor(reason string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.dropped[reason]
}

// process is one engine (a gateway's process) serving a held operation on
// a shared store, counting the runs of its handler in runs.
type process struct {
	engine  *idempotency.Engine
	handler http.Handler
	obs     *settleObserver
	logs    *testharness.Logs
}

func newProcess(t *testing.T, store idempotency.Store[*memstore.Tx], held idempotency.HeldConfig, runs *atomic.Int64, status int) process {
	t.Helper()
	p := process{obs: &settleObserver{}, logs: &testharness.Logs{}}
	p.engine = idempotency.New(idempotency.Config{
		Scope:           func(*http.Request) (string, error) { return "ns:api|tenant", nil },
		Wait:            30 * time.Millisecond,
		ProblemTypeBase: "https://example.com/problems/",
		Logger:          slog.New(slog.NewTextHandler(p.logs, nil)),
		Observer:        p.obs,
	})
	t.Cleanup(func() { _ = p.engine.Shutdown(context.Background()) })
	op := idempotency.NewOperation(p.engine, store, idempotency.OperationConfig{Name: "upstream", Held: &held})
	p.handler = op.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		n := runs.Add(1)
		w.WriteHeader(status)
		_, _ = fmt.Fprintf(w, `{"run":%d}`, n)
	}))
	return p
}

func (p process) post(key, body string) *httptest.ResponseRecorder {
	return heldPostBody(p.handler, key, body)
}

// TestHeldSettleRetried: an answer that arrives while the store cannot
// settle its key is given to its client, kept in memory and retried. Its
// own process replays it from memory at once; another process sees the
// key held while its lease runs and unknown after it; once the store
// takes the settle, every process replays it, and nothing ran twice.
func TestHeldSettleRetried(t *testing.T) {
	t.Parallel()
	store := &flakySettler{Store: memstore.New()}
	held := idempotency.HeldConfig{Lease: 300 * time.Millisecond}
	var runs atomic.Int64
	a, b := newProcess(t, store, held, &runs, http.StatusCreated), newProcess(t, store, held, &runs, http.StatusCreated)
	const body = `{"amount":5}`

	store.down.Store(true)
	first := a.post("k1", body)
	require.Equal(t, http.StatusCreated, first.Code, "the client gets its answer: %s", first.Body)

	again := a.post("k1", body)
	require.Equal(t, http.StatusCreated, again.Code, "its own process replays it from memory: %s", again.Body)
	require.Equal(t, "true", again.Header().Get(idempotency.HeaderReplayed))
	require.Equal(t, first.Body.String(), again.Body.String())
	other := a.post("k1", `{"amount":6}`)
	require.Equal(t, http.StatusConflict, other.Code, "another request under the key: %s", other.Body)
	require.Contains(t, other.Body.String(), idempotency.ProblemOf(idempotency.ErrKeyMismatch).Slug)

	held202 := b.post("k1", body)
	require.Equal(t, http.StatusAccepted, held202.Code, "another process, within the lease: %s", held202.Body)
	var unknown *httptest.ResponseRecorder
	require.Eventually(t, func() bool {
		unknown = b.post("k1", body)
		return unknown.Code != http.StatusAccepted
	}, 5*time.Second, 20*time.Millisecond)
	require.Equal(t, http.StatusConflict, unknown.Code, "another process, past the lease: %s", unknown.Body)
	require.Contains(t, unknown.Body.String(), idempotency.ProblemOf(idempotency.ErrOutcomeUnknown).Slug)

	require.Eventually(t, func() bool { return a.obs.failed.Load() >= 3 }, 5*time.Second, 10*time.Millisecond, "the settle is retried")
	require.EqualValues(t, 1, a.obs.pending.Load(), "one outcome waits in memory")
	logged := a.logs.String()
	require.Contains(t, logged, "a held key could not be settled")
	require.Contains(t, logged, "scope=ns:api|tenant")
	require.Contains(t, logged, "record="+idempotency.RecordID("ns:api|tenant", "k1"))
	require.Contains(t, logged, "method=POST path=/transfers")
	require.NotContains(t, logged, "k1", "the key is never logged in clear")

	store.down.Store(false)
	require.Eventually(t, func() bool { return a.obs.pending.Load() == 0 }, 10*time.Second, 10*time.Millisecond, "the settle is stored")
	for name, p := range map[string]process{"its own process": a, "another process": b} {
		replay := p.post("k1", body)
		require.Equal(t, http.StatusCreated, replay.Code, "%s, once stored: %s", name, replay.Body)
		require.Equal(t, "true", replay.Header().Get(idempotency.HeaderReplayed), name)
		require.Equal(t, first.Body.String(), replay.Body.String(), name)
	}
	require.EqualValues(t, 1, runs.Load(), "the operation ran once")
	require.Zero(t, a.obs.droppedFor("bound")+a.obs.droppedFor("shutdown"))
}

// TestHeldReleaseRetried: a 5xx frees its key, and a release that fails
// is retried too: once the store takes it, the key runs again.
func TestHeldReleaseRetried(t *testing.T) {
	t.Parallel()
	store := &flakySettler{Store: memstore.New()}
	var runs atomic.Int64
	a := newProcess(t, store, idempotency.HeldConfig{Lease: time.Minute}, &runs, http.StatusServiceUnavailable)
	store.down.Store(true)
	require.Equal(t, http.StatusServiceUnavailable, a.post("k1", `{}`).Code)
	require.Equal(t, http.StatusAccepted, a.post("k1", `{}`).Code, "not released yet: held")
	require.EqualValues(t, 1, a.obs.pending.Load())
	store.down.Store(false)
	require.Eventually(t, func() bool { return a.post("k1", `{}`).Code == http.StatusServiceUnavailable && runs.Load() == 2 },
		10*time.Second, 20*time.Millisecond, "released: the retry runs")
	require.Zero(t, a.obs.pending.Load())
}

// TestHeldSettleBounds: past either bound on the outcomes kept in memory,
// an outcome is not kept: its own process no longer answers from memory
// (the key is held, as on any other process), and it is counted.
func TestHeldSettleBounds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		held idempotency.HeldConfig
	}{
		{"past the count", idempotency.HeldConfig{Lease: time.Minute, MaxPending: 1}},
		{"past the bytes", idempotency.HeldConfig{Lease: time.Minute, MaxPendingBytes: 50}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			store := &flakySettler{Store: memstore.New()}
			var runs atomic.Int64
			a := newProcess(t, store, tt.held, &runs, http.StatusCreated)
			store.down.Store(true)
			require.Equal(t, http.StatusCreated, a.post("kept", `{}`).Code)
			require.Equal(t, http.StatusCreated, a.post("past", `{}`).Code, "the client gets its answer all the same")
			require.Equal(t, http.StatusCreated, a.post("kept", `{}`).Code, "within the bound: replayed from memory")
			require.Equal(t, http.StatusAccepted, a.post("past", `{}`).Code, "past the bound: held")
			require.EqualValues(t, 1, a.obs.pending.Load())
			require.Equal(t, 1, a.obs.droppedFor("bound"))
			require.Contains(t, a.logs.String(), "its outcome is not kept")
		})
	}
}

// TestEngineShutdownSettles: Shutdown tries each outcome still kept once
// more; one that still fails is logged, counted and reported, and one
// that succeeds is stored.
func TestEngineShutdownSettles(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		upAgain bool
	}{
		{"the store is back: stored", true},
		{"the store is still down: logged and counted", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			store := &flakySettler{Store: memstore.New()}
			var runs atomic.Int64
			held := idempotency.HeldConfig{Lease: time.Minute}
			a, b := newProcess(t, store, held, &runs, http.StatusCreated), newProcess(t, store, held, &runs, http.StatusCreated)
			store.down.Store(true)
			require.Equal(t, http.StatusCreated, a.post("k1", `{}`).Code)
			store.down.Store(!tt.upAgain)
			err := a.engine.Shutdown(context.Background())
			if tt.upAgain {
				require.NoError(t, err)
				require.Equal(t, http.StatusCreated, b.post("k1", `{}`).Code, "stored before the process ended")
				return
			}
			require.ErrorContains(t, err, "1 held keys could not be settled")
			require.Equal(t, 1, a.obs.droppedFor("shutdown"))
			require.Zero(t, a.obs.pending.Load())
			require.Contains(t, a.logs.String(), "could not be settled before shutdown")
			require.Contains(t, a.logs.String(), "record="+idempotency.RecordID("ns:api|tenant", "k1"))
			require.Equal(t, http.StatusAccepted, b.post("k1", `{}`).Code, "left held, as by a process that died")
		})
	}
}
