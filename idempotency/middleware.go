package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/oncekey/oncekey/idempotency/internal/clock"
)

// Defaults for Config fields left zero.
const (
	defaultTTL          = 48 * time.Hour
	defaultWait         = time.Second
	defaultRetryAfter   = time.Second
	defaultMaxBodyBytes = 1 << 20
)

// minStoreWait is the least wait a claim is given after queueing behind
// duplicates on this process: enough for a claim statement that blocks on
// nothing, so a key whose holder just finished is answered from the store.
const minStoreWait = 100 * time.Millisecond

// DefaultReplayHeaders are the response headers stored with a record and
// replayed. Content-Encoding is among them because the body is stored as the
// bytes sent: an encoded body replayed without it is unreadable. Anything
// else (Date, request ids, tracing headers) is specific to one response and
// must not be handed to a different request.
var DefaultReplayHeaders = []string{"Content-Type", "Content-Encoding", "Location", "Retry-After"}

// neverReplayed are headers no configuration can store: credentials and
// cookies belong to one client and one exchange, and hop-by-hop headers to
// one connection (RFC 9110 §7.6.1).
var neverReplayed = map[string]bool{
	"Set-Cookie": true, "Set-Cookie2": true, "Authorization": true, "Proxy-Authorization": true,
	"Proxy-Authenticate": true, "Www-Authenticate": true, "Cookie": true,
	"Connection": true, "Keep-Alive": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Content-Length": true, HeaderReplayed: true, HeaderKey: true,
}

// ErrKeyMismatch answers a request whose key holds the outcome of a
// different request (method, route, path, query or body): 409.
var ErrKeyMismatch = errors.New("this Idempotency-Key was already used with a different request (method, path, query or body); use a new key for a new operation")

// ErrBodyTooLarge answers a body over the limit (413); it consumes no key.
var ErrBodyTooLarge = errors.New("the request body is too large")

// ErrNoScope means the request has no scope to put its key in: it was not
// authenticated. Config.Scope returns it (or an error of its own).
var ErrNoScope = errors.New("the request carries no credentials to scope its Idempotency-Key to")

// Config configures an Engine. Scope is required for Operation.Handler and
// HandlerFunc (without it every request is ErrNoScope); every other field
// is optional.
type Config struct {
	// Scope returns the scope (a tenant, a user) a request's key belongs
	// to, for Operation.Handler and HandlerFunc: keys of two scopes never
	// meet. An error is answered through WriteError (ErrNoScope: 401), and
	// so is an empty scope: it would put every such caller's keys in one
	// namespace, where each could replay the others' responses.
	// Front doors that call Operation.Serve give the scope themselves.
	Scope func(r *http.Request) (string, error)
	// Route returns the matched route pattern ("/widgets/{id}"), which the
	// fingerprint binds the key to. Default: the pattern net/http's
	// ServeMux matched, without its method, or else the path.
	Route func(r *http.Request) string
	// TTL is how long a completed record is replayed (default 48h).
	TTL time.Duration
	// Wait is how long a duplicate waits for an in-flight first request
	// before it gets 202 (default 1s).
	Wait time.Duration
	// RetryAfter is advertised on 202 and 503 answers (default 1s).
	RetryAfter time.Duration
	// MaxBodyBytes bounds the bodies Operation.Handler and HandlerFunc
	// read (default 1 MiB).
	MaxBodyBytes int64
	// ReplayHeaders is the allow-list of stored response headers (default
	// DefaultReplayHeaders). Set-Cookie, Authorization and hop-by-hop
	// headers are never stored, whatever it says.
	ReplayHeaders []string
	// Validate, if set, checks a request's body (as sent, the bytes the
	// operation will read) before the operation runs, and before a request
	// whose key holds a different request's outcome is answered 409: an
	// error refuses it, through WriteError, and consumes no key. A body's
	// schema is checked here rather than in front of the protocol so that
	// replays, whose bodies mean what the bodies that passed when their
	// operation ran meant, do not pay for it again.
	Validate func(r *http.Request, body []byte) error
	// WriteError answers a request the protocol refuses or fails: err is
	// one of this package's errors (ErrMissingKey, ErrKeyMismatch,
	// ErrInFlight, ...), possibly wrapped, context.Canceled when the client
	// went away, an error of Scope or Validate, or a store's failure.
	// Retry-After is already set where it applies. Default: ProblemWriter
	// with ProblemTypeBase.
	WriteError func(w http.ResponseWriter, r *http.Request, err error)
	// ProblemTypeBase prefixes the type URIs of the default WriteError's
	// problem documents ("https://example.com/problems/"); empty means
	// "about:blank" for every problem.
	ProblemTypeBase string
	// Logger receives store failures (default slog.Default()).
	Logger *slog.Logger
	// Observer is told every request's outcome (default: nobody).
	Observer Observer
}

