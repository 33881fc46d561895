package idempotency

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"time"
)

// StatusHeld is the stored status of a held record (see Held): 102
// Processing, which is never a final HTTP status, so that no store, cache
// or replay can take a held record for an operation's outcome.
const StatusHeld = http.StatusProcessing

// ErrOutcomeUnknown answers a request whose key holds an operation that may
// have run and whose outcome nobody will learn: a gateway wrote the request
// upstream and no answer came (a timeout, a reset, a crash). Running it
// again could run it twice, so the key stays so until an operator settles
// or releases it, or it expires: 409.
var ErrOutcomeUnknown = errors.New("the request with this Idempotency-Key may have run, and its outcome is unknown (the upstream took it and never answered): it is not run again under this key; check whether it took effect, then use a new key if it did not")

// ErrNotStored answers a request whose key holds an operation that ran but
// whose response was not stored (larger than the limit, or a stream), so
// it cannot be replayed: 409. It never runs again under this key.
var ErrNotStored = errors.New("the request with this Idempotency-Key ran, but its response was not stored (too large, or a stream), so it cannot be replayed; it is not run again under this key")

// HeldState is what a held record knows of its operation.
type HeldState string

// The held states.
const (
	// HeldRunning: the operation runs now, until Held.Until at the latest.
	HeldRunning HeldState = "running"
	// HeldUnknown: the operation may have run; its outcome is unknown.
	HeldUnknown HeldState = "unknown"
	// HeldNotStored: the operation ran; its response was not kept.
	HeldNotStored HeldState = "not-stored"
)

// Held is what a key holds while an operation that runs outside the
// store's unit of work (a gateway's call to an upstream) is running, or
// once its outcome turned out unknown or unstorable. A held operation
// commits it before it starts, so that no crash can free its key for a
// second run; it is stored as a record of status StatusHeld, and replaced
// (Settler.Settle) or deleted (Settler.Release) once the outcome is known.
type Held struct {
	State HeldState `json:"state"`
	// Until bounds a running operation: past it, its holder is presumed
	// gone, and the outcome is unknown. It is on the store's clock where
	// the store keeps one (see Lease and Record.ReadAt), so that processes
	// whose clocks disagree agree on when a lease ends; else on the
	// holder's.
	Until time.Time `json:"until,omitzero"`
	// Lease is a running operation's lease (HeldConfig.Lease), from when
	// its record is stored. A store that keeps a clock of its own (a
	// database's now()) sets Until to its time plus Lease as it stores the
	// record, and says what time it is when it reads one (Record.ReadAt).
	// Zero in records written before it was kept.
	Lease time.Duration `json:"lease_ns,omitempty"`
	// Reason says, for people, why the outcome is unknown or not stored.
	Reason string `json:"reason,omitempty"`
	// Holder names the process that held the key (HeldConfig.Holder), and
	// Path is the path its request was sent to (as the client spelled it),
	// so that an operator settling a key of unknown outcome knows which
	// gateway's and upstream's logs to read. Empty in records written
	// before they were kept.
	Holder string `json:"holder,omitempty"`
	Path   string `json:"path,omitempty"`
}

// Response is h as stored.
func (h Held) Response() Response {
	body, _ := json.Marshal(h)
	return Response{Status: StatusHeld, Header: http.Header{"Content-Type": {"application/json"}}, Body: body}
}

// ParseHeld reads a stored response as a held record; false when it is an
// operation's outcome.
func ParseHeld(resp Response) (Held, bool) {
	if resp.Status != StatusHeld {
		return Held{}, false
	}
	var h Held
	if err := json.Unmarshal(resp.Body, &h); err != nil || h.State == "" {
		return Held{State: HeldUnknown, Reason: "unreadable held record"}, true
	}
	return h, true
}

// At is h's state at now, a time on the clock of h.Until (the store's,
// Record.ReadAt, where the store keeps one): a running operation past its
// Until is unknown.
func (h Held) At(now time.Time) HeldState {
	if h.State == HeldRunning && !now.Before(h.Until) {
		return HeldUnknown
	}
	return h.State
}

// Settler is a store that changes a record it has committed already: what
// a held operation needs, as its claim is committed before it runs.
type Settler interface {
	// Settle replaces the held record stored under ref's claim with resp,
	// and reports false, changing nothing, when that record is gone (purged,
	// released, or claimed again after it expired) or holds an outcome.
	Settle(ctx context.Context, ref Ref, resp Response) (bool, error)
	// Release deletes the held record stored under ref's claim, freeing the
	// key, and reports false, changing nothing, as Settle does.
	Release(ctx context.Context, ref Ref) (bool, error)
}

