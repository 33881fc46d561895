package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/internal/canonjson"
	"github.com/oncekey/oncekey/internal/problem"
)

// Header names of the protocol.
const (
	HeaderKey      = "Idempotency-Key"
	HeaderReplayed = "Idempotent-Replayed"
)

// MaxKeyLength is the longest Idempotency-Key accepted, in bytes.
const MaxKeyLength = 255

// Defaults for Config fields left zero.
const (
	DefaultTTL        = 48 * time.Hour
	DefaultWait       = time.Second
	DefaultRetryAfter = time.Second
)

// minStoreWait is the least wait a claim is given after queueing behind
// duplicates on this instance: enough for a claim statement that blocks on
// nothing, so a key whose holder just finished is answered from the store.
const minStoreWait = 100 * time.Millisecond

// DefaultReplayHeaders are the response headers stored with a record and
// replayed. Anything else (Set-Cookie, Date, request ids, tracing headers) is
// specific to one response and must not be handed to a different request.
var DefaultReplayHeaders = []string{"Content-Type", "Location", "Retry-After"}

// Config configures the middleware. Store, Account and Route are required.
type Config struct {
	Store Store
	// Account returns the authenticated caller; keys are scoped to it. The
	// authentication layer runs first, so a request without one is a wiring
	// bug and gets a 500.
	Account func(ctx context.Context) (uuid.UUID, bool)
	// Route returns the matched route pattern, e.g. "/orders/{id}".
	Route func(r *http.Request) string
	// TTL is how long a completed record is replayed (default 48h).
	TTL time.Duration
	// Wait is how long a duplicate waits for an in-flight first request
	// before it gets 202 (default 1s).
	Wait time.Duration
	// RetryAfter is advertised on 202 and 503 responses (default 1s).
	RetryAfter time.Duration
	// ReplayHeaders is the allow-list of stored response headers
	// (default DefaultReplayHeaders).
	ReplayHeaders []string
	// Logger receives store failures (default slog.Default()).
	Logger *slog.Logger
	// Observer is told every request's outcome (default: nobody).
	Observer Observer
	// Deferrable reports whether an operation ("POST /orders") only writes
	// through its unit of work, so its claim may be deferred to its commit
	// (see ClaimRequest.Deferred): one round trip for a first request. Such
	// an operation may run and then be discarded, when its commit finds the
	// key taken, so it must have no effect outside the unit of work.
	// Default: none.
	Deferrable func(operation string) bool
	// Refuse, if set, is asked about a request whose key holds the outcome
	// of a different request, before that request is answered 409: it may
	// refuse it with an answer of its own (writing it and returning true).
	// The contract gate checks a body's schema only when the operation is
	// about to run, since a replay's body passed that check when it ran;
	// asked here as well, it gives a body against the schema the same 400
	// whether or not its key was used before.
	Refuse func(w http.ResponseWriter, r *http.Request) bool
}

// Observer receives what the protocol did, for metrics. operation is the
// method and route pattern ("POST /orders"): a bounded set of values.
type Observer interface {
	Outcome(operation string, o Outcome)
	// DuplicateWait reports how long a request that did not run the
	// operation (replayed, in_flight, conflict) spent claiming its key,
	// which includes any wait for an in-flight first request.
	DuplicateWait(operation string, o Outcome, d time.Duration)
}

type noObserver struct{}

func (noObserver) Outcome(string, Outcome)                      {}
func (noObserver) DuplicateWait(string, Outcome, time.Duration) {}

// Middleware enforces the Idempotency-Key protocol on unsafe methods.
type Middleware struct {
	cfg      Config
	inFlight *collapser
}