// Engine is the protocol shared by a service's operations: its settings,
// and the queue in which concurrent duplicates of one key wait on this
// process.
type Engine struct {
	cfg      Config
	stored   []string
	inFlight *collapser
	// settles are held operations' outcomes that their store did not
	// take yet (see HeldConfig.MaxPending).
	settles *pendingSettles
	// now is this process's clock (time.Now), which tests skew
	// (internal/clock): held records' leases must not depend on it where
	// the store keeps a clock of its own.
	now func() time.Time
}

func init() {
	clock.Set = func(e any, now func() time.Time) { e.(*Engine).now = now }
}

// New returns an engine for cfg, filling in defaults.
func New(cfg Config) *Engine {
	if cfg.TTL <= 0 {
		cfg.TTL = defaultTTL
	}
	if cfg.Wait <= 0 {
		cfg.Wait = defaultWait
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = defaultRetryAfter
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = defaultMaxBodyBytes
	}
	if cfg.ReplayHeaders == nil {
		cfg.ReplayHeaders = DefaultReplayHeaders
	}
	if cfg.Route == nil {
		cfg.Route = muxPattern
	}
	if cfg.WriteError == nil {
		cfg.WriteError = ProblemWriter(cfg.ProblemTypeBase)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Observer == nil {
		cfg.Observer = noObserver{}
	}
	var replay []string
	for _, name := range cfg.ReplayHeaders {
		if name = http.CanonicalHeaderKey(name); !neverReplayed[name] {
			replay = append(replay, name)
		}
	}
	return &Engine{cfg: cfg, stored: replay, inFlight: newCollapser(), settles: newPendingSettles(cfg.Logger, cfg.Observer), now: time.Now}
}

// muxPattern is the route net/http's ServeMux matched ("POST /widgets/{id}"
// without the method), or the path where there is none.
func muxPattern(r *http.Request) string {
	p := r.Pattern
	if p == "" {
		return r.URL.Path
	}
	for i := 0; i < len(p); i++ {
		if p[i] == ' ' {
			return p[i+1:]
		}
		if p[i] == '/' {
			break
		}
	}
	return p
}

// OperationConfig configures one operation; zero fields take the engine's.
type OperationConfig struct {
	// Name labels the operation in metrics; empty names it by method and
	// route pattern ("POST /widgets"), as oapi.Bind does.
	Name string
	// TTL overrides Config.TTL for this operation.
	TTL time.Duration
	// Wait overrides Config.Wait for this operation.
	Wait time.Duration
}

// Operation is one unsafe operation under the protocol, whose claims its
// store makes and whose handler writes through the store's unit of work, of
// type U. The store, and with it U, is fixed when the operation is
// declared: a write-only operation declared on a store that defers its
// claim to the commit gets a unit that can only queue writes, and the
// compiler holds its handler to that.
type Operation[U any] struct {
	e     *Engine
	store Store[U]
	cfg   OperationConfig
	held  *heldOperation // nil unless declared by NewHeldOperation
	// named is the label last made of a method and route, for an operation
	// without a name: an operation is nearly always served on one route,
	// so its requests share one label instead of each making its own.
	named atomic.Pointer[routeLabel]
}

// routeLabel is the label of an operation served with method on route.
type routeLabel struct{ method, route, label string }

// NewOperation declares an operation of e whose keys store keeps.
func NewOperation[U any](e *Engine, store Store[U], cfg OperationConfig) *Operation[U] {
	if cfg.TTL <= 0 {
		cfg.TTL = e.cfg.TTL
	}
	if cfg.Wait <= 0 {
		cfg.Wait = e.cfg.Wait
	}
	return &Operation[U]{e: e, store: store, cfg: cfg}
}

// Name is the operation's label: its configured name, or "" when it is
// named by each request's method and route.
func (o *Operation[U]) Name() string { return o.cfg.Name }

// Prepared is a request as a front door has read it: the scope it belongs
// to, its Idempotency-Key (see ParseKey) and its whole body.
type Prepared struct {
	Scope string
	Key   string
	Body  []byte
	// KeyHeader is the response header that repeats Key: the header the
	// front door read it from. Empty: Idempotency-Key.
	KeyHeader string
}

// leaseKey carries an operation's lease to its handler, keyed by the
// operation so that a handler can only ever find its own operation's unit.
type leaseKey[U any] struct{ op *Operation[U] }

// Unit returns the unit of work of the request in ctx, which runs under
// this operation: what its handler writes through.
func (o *Operation[U]) Unit(ctx context.Context) (U, bool) {
	lease, ok := ctx.Value(leaseKey[U]{o}).(Lease[U])
	if !ok {
		var zero U
		return zero, false
	}
	return lease.Unit(), true
}

// Ref returns the claim the request in ctx runs under, so that a long
// operation can bind its background work to the key and later replace the
// provisional response stored under it.
func (o *Operation[U]) Ref(ctx context.Context) (Ref, bool) {
	lease, ok := ctx.Value(leaseKey[U]{o}).(Lease[U])
	if !ok {
		return Ref{}, false
	}
	return lease.Ref(), true
}

// Handler wraps next, which finds its unit of work with Unit. Safe methods
// (GET, HEAD, OPTIONS, TRACE) pass through untouched; every other request
// needs a valid Idempotency-Key, a scope (Config.Scope) and a body within
// Config.MaxBodyBytes.
func (o *Operation[U]) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !Unsafe(r.Method) {
			next.ServeHTTP(w, r)
			return
		}
		in, err := o.e.prepare(w, r)
		if err != nil {
			o.e.report(r.Context(), o.label(r), OutcomeRejected)
			o.e.writeError(w, r, err)
			return
		}
		o.Serve(w, r, in, next)
	})
}