// HeldStore is a store that can keep held operations' keys.
type HeldStore[U any] interface {
	Store[U]
	Settler
}

// HeldConfig makes an operation held: it runs outside the store's unit of
// work, as a gateway's call to an upstream does, so its claim is committed
// before it runs and settled after. A held operation's handler never gets a
// unit of work.
type HeldConfig struct {
	// Lease bounds how long the operation may run (a gateway's upstream
	// timeout, and some margin). Past it, a holder that neither settled
	// nor released the key is presumed gone, and the outcome is unknown:
	// never a second run. So that a live holder never outlasts it, the
	// handler's context ends heldSettleMargin before the lease does
	// (unless its response already passes through, which is recorded),
	// and it does not end when the client goes away: the outcome is still
	// settled. A key is kept at least as long as its lease.
	Lease time.Duration
	// MaxStored bounds the response kept for replays (default 1 MiB). A larger response, or a stream (text/event-stream),
	// passes through to the client once, and the key records that it was
	// not stored.
	MaxStored int64
	// RetryUnknown runs an operation whose outcome is unknown again, under
	// the same key, instead of answering ErrOutcomeUnknown: for an upstream
	// that deduplicates the Idempotency-Key it is passed itself.
	RetryUnknown bool
	// Holder names this process in the held records it writes (Held.Holder),
	// for operators: by default the host's name and the process id
	// (host:pid).
	Holder string
	// MaxPending and MaxPendingBytes bound the outcomes the engine keeps
	// in memory because their store did not take them (a database blip):
	// each is retried with backoff until the store takes it (every
	// replica replays it then) or Engine.Shutdown, and the engine answers
	// its key's retries from it meanwhile, as the store would. Other
	// processes find the key held until its lease ends, and of unknown
	// outcome after, until the store takes it. Past either bound (default
	// 10,000 outcomes, 64 MiB of responses) an outcome is not kept: it is
	// logged and counted (Observer.SettleDropped), and its key is of unknown outcome once its lease
	// ends, as if its process had died.
	MaxPending      int
	MaxPendingBytes int64
}

// defaultMaxStored is the largest response a held operation stores unless
// HeldConfig.MaxStored says otherwise.
const defaultMaxStored = 1 << 20

// NewHeldOperation declares a held operation of e (see HeldConfig), whose
// keys store keeps.
func NewHeldOperation[U any](e *Engine, store HeldStore[U], cfg OperationConfig, held HeldConfig) *Operation[U] {
	if held.Lease <= 0 {
		held.Lease = time.Minute
	}
	if held.MaxStored <= 0 {
		held.MaxStored = defaultMaxStored
	}
	if held.Holder == "" {
		held.Holder = defaultHolder()
	}
	if held.MaxPending <= 0 {
		held.MaxPending = defaultMaxPending
	}
	if held.MaxPendingBytes <= 0 {
		held.MaxPendingBytes = defaultMaxPendingBytes
	}
	op := NewOperation[U](e, store, cfg)
	// A key that expired while its operation ran could be claimed again,
	// and run twice: a held key lives at least as long as its lease.
	op.cfg.TTL = max(op.cfg.TTL, held.Lease)
	op.held = &heldOperation{HeldConfig: held, settler: store}
	return op
}

// defaultHolder is HeldConfig.Holder's default: host:pid.
func defaultHolder() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown-host"
	}
	return host + ":" + strconv.Itoa(os.Getpid())
}

type heldOperation struct {
	HeldConfig
	settler Settler
}

// heldKey carries a held operation's verdict slot to its handler.
type heldKey struct{}

// heldVerdict is what the handler of a held operation reports of its
// outcome, besides its response.
type heldVerdict struct {
	unknown error
}

// MarkUnknown reports, from the handler of a held operation, that its
// request may have taken effect and no answer will come (written upstream,
// then a timeout or a reset). The handler writes nothing more: the engine
// records the key as unknown, with cause as the held record's Reason, and
// answers ErrOutcomeUnknown with its fixed detail: cause is for operators
// (the handler logs it), and may name internal addresses that no client
// should see. It reports false outside a held operation.
func MarkUnknown(r *http.Request, cause error) bool {
	v, ok := r.Context().Value(heldKey{}).(*heldVerdict)
	if !ok {
		return false
	}
	v.unknown = cause
	return true
}

// heldSettleMargin is how long before its lease's end a held operation's
// context ends: the time its holder has to record the outcome.
func heldSettleMargin(lease time.Duration) time.Duration {
	return min(lease/4, 5*time.Second)
}