// New returns the middleware for cfg, filling in defaults.
func New(cfg Config) *Middleware {
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.Wait <= 0 {
		cfg.Wait = DefaultWait
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = DefaultRetryAfter
	}
	if cfg.ReplayHeaders == nil {
		cfg.ReplayHeaders = DefaultReplayHeaders
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Observer == nil {
		cfg.Observer = noObserver{}
	}
	return &Middleware{cfg: cfg, inFlight: newCollapser()}
}

// Handler wraps next. Safe methods (GET, HEAD, OPTIONS, TRACE) pass through
// untouched; every other request needs a valid Idempotency-Key.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !Unsafe(r.Method) {
			next.ServeHTTP(w, r)
			return
		}
		m.serve(w, r, next)
	})
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	ctx := r.Context()
	route := m.cfg.Route(r)
	op := Operation(r.Method, route)
	// Everything that can reject the request happens before the claim, so a
	// rejected request consumes no key: fixing it and retrying with the same
	// key works.
	key, err := ParseKey(r.Header)
	if err != nil {
		m.reject(ctx, w, op, err)
		return
	}
	w.Header().Set(HeaderKey, key)

	account, ok := m.cfg.Account(ctx)
	if !ok {
		m.fail(ctx, w, op, errors.New("idempotency middleware reached without an authenticated account"))
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			m.outcome(ctx, op, OutcomeRejected)
			problem.Write(w, problem.PayloadTooLarge, fmt.Sprintf("the body exceeds %d bytes", tooLarge.Limit))
			return
		}
		m.outcome(ctx, op, OutcomeRejected)
		problem.Write(w, problem.Validation, "the request body could not be read")
		return
	}
	canonical, err := canonjson.Canonicalize(body)
	if err != nil {
		m.outcome(ctx, op, OutcomeRejected)
		problem.Write(w, problem.MalformedJSON, err.Error())
		return
	}
	fp := fingerprintCanonical(r.Method, route, r.URL.EscapedPath(), r.URL.Query(), canonical)
	if len(canonical) > 0 {
		// The operation decodes exactly the form that was fingerprinted, so
		// two requests with one fingerprint can never be read differently
		// ("amount":1200.0 and "amount":1200 are one request, and both run).
		body = canonical
	}

	claimStart := time.Now()
	// Concurrent duplicates on this instance queue here, one at a time to
	// the store, within the same wait budget.
	leave, queued, ok := m.inFlight.enter(ctx, account, key, m.cfg.Wait)
	if !ok && ctx.Err() != nil {
		m.fail(ctx, w, op, ctx.Err())
		return
	}
	if !ok {
		m.answer(w, r, op, fp, nil, ErrInFlight, time.Since(claimStart), body)
		return
	}
	defer leave()
	// A request that queued behind a duplicate almost surely finds the key
	// taken: it claims in the store's usual way, which answers from the
	// record without running the operation at all.
	deferred := !queued && m.cfg.Deferrable != nil && m.cfg.Deferrable(op)
	for {
		lease, rec, err := m.cfg.Store.Claim(ctx, ClaimRequest{
			Account: account, Key: key, Fingerprint: fp,
			Method: r.Method, Route: route, TTL: m.cfg.TTL,
			Wait:     max(m.cfg.Wait-time.Since(claimStart), minStoreWait),
			Deferred: deferred,
		})
		if lease != nil {
			err = m.run(w, r, op, lease, Claim{Account: account, Key: key, ClaimedAt: lease.ClaimedAt()}, body, next, deferred)
			var taken *TakenError
			switch {
			case err == nil:
				return // answered
			case errors.As(err, &taken) && taken.Record == nil && deferred:
				// A concurrent first request got the key between our look
				// and our insert: claim again, this time in the store's
				// usual way, which waits for its outcome.
				deferred = false
				continue
			case errors.As(err, &taken):
				rec, err = taken.Record, nil
			}
		}
		m.answer(w, r, op, fp, rec, err, time.Since(claimStart), body)
		return
	}
}

// answer responds to a request that did not run the operation: its key holds
// rec, or the claim failed with err. body is the request's (canonical) body.
func (m *Middleware) answer(w http.ResponseWriter, r *http.Request, op string, fp Fingerprint, rec *Record, err error, waited time.Duration, body []byte) {
	ctx := r.Context()
	switch {
	case errors.Is(err, ErrInFlight):
		m.duplicate(ctx, op, OutcomeInFlight, waited)
		w.Header().Set("Retry-After", m.retryAfter())
		problem.Write(w, problem.InProgress, "the first request with this Idempotency-Key has not finished; retry with the same key after Retry-After seconds")
	case err != nil:
		m.fail(ctx, w, op, fmt.Errorf("claim idempotency key: %w", err))
	case rec == nil:
		m.fail(ctx, w, op, errors.New("claim returned neither a lease, a record nor an error"))
	case rec.Fingerprint != fp && m.refused(w, r, op, body):
	case rec.Fingerprint != fp:
		m.duplicate(ctx, op, OutcomeConflict, waited)
		problem.Write(w, problem.KeyMismatch, "this Idempotency-Key was already used with a different request (method, path, query or body); use a new key for a new operation")
	default:
		m.duplicate(ctx, op, OutcomeReplayed, waited)
		m.replay(w, rec.Response)
	}
}

// refused asks Config.Refuse about a request about to be answered 409.
func (m *Middleware) refused(w http.ResponseWriter, r *http.Request, op string, body []byte) bool {
	if m.cfg.Refuse == nil {
		return false
	}
	asked := r.WithContext(r.Context())
	asked.Body = io.NopCloser(bytes.NewReader(body))
	if !m.cfg.Refuse(w, asked) {
		return false
	}
	m.outcome(r.Context(), op, OutcomeRejected)
	return true
}