// HandlerFunc serves the operation with fn, which is handed the unit of
// work to write through. Every request to it, whatever its method, goes
// through the protocol.
func (o *Operation[U]) HandlerFunc(fn func(w http.ResponseWriter, r *http.Request, unit U)) http.Handler {
	run := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		unit, _ := o.Unit(r.Context())
		fn(w, r, unit)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in, err := o.e.prepare(w, r)
		if err != nil {
			o.e.report(r.Context(), o.label(r), OutcomeRejected)
			o.e.writeError(w, r, err)
			return
		}
		o.Serve(w, r, in, run)
	})
}

// prepare reads what Serve needs from r: the key, the scope and the body.
func (e *Engine) prepare(w http.ResponseWriter, r *http.Request) (Prepared, error) {
	key, err := ParseKey(r.Header.Values(HeaderKey))
	if err != nil {
		return Prepared{}, err
	}
	w.Header().Set(HeaderKey, key)
	if e.cfg.Scope == nil {
		return Prepared{}, ErrNoScope
	}
	scope, err := e.cfg.Scope(r)
	if err != nil {
		return Prepared{}, err
	}
	if scope == "" {
		return Prepared{}, ErrNoScope
	}
	body, err := ReadBody(w, r, e.cfg.MaxBodyBytes)
	if err != nil {
		return Prepared{}, err
	}
	return Prepared{Scope: scope, Key: key, Body: body}, nil
}

// ReadBody reads r's whole body for Prepared, up to limit bytes, and fails
// with ErrBodyTooLarge beyond it without reading more than the limit: at
// once when Content-Length says so, else once the limit is passed. A body
// that breaks off (a chunked body cut short, say) is ErrMalformedBody: it
// cannot be the body it was meant to be. A front door of its own reads
// bodies with it as Operation.Handler does.
func ReadBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, fmt.Errorf("%w: the body is %d bytes; the limit is %d", ErrBodyTooLarge, r.ContentLength, limit)
	}
	body, err := readAll(http.MaxBytesReader(w, r.Body, limit), r.ContentLength)
	if err == nil {
		return body, nil
	}
	// Declared only here: errors.As moves it to the heap.
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return nil, fmt.Errorf("%w: the body exceeds the limit of %d bytes", ErrBodyTooLarge, tooLarge.Limit)
	}
	return nil, fmt.Errorf("%w: the request body broke off: %w", ErrMalformedBody, err)
}