// holdSlack is how long committing a held operation's hold may take beyond
// the operation's wait: on a deferring store that commit is the claim, whose
// statement pgstore bounds by the wait plus 2 s, after waiting for a
// connection of the pool.
const holdSlack = 5 * time.Second

// heldPoll is how often a request polls a key held by a running operation
// elsewhere: a held record is committed, so the store has no lock to wait
// on.
const heldPoll = 20 * time.Millisecond

// meetHeld decides what a request does about a key that holds h: wait for
// it (true), or answer err.
func (o *Operation[U]) meetHeld(ctx context.Context, rec *Record, h Held, ref Ref, budget time.Duration) (again bool, err error) {
	// A store with a clock of its own set h.Until on it, and says what
	// time it is there: the holder's clock and this process's may differ
	// by more than a lease.
	now := rec.ReadAt
	if now.IsZero() {
		now = o.e.now()
	}
	switch h.At(now) {
	case HeldRunning:
		if budget <= 0 {
			return false, ErrInFlight
		}
		t := time.NewTimer(min(heldPoll, budget))
		defer t.Stop()
		select {
		case <-t.C:
			return true, nil
		case <-ctx.Done():
			return false, ctx.Err()
		}
	case HeldNotStored:
		return false, ErrNotStored
	}
	if o.held == nil || !o.held.RetryUnknown {
		return false, ErrOutcomeUnknown
	}
	// The upstream deduplicates the key itself: free it, and claim again.
	// Of several requests that do so at once, one releases the record and
	// the others find the key claimed anew.
	if _, err := o.held.settler.Release(ctx, ref); err != nil {
		return false, fmt.Errorf("release a key whose outcome is unknown: %w", err)
	}
	return true, nil
}

// runHeld runs a held operation under lease: it commits the key as held
// first, so that from then on only Settle or Release frees it, then runs
// next, and settles the key with the response (releases it for a response
// that is not stored, as run rolls back). Unlike run, it answers after the
// settle only where the response is stored: one that passes through is
// answered as it comes, its key recorded first as not stored.
func (s *serving[U]) runHeld(lease Lease[U], next http.Handler) (Outcome, error) {
	e, ctx, held := s.op.e, s.r.Context(), s.op.held
	if err := s.validate(); err != nil {
		s.rollback(lease)
		return s.refuse(err), nil
	}
	// The lease counts from here on this process's monotonic clock; the
	// record's Until is on the store's clock where it keeps one (Held.Lease).
	start := time.Now()
	// mark signs each held record with its holder and the request's path.
	mark := func(h Held) Response {
		h.Holder, h.Path = held.Holder, s.r.URL.EscapedPath()
		return h.Response()
	}
	// The hold is the claim itself on a deferring store: bounded by the
	// wait, and holdSlack for the connection and the statement, so that a
	// key table that does not answer (locked) gets its 503 soon.
	dctx := detachWithin(ctx, s.op.cfg.Wait+holdSlack)
	err := lease.Commit(dctx, mark(Held{State: HeldRunning, Until: e.now().Add(held.Lease), Lease: held.Lease}))
	dctx.cancel()
	ref := lease.Ref()
	if err != nil {
		var taken *TakenError
		if errors.As(err, &taken) || errors.Is(err, ErrInFlight) {
			return "", err // nothing was written
		}
		// The hold may have committed all the same (its answer lost):
		// nothing ran, so free the key if it is held under this claim,
		// retried as any settle is. Not on the client's time: a store that
		// did not answer the hold (a locked key table) may not answer this
		// either, and the 503 must not wait for it (it did, 10 s more).
		rctx := detach(ctx)
		go func() {
			defer rctx.cancel()
			e.settles.settle(rctx, held, pendingSettle{
				ref: ref, fp: s.fp, settler: held.settler, expires: time.Now().Add(s.op.cfg.TTL), unsure: true,
				label: s.label, method: s.r.Method, path: s.r.URL.Path,
			})
		}()
		return s.fail(fmt.Errorf("hold idempotency key: %w", err)), nil
	}
	settle := func(resp *Response) {
		sctx := detach(ctx)
		defer sctx.cancel()
		e.settles.settle(sctx, held, pendingSettle{
			ref: ref, fp: s.fp, resp: resp, settler: held.settler, expires: time.Now().Add(s.op.cfg.TTL),
			label: s.label, method: s.r.Method, path: s.r.URL.Path,
		})
	}
	stored := func(status int, reason string) {
		if !Replayable(status) {
			settle(nil)
			return
		}
		resp := mark(Held{State: HeldNotStored, Reason: reason})
		settle(&resp)
	}
	w := &heldWriter{recorder: recorder{header: http.Header{}, status: http.StatusOK}, client: s.w, limit: held.MaxStored, through: stored}
	verdict := &heldVerdict{}
	// The operation's context outlives the client (its outcome is settled
	// all the same) and ends before the lease does, unless the response
	// passes through by then.
	hctx, stop := context.WithCancel(context.WithValue(context.WithoutCancel(ctx), heldKey{}, verdict))
	defer stop()
	deadline := time.AfterFunc(held.Lease-heldSettleMargin(held.Lease)-time.Since(start), func() {
		if !w.passing.Load() {
			stop()
		}
	})
	defer deadline.Stop()
	inner := s.r.WithContext(hctx)
	inner.Body = io.NopCloser(bytes.NewReader(s.in.Body))
	inner.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(s.in.Body)), nil }
	inner.ContentLength = int64(len(s.in.Body))
	defer func() {
		p := recover()
		if p == nil {
			return
		}
		// A handler that gives up midway (httputil.ReverseProxy, when the
		// upstream's body breaks off) has taken the request upstream.
		switch {
		case w.passing.Load():
		case w.wroteHeader:
			stored(w.status, "the response broke off")
		default:
			resp := mark(Held{State: HeldUnknown, Reason: fmt.Sprint("the operation failed: ", p)})
			settle(&resp)
		}
		panic(p)
	}()
	next.ServeHTTP(w, inner)

	switch {
	case w.passing.Load():
		if w.status >= 500 {
			return s.report(OutcomeError), nil
		}
		return s.report(OutcomeExecuted), nil
	case verdict.unknown != nil:
		// The cause is the operator's (the held record's Reason, and the
		// handler's log), never the client's: it may name the upstream's
		// internal address.
		resp := mark(Held{State: HeldUnknown, Reason: verdict.unknown.Error()})
		settle(&resp)
		e.writeError(s.w, s.r, ErrOutcomeUnknown)
		return s.report(OutcomeUnknown), nil
	case !Replayable(w.status):
		settle(nil)
		w.copyTo(s.w)
		if w.status >= 500 {
			return s.report(OutcomeError), nil
		}
		return s.report(OutcomeRejected), nil
	}
	settle(&Response{Status: w.status, Header: w.allowed(e.stored), Body: w.body.Bytes()})
	w.copyTo(s.w)
	return s.report(OutcomeExecuted), nil
}