// run executes the operation inside lease and answers only after the outcome
// is durable: a client never sees a success that a crash could still undo.
// It returns nil once it has answered, or, without answering, the error of a
// deferred lease's Commit that found the key taken (*TakenError or
// ErrInFlight): the operation's writes and response were discarded, and the
// caller answers from what holds the key.
func (m *Middleware) run(w http.ResponseWriter, r *http.Request, op string, lease Lease, claim Claim, body []byte, next http.Handler, deferred bool) error {
	ctx := r.Context()
	settled := false
	defer func() {
		// Rolls back on every path that did not commit, panics included (the
		// panic continues to the recoverer above).
		if !settled {
			dctx, cancel := detach(ctx)
			defer cancel()
			if err := lease.Rollback(dctx); err != nil {
				m.cfg.Logger.ErrorContext(ctx, "idempotency: rollback failed", "err", err)
			}
		}
	}()

	rec := newRecorder()
	inner := r.WithContext(withClaim(lease.Context(ctx), claim))
	inner.Body = io.NopCloser(bytes.NewReader(body))
	next.ServeHTTP(rec, inner)

	if !Stored(rec.status) {
		// A server error or a rejection inside the operation: nothing is
		// stored, so a retry with the same key runs the operation again.
		dctx, cancel := detach(ctx)
		defer cancel()
		if err := lease.Rollback(dctx); err != nil {
			m.cfg.Logger.ErrorContext(ctx, "idempotency: rollback failed", "err", err)
		}
		settled = true
		if rec.status >= 500 {
			m.outcome(ctx, op, OutcomeError)
		} else {
			m.outcome(ctx, op, OutcomeRejected)
		}
		rec.copyTo(w)
		return nil
	}
	stored := Response{Status: rec.status, Header: rec.allowed(m.cfg.ReplayHeaders), Body: rec.body.Bytes()}
	// The operation ran; finish storing it even if the client went away, so
	// its retry replays instead of finding nothing. A deferred lease's
	// commit is the operation itself (nothing was written before it), so it
	// runs under the request's deadline like any operation's writes.
	dctx, cancel := detach(ctx)
	defer cancel()
	if deferred {
		dctx = ctx
	}
	if err := lease.Commit(dctx, stored); err != nil {
		var taken *TakenError
		if errors.As(err, &taken) || errors.Is(err, ErrInFlight) {
			settled = true // nothing was written
			return err
		}
		m.fail(ctx, w, op, fmt.Errorf("commit idempotent operation: %w", err))
		return nil
	}
	settled = true
	m.outcome(ctx, op, OutcomeExecuted)
	rec.copyTo(w)
	return nil
}

// replay writes a stored response: the same status and body bytes, the
// allow-listed headers, and Idempotent-Replayed.
func (m *Middleware) replay(w http.ResponseWriter, resp Response) {
	h := w.Header()
	for name, values := range resp.Header {
		h[name] = append([]string(nil), values...)
	}
	h.Set(HeaderReplayed, "true")
	h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

func (m *Middleware) reject(ctx context.Context, w http.ResponseWriter, op string, err error) {
	m.outcome(ctx, op, OutcomeRejected)
	WriteKeyError(w, err)
}

// fail answers a store or wiring failure. Unavailability and timeouts are
// 503 with Retry-After (retrying with the same key is safe and right);
// anything else is a 500 whose detail never leaks internals.
func (m *Middleware) fail(ctx context.Context, w http.ResponseWriter, op string, err error) {
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		// The client went away; nothing ran to completion and nothing is
		// stored. Not a server error.
		m.outcome(ctx, op, OutcomeRejected)
		m.cfg.Logger.InfoContext(ctx, "idempotency: client went away", "err", err)
		problem.Write(w, problem.ClientClosedRequest, "the client closed the request")
		return
	}
	m.outcome(ctx, op, OutcomeError)
	if errors.Is(err, ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
		m.cfg.Logger.WarnContext(ctx, "idempotency: store unavailable", "err", err)
		w.Header().Set("Retry-After", m.retryAfter())
		problem.Write(w, problem.Unavailable, "the database is unavailable; retry with the same Idempotency-Key")
		return
	}
	m.cfg.Logger.ErrorContext(ctx, "idempotency: store failed", "err", err)
	problem.Write(w, problem.Internal, "the operation could not be completed; retrying with the same Idempotency-Key is safe (it replays the outcome if it was stored, runs the operation if not)")
}

// outcome records what the protocol did with the request: in the request's
// context (for the log line) and with the observer (for metrics).
func (m *Middleware) outcome(ctx context.Context, op string, o Outcome) {
	setOutcome(ctx, o)
	m.cfg.Observer.Outcome(op, o)
}

// duplicate records the outcome of a request that did not run the
// operation, with the time its claim took.
func (m *Middleware) duplicate(ctx context.Context, op string, o Outcome, waited time.Duration) {
	m.outcome(ctx, op, o)
	m.cfg.Observer.DuplicateWait(op, o, waited)
}

func (m *Middleware) retryAfter() string {
	return strconv.Itoa(int((m.cfg.RetryAfter + time.Second - 1) / time.Second))
}

// Stored reports whether a response with this status is the operation's
// outcome, to be stored and replayed. Server errors are not (a retry must be
// able to run the operation), and neither are the statuses that mean the
// request was refused before the operation could start.
func Stored(status int) bool {
	switch status {
	case http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden,
		http.StatusRequestTimeout, http.StatusRequestEntityTooLarge,
		http.StatusUnsupportedMediaType, http.StatusTooManyRequests,
		problem.ClientClosedRequest.Status:
		return false
	}
	return status < 500
}

// detach keeps ctx's values but not its cancellation, with a bound: once the
// operation has run, its outcome is stored even if the client disconnected.
func detach(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
}

// Unsafe reports whether method changes state (RFC 9110 §9.2.1), and so
// needs an Idempotency-Key.
func Unsafe(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return false
	}
	return true
}