// readAll is io.ReadAll, but starts with a buffer of size bytes (and one
// more, for the read that finds the end) where size, the body's
// Content-Length, is below the 512 bytes io.ReadAll starts with: most
// bodies are small, and a request then allocates what its body needs. A
// Content-Length is only the client's word, so it never makes the first
// buffer larger than io.ReadAll's.
func readAll(r io.Reader, size int64) ([]byte, error) {
	const start = 512
	n := start
	if size >= 0 && size < start {
		n = int(size) + 1
	}
	b := make([]byte, 0, n)
	for {
		m, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+m]
		if err != nil {
			if err == io.EOF {
				err = nil
			}
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)] // grow as io.ReadAll does
		}
	}
}

// label names the operation of r for metrics.
func (o *Operation[U]) label(r *http.Request) string {
	if o.cfg.Name != "" {
		return o.cfg.Name
	}
	return o.labelOf(r.Method, o.e.cfg.Route(r))
}

// labelOf names the operation, served with method on route, for metrics:
// OperationName(method, route) unless it has a name of its own.
func (o *Operation[U]) labelOf(method, route string) string {
	if o.cfg.Name != "" {
		return o.cfg.Name
	}
	if l := o.named.Load(); l != nil && l.method == method && l.route == route {
		return l.label
	}
	l := &routeLabel{method: method, route: route, label: OperationName(method, route)}
	o.named.Store(l)
	return l.label
}

// Serve runs the protocol for a prepared request: it answers a repeat from
// the stored record, refuses a mismatch or a duplicate still in flight, or
// runs next under a fresh claim and stores its response. It answers only
// once the outcome is durable, and returns what it did. A request without
// a scope, or with one longer than MaxScopeLength, is refused with
// ErrNoScope; one whose body has no fingerprint
// (see ComputeFingerprintFor) with ErrMalformedBody, or the malformed-form
// or malformed-content-type problem, and one whose query does not parse with
// ErrMalformedQuery, before anything runs. The operation, next, reads the
// body exactly as the client sent it.
func (o *Operation[U]) Serve(w http.ResponseWriter, r *http.Request, in Prepared, next http.Handler) Outcome {
	ctx := r.Context()
	route := o.e.cfg.Route(r)
	s := &serving[U]{op: o, w: w, r: r, in: in, label: o.labelOf(r.Method, route)}
	switch {
	case in.Scope == "":
		return s.refuse(ErrNoScope)
	case len(in.Scope) > MaxScopeLength:
		// Refused before any store is asked: PostgreSQL's would fail the
		// claim (500, "retrying is safe") for a scope no retry can shorten.
		return s.refuse(fmt.Errorf("%w: the scope is %d bytes, over the %d a key's scope can be", ErrNoScope, len(in.Scope), MaxScopeLength))
	}
	echo := HeaderKey
	if in.KeyHeader != "" {
		echo = http.CanonicalHeaderKey(in.KeyHeader)
	}
	if h := w.Header(); len(h[echo]) != 1 || h[echo][0] != in.Key {
		// Operation.Handler has set it already; a front door of its own
		// may not have.
		h.Set(echo, in.Key)
	}
	if n := len(r.Header.Values("Content-Type")); n > 1 && len(in.Body) > 0 {
		// Which one a server reads differs: the body must be read one way
		// only, the way it is fingerprinted.
		return s.refuse(fmt.Errorf("%w: send exactly one Content-Type header, got %d", errMalformedContentType, n))
	}
	var query url.Values // none, as most requests have, is nil: Encode makes "" of both
	var err error
	if r.URL.RawQuery != "" {
		if query, err = url.ParseQuery(r.URL.RawQuery); err != nil {
			// r.URL.Query() would drop what it cannot read, and a proxy
			// forwards the raw query: "?to=alice;" and "?to=bob;" would
			// share a fingerprint.
			return s.refuse(fmt.Errorf("%w: %w", ErrMalformedQuery, err))
		}
	}
	media, canonical, err := canonicalBody(r.Header.Get("Content-Type"), in.Body)
	if err != nil {
		return s.refuse(err)
	}
	s.route, s.query = route, query
	s.fp = fingerprintCanonical(r.Method, route, r.URL.EscapedPath(), query, media, canonical)
	// The operation reads the body as it was sent (in.Body): the canonical
	// form is the fingerprint's alone. Two requests with one fingerprint
	// still mean the same to every reader, because the fingerprint ignores
	// only what no parser reads (docs/protocol.md lists it).

	claimStart := time.Now()
	// Concurrent duplicates on this process queue here, one at a time to
	// the store, within the same wait budget.
	holds, queued, ok := o.e.inFlight.enter(ctx, in.Scope, in.Key, o.cfg.Wait)
	if !ok && ctx.Err() != nil {
		return s.fail(ctx.Err())
	}
	if !ok {
		return s.answer(nil, ErrInFlight, time.Since(claimStart))
	}
	if holds {
		defer o.e.inFlight.leave(in.Scope, in.Key)
	}
	// A request that queued behind a duplicate almost surely finds the key
	// taken: it claims in the way that answers from the record without
	// running the operation at all.
	contended := queued
	for {
		req := ClaimRequest{
			Scope: in.Scope, Key: in.Key, Fingerprint: s.fp,
			Method: r.Method, Route: route, TTL: o.cfg.TTL,
			Wait: max(o.cfg.Wait-time.Since(claimStart), minStoreWait),
		}
		claim := o.store.Claim
		if contended {
			claim = func(ctx context.Context, req ClaimRequest) (Lease[U], *Record, error) {
				return ClaimNow(ctx, o.store, req)
			}
		}
		var lease Lease[U]
		var rec *Record
		var err error
		if o.held != nil {
			// An outcome this process has and its store has not taken
			// yet answers as the store would once it does.
			rec = o.e.settles.remembered(in.Scope, in.Key, o.held.RetryUnknown)
		}
		if rec == nil {
			lease, rec, err = claim(ctx, req)
		}
		if lease != nil {
			var outcome Outcome
			if o.held != nil {
				outcome, err = s.runHeld(lease, next)
			} else {
				outcome, err = s.run(lease, next)
			}
			if err == nil {
				return outcome
			}
			// Declared only here: errors.As moves it to the heap.
			var taken *TakenError
			switch {
			case errors.As(err, &taken) && taken.Record == nil && !contended:
				// A concurrent first request got the key between the look
				// and the insert of a deferred claim: claim again, now,
				// which waits for its outcome.
				contended = true
				continue
			case errors.As(err, &taken):
				rec, err = taken.Record, nil
			}
		}
		if rec != nil && s.matches(rec.Fingerprint) {
			if h, ok := ParseHeld(rec.Response); ok {
				// A held operation runs, or ran, under the key elsewhere.
				ref := Ref{Scope: in.Scope, Key: in.Key, ClaimedAt: rec.CreatedAt}
				again, herr := o.meetHeld(ctx, rec, h, ref, o.cfg.Wait-time.Since(claimStart))
				if again {
					// Claimed at once from now on: it reads the key's
					// record, where a deferred claim would try to insert.
					contended = true
					continue
				}
				rec, err = nil, herr
			}
		}
		return s.answer(rec, err, time.Since(claimStart))
	}
}