// heldWriter buffers a held operation's response as the recorder does, up
// to its limit, and passes it through to the client from the moment it
// cannot be stored: once it outgrows the limit, or at once for a stream.
// Before the first byte passes, through records the key's fate.
type heldWriter struct {
	recorder
	client  http.ResponseWriter
	limit   int64
	through func(status int, reason string)
	// passing is set once the response passes through; atomic, as the
	// lease's timer reads it on a goroutine of its own.
	passing atomic.Bool
}

// Header is the buffered response's header, and the client's once the
// response passes through (trailers set after the body go there).
func (w *heldWriter) Header() http.Header {
	if w.passing.Load() {
		return w.client.Header()
	}
	return w.recorder.Header()
}

func (w *heldWriter) WriteHeader(status int) {
	if w.wroteHeader || status < 200 {
		// Interim responses (103 Early Hints) are not the outcome.
		return
	}
	w.recorder.WriteHeader(status)
	if mt, _, _ := mime.ParseMediaType(w.header.Get("Content-Type")); mt == "text/event-stream" {
		w.pass("the response is a stream (text/event-stream)")
	}
}

func (w *heldWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	if !w.passing.Load() && int64(w.body.Len()+len(p)) > w.limit {
		w.pass(fmt.Sprintf("the response is larger than the %d bytes a response is stored up to", w.limit))
	}
	if w.passing.Load() {
		return w.client.Write(p)
	}
	return w.body.Write(p)
}

// Flush passes a stream's data on as it comes; a response that may yet be
// stored is held back.
func (w *heldWriter) Flush() {
	if w.passing.Load() {
		_ = http.NewResponseController(w.client).Flush()
	}
}

// pass records why the response is not stored, then sends what is
// buffered and lets the rest through.
func (w *heldWriter) pass(reason string) {
	w.passing.Store(true)
	w.through(w.status, reason)
	h := w.client.Header()
	for name, values := range w.header {
		h[name] = values
	}
	w.client.WriteHeader(w.status)
	_, _ = w.client.Write(w.body.Bytes())
	w.body = bytes.Buffer{}
}