// serving is one request on its way through Serve.
type serving[U any] struct {
	op    *Operation[U]
	w     http.ResponseWriter
	r     *http.Request
	in    Prepared
	label string
	fp    Fingerprint
	route string
	query url.Values
	// legacy is the request's fingerprint under the rules before the
	// current ones, computed when a stored record needs it (legacyDone).
	legacy               Fingerprint
	legacyOK, legacyDone bool
	// ran is what run hands the operation, allocated with the rest.
	ran running
}

// answer responds to a request that did not run the operation: its key holds
// rec, or the claim failed with err.
func (s *serving[U]) answer(rec *Record, err error, waited time.Duration) Outcome {
	e := s.op.e
	switch {
	case errors.Is(err, ErrInFlight):
		s.w.Header().Set("Retry-After", e.retryAfter())
		e.writeError(s.w, s.r, ErrInFlight)
		return s.duplicate(OutcomeInFlight, waited)
	case errors.Is(err, ErrOutcomeUnknown):
		e.writeError(s.w, s.r, err)
		return s.duplicate(OutcomeUnknown, waited)
	case errors.Is(err, ErrNotStored):
		e.writeError(s.w, s.r, err)
		return s.duplicate(OutcomeNotStored, waited)
	case err != nil:
		return s.fail(fmt.Errorf("claim idempotency key: %w", err))
	case rec == nil:
		return s.fail(errors.New("claim returned neither a lease, a record nor an error"))
	case !s.matches(rec.Fingerprint):
		// A body the operation would refuse is refused alike whether or
		// not its key was used before.
		if err := s.validate(); err != nil {
			return s.refuse(err)
		}
		e.writeError(s.w, s.r, ErrKeyMismatch)
		return s.duplicate(OutcomeConflict, waited)
	default:
		e.replay(s.w, rec.Response)
		return s.duplicate(OutcomeReplayed, waited)
	}
}

// matches reports whether stored, a record's fingerprint, is this
// request's: the fingerprint of the current rules, or, for a record
// stored before them (whose fingerprint has no marker), the request's
// fingerprint under the rules it was computed by. A record of the current
// rules is never compared with a legacy fingerprint, under which
// 123456789.123456789123 and 123456789.12345679 were one request.
func (s *serving[U]) matches(stored Fingerprint) bool {
	if stored == s.fp {
		return true
	}
	if stored.current() {
		return false
	}
	if !s.legacyDone {
		s.legacyDone = true
		s.legacy, s.legacyOK = legacyFingerprint(s.r.Method, s.route, s.r.URL.EscapedPath(), s.query, s.r.Header.Get("Content-Type"), s.in.Body)
	}
	return s.legacyOK && stored == s.legacy
}

func (s *serving[U]) validate() error {
	if s.op.e.cfg.Validate == nil {
		return nil
	}
	return s.op.e.cfg.Validate(s.r, s.in.Body)
}

// run executes the operation inside lease and answers only after the outcome
// is durable: a client never sees a success that a crash could still undo.
// It returns the outcome once it has answered, or, without answering, the
// error of a deferred claim's Commit that found the key taken (*TakenError
// or ErrInFlight): the operation's writes and response were discarded, and
// the caller answers from what holds the key.
func (s *serving[U]) run(lease Lease[U], next http.Handler) (Outcome, error) {
	e, ctx := s.op.e, s.r.Context()
	ended := false
	rollback := func() {
		ended = true
		s.rollback(lease)
	}
	defer func() {
		// Rolls back on every path that did not commit, panics included (the
		// panic continues to the recoverer above).
		if !ended {
			rollback()
		}
	}()
	if err := s.validate(); err != nil {
		rollback()
		return s.refuse(err), nil
	}

	s.ran.rec = recorder{header: http.Header{}, status: http.StatusOK}
	s.ran.body.Reset(s.in.Body)
	rec := &s.ran.rec
	inner := s.r.WithContext(context.WithValue(ctx, leaseKey[U]{s.op}, lease))
	inner.Body = &s.ran.body
	inner.ContentLength = int64(len(s.in.Body))
	next.ServeHTTP(rec, inner)

	if !Replayable(rec.status) {
		// A server error or a rejection inside the operation: nothing is
		// stored, so a retry with the same key runs the operation again.
		rollback()
		rec.copyTo(s.w)
		if rec.status >= 500 {
			return s.report(OutcomeError), nil
		}
		return s.report(OutcomeRejected), nil
	}
	stored := Response{Status: rec.status, Header: rec.allowed(e.stored), Body: rec.body.Bytes()}
	// The operation ran; finish storing it even if the client went away, so
	// its retry replays instead of finding nothing.
	dctx := detach(ctx)
	defer dctx.cancel()
	if err := lease.Commit(dctx, stored); err != nil {
		ended = true // a failed commit has rolled back
		var taken *TakenError
		if errors.As(err, &taken) || errors.Is(err, ErrInFlight) {
			return "", err // nothing was written
		}
		return s.fail(fmt.Errorf("commit idempotent operation: %w", err)), nil
	}
	ended = true
	rec.copyTo(s.w)
	return s.report(OutcomeExecuted), nil
}

// running is what run hands the operation: the recorder it writes its
// response to, and its body. It is part of serving, so as to cost no
// allocation of its own.
type running struct {
	rec  recorder
	body bodyReader
}

// bodyReader is the body an operation reads: the request's, as sent. It
// reads as io.NopCloser of a bytes.Reader does, without their two
// allocations.
type bodyReader struct{ r bytes.Reader }

// Reset makes b read body from its start.
func (b *bodyReader) Reset(body []byte) { b.r.Reset(body) }

// Read implements io.Reader.
func (b *bodyReader) Read(p []byte) (int, error) { return b.r.Read(p) }

// WriteTo implements io.WriterTo, as io.NopCloser's reader does for a
// reader that has it: io.Copy then hands the body over in one write.
func (b *bodyReader) WriteTo(w io.Writer) (int64, error) { return b.r.WriteTo(w) }

// Close implements io.Closer: there is nothing to release.
func (b *bodyReader) Close() error { return nil }

// rollback rolls lease back, even if the client went away.
func (s *serving[U]) rollback(lease Lease[U]) {
	ctx := s.r.Context()
	dctx := detach(ctx)
	defer dctx.cancel()
	if err := lease.Rollback(dctx); err != nil {
		s.op.e.cfg.Logger.ErrorContext(ctx, "idempotency: rollback failed", "err", err)
	}
}

// replay writes a stored response: the same status and body bytes, the
// allow-listed headers, and Idempotent-Replayed.
func (e *Engine) replay(w http.ResponseWriter, resp Response) {
	h := w.Header()
	n := 0
	for _, values := range resp.Header {
		n += len(values)
	}
	// The values are copied into one slice, each header's with no spare
	// capacity (as http.Header.Clone does), so that appending to one never
	// writes into another; the replay's own two headers come last.
	all := make([]string, 0, n+2)
	for name, values := range resp.Header {
		if neverReplayed[http.CanonicalHeaderKey(name)] {
			continue
		}
		if len(values) == 0 {
			h[name] = nil
			continue
		}
		start := len(all)
		all = append(all, values...)
		h[name] = all[start:len(all):len(all)]
	}
	end := len(all)
	all = append(all, "true", strconv.Itoa(len(resp.Body)))
	h[HeaderReplayed] = all[end : end+1 : end+1]
	h["Content-Length"] = all[end+1 : end+2 : end+2]
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

// refuse answers a request refused before its operation ran; no key is
// consumed.
func (s *serving[U]) refuse(err error) Outcome {
	s.op.e.writeError(s.w, s.r, err)
	return s.report(OutcomeRejected)
}

// fail answers a store or wiring failure. Unavailability and timeouts get
// Retry-After (retrying with the same key is safe and right).
func (s *serving[U]) fail(err error) Outcome {
	e, ctx := s.op.e, s.r.Context()
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		// The client went away; nothing ran to completion and nothing is
		// stored. Not a server error.
		e.cfg.Logger.InfoContext(ctx, "idempotency: client went away", "err", err)
		e.writeError(s.w, s.r, context.Canceled)
		return s.report(OutcomeRejected)
	}
	if errors.Is(err, ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
		e.cfg.Logger.WarnContext(ctx, "idempotency: store unavailable", "err", err)
		s.w.Header().Set("Retry-After", e.retryAfter())
		if !errors.Is(err, ErrUnavailable) {
			err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
	} else {
		e.cfg.Logger.ErrorContext(ctx, "idempotency: store failed", "err", err)
	}
	e.writeError(s.w, s.r, err)
	return s.report(OutcomeError)
}

// report tells the observer what the protocol did with the request.
func (s *serving[U]) report(o Outcome) Outcome {
	s.op.e.report(s.r.Context(), s.label, o)
	return o
}

// duplicate reports the outcome of a request that did not run the
// operation, with the time its claim took.
func (s *serving[U]) duplicate(o Outcome, waited time.Duration) Outcome {
	s.op.e.cfg.Observer.DuplicateWait(s.label, o, waited)
	return s.report(o)
}

func (e *Engine) report(_ context.Context, label string, o Outcome) {
	e.cfg.Observer.Outcome(label, o)
}

func (e *Engine) writeError(w http.ResponseWriter, r *http.Request, err error) {
	e.cfg.WriteError(w, r, err)
}

// WriteError answers a request with err through Config.WriteError: for
// adapters (package oapi) that refuse a request before the protocol runs,
// in the words of the protocol's own answers. An error that is none of the
// protocol's (a 500) is logged first, as the protocol's own failures are.
func (e *Engine) WriteError(w http.ResponseWriter, r *http.Request, err error) {
	if _, known := describe(err); !known {
		e.cfg.Logger.ErrorContext(r.Context(), "idempotency: request refused", "err", err)
	}
	e.writeError(w, r, err)
}

func (e *Engine) retryAfter() string {
	return strconv.Itoa(int((e.cfg.RetryAfter + time.Second - 1) / time.Second))
}

// Replayable reports whether a response with this status is the operation's
// outcome, to be stored and replayed. Server errors are not (a retry must be
// able to run the operation), and neither are the statuses that mean the
// request was refused before the operation could start.
func Replayable(status int) bool {
	switch status {
	case http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden,
		http.StatusRequestTimeout, http.StatusRequestEntityTooLarge,
		http.StatusUnsupportedMediaType, http.StatusTooManyRequests,
		statusClientClosed:
		return false
	}
	return status < 500
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
