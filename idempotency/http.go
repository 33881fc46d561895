package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// headerTTL is the response header that tells a client how long the server
// keeps a key's record: the operation's TTL (OperationConfig.TTL, else
// Config.TTL), in whole seconds counted from the key's first request, as
// delta-seconds (RFC 9651 sf-integer) like Retry-After and max-age, so no
// clock need agree. Serve sends it on every answer it gives, whatever the
// operation's handler or a stored record says: the value is the server's,
// of the operation, and not of one response. docs/protocol.md gives the
// reasons. It is not exported (the API budget): the name is documented.
const headerTTL = "Idempotency-TTL"

// ttlKey is headerTTL as an http.Header keys it (CanonicalHeaderKey).
const ttlKey = "Idempotency-Ttl"

// runKey carries a running request's decision to its handler, keyed by the
// operation so that a handler can only ever find its own operation's unit.
type runKey[U any] struct{ op *Operation[U] }

// Unit returns the unit of work of the request in ctx, which runs under
// this operation (Handler, Serve): what its handler writes through. A
// handler that needs the claim itself (to bind background work to the key)
// gets it in a unit of its own through MapUnit, which is handed each
// claim's Ref.
func (o *Operation[U]) Unit(ctx context.Context) (U, bool) {
	d, ok := ctx.Value(runKey[U]{o}).(*Decision[U])
	if !ok {
		var zero U
		return zero, false
	}
	return d.Unit, true
}

// Handler serves the operation with next, which finds its unit of work
// with Unit. Every request to it, whatever its method, goes through the
// protocol, as with HandlerFunc: it needs a valid Idempotency-Key, a scope
// (Config.Scope) and a body within Config.MaxBodyBytes. Mount it on the
// operation's method and route only; a safe method (GET) served on the
// same path belongs to a handler of its own.
func (o *Operation[U]) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in, err := o.e.prepare(w, r)
		if err != nil {
			o.e.report(o.label(r), OutcomeRejected)
			o.e.writeError(w, r, err)
			return
		}
		o.Serve(w, r, in, next)
	})
}

// HandlerFunc is Handler with fn, which is handed the unit of work to
// write through instead of finding it with Unit.
func (o *Operation[U]) HandlerFunc(fn func(w http.ResponseWriter, r *http.Request, unit U)) http.Handler {
	return o.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		unit, _ := o.Unit(r.Context())
		fn(w, r, unit)
	}))
}

// prepare reads what Serve needs from r: the key (repeated on the
// answer), the scope and the body.
func (e *Engine) prepare(w http.ResponseWriter, r *http.Request) (Request, error) {
	key, err := ParseKey(r.Header.Values(HeaderKey))
	if err != nil {
		return Request{}, err
	}
	w.Header().Set(HeaderKey, key)
	if e.cfg.Scope == nil {
		return Request{}, ErrNoScope
	}
	scope, err := e.cfg.Scope(r)
	if err != nil {
		return Request{}, err
	}
	if scope == "" {
		return Request{}, ErrNoScope
	}
	body, err := ReadBody(w, r, e.cfg.MaxBodyBytes)
	if err != nil {
		return Request{}, err
	}
	return Request{Scope: scope, Key: key, Body: body}, nil
}

// ReadBody reads r's whole body for Serve, up to limit bytes, and fails
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

// Serve is the protocol over HTTP (Operation.Begin, then Finish) for a
// request a front door has read: in gives its scope, its key (which the
// front door repeats on the answer, in the header it read it from) and
// its whole body, and its Check, if any (Config.Validate if not); the
// rest of the fingerprint's input (Request) Serve
// reads from r, the route by Config.Route. It answers a repeat from the
// stored record, refuses a mismatch or a duplicate still in flight, or
// runs next under a fresh claim and stores its response; it answers only
// once the outcome is durable, and returns what it did. Begin's errors are
// answered through Config.WriteError, with Retry-After on ErrInFlight and
// ErrUnavailable. The operation, next, reads the body exactly as the
// client sent it, and finds its unit of work with Unit. Every answer of
// Serve carries Idempotency-TTL, the operation's TTL in seconds, and one
// that next sets is not sent: a request refused before Serve (no valid
// key, no scope, a body too large) is answered without it.
func (o *Operation[U]) Serve(w http.ResponseWriter, r *http.Request, in Request, next http.Handler) Outcome {
	w.Header()[ttlKey] = []string{o.retention}
	s := &serving[U]{op: o, w: w, r: r}
	d := &s.d
	d.req = Request{
		Scope: in.Scope, Key: in.Key, Body: in.Body, Check: in.Check,
		Method: r.Method, Route: o.e.cfg.Route(r), Path: r.URL.EscapedPath(), Query: r.URL.RawQuery,
		ContentType: r.Header.Get("Content-Type"),
	}
	if n := len(r.Header.Values("Content-Type")); n > 1 && len(in.Body) > 0 {
		// Which one a server reads differs: the body must be read one way
		// only, the way it is fingerprinted.
		return s.refuseHeaders(fmt.Errorf("%w: send exactly one Content-Type header, got %d", errMalformedContentType, n))
	}
	repeat, err := parseRepeat(r.Header)
	if err != nil {
		return s.refuseHeaders(err)
	}
	d.req.Repeat = repeat || in.Repeat
	if o.e.cfg.Validate != nil {
		d.checker = s // unless in has a Check of its own (begin)
	}
	d.follows = true
	err = o.begin(r.Context(), d)
	switch {
	case err != nil:
		s.write(err)
	case d.follow != nil:
		o.follow(w, r, d)
	case d.Replay != nil:
		o.replay(w, r, *d.Replay, d.Ref)
	case o.held != nil:
		s.runHeld(next)
	default:
		s.run(next)
	}
	return d.outcome
}

// serving is one request on its way through Serve: its decision, and what
// run hands the operation, allocated with it.
type serving[U any] struct {
	op  *Operation[U]
	w   http.ResponseWriter
	r   *http.Request
	d   Decision[U]
	ran running
}

// refuseHeaders answers err for a request whose headers are refused before
// the protocol begins, and reports it as Begin would.
func (s *serving[U]) refuseHeaders(err error) Outcome {
	d := &s.d
	d.op, d.label = s.op, s.op.labelOf(s.r.Method, d.req.Route)
	s.write(d.refuse(err))
	return d.outcome
}

// check is Config.Validate of the request, for the core (checker).
func (s *serving[U]) check() error { return s.op.e.cfg.Validate(s.r, s.d.req.Body) }

// write answers err, Begin's or Finish's.
func (s *serving[U]) write(err error) {
	if errors.Is(err, ErrInFlight) || errors.Is(err, ErrUnavailable) {
		s.w.Header().Set("Retry-After", s.op.e.retryAfter())
	}
	s.op.e.writeError(s.w, s.r, err)
}

// run executes the operation, buffering its response, and answers only
// after Finish made the outcome durable: a client never sees a success
// that a crash could still undo.
func (s *serving[U]) run(next http.Handler) {
	d, ctx := &s.d, s.r.Context()
	// Rolls back on every path that did not finish, panics included (the
	// panic continues to the recoverer above).
	defer d.Abandon(ctx)
	rec := &s.ran.rec
	inner := s.r.WithContext(context.WithValue(ctx, runKey[U]{s.op}, d))
	inner.Body = &s.ran.body
	inner.ContentLength = int64(len(d.req.Body))
	var err error
	for {
		s.ran.rec = recorder{header: http.Header{}, status: http.StatusOK, spill: s}
		s.ran.body.Reset(d.req.Body)
		next.ServeHTTP(rec, inner)
		if !replayable(rec.status) {
			// Not the outcome: Finish frees the key.
			_ = d.Finish(ctx, Response{Status: rec.status})
			rec.copyTo(s.w)
			return
		}
		var resp Response
		if resp, err = rec.end(rec.allowed(s.op.e.stored)); err != nil {
			// A piece of the body could not be stored: nothing is.
			d.Abandon(ctx)
			err = d.fail(ctx, fmt.Errorf("store a piece of the response: %w", err))
			break
		}
		err = d.Finish(ctx, resp)
		if err != nil || !d.Again {
			break
		}
		// The key was taken over from its expired record: the run's
		// writes and response were discarded, and it runs again.
	}
	switch {
	case err != nil:
		s.write(err)
	case d.Replay != nil:
		// Another request's claim won the key as this one committed.
		s.op.replay(s.w, s.r, *d.Replay, s.d.Ref)
	case rec.pieces > 0:
		// The body is in the store, committed: the client gets it from
		// there, a piece at a time, as a replay would (but not marked one).
		copyHeader(s.w.Header(), rec.header)
		s.w.Header().Set("Content-Length", strconv.FormatInt(rec.size, 10))
		s.w.WriteHeader(rec.status)
		ref := s.d.Ref
		s.op.e.writePieces(s.w, func(n int) ([]byte, error) { return s.op.store.ReadPiece(ctx, ref, n) }, 1, rec.pieces+1, rec.size, 0)
	default:
		rec.copyTo(s.w)
	}
}

// spill stores piece n of the running operation's body with its writes
// (Lease.WritePiece), even if the client went away: the run goes on to
// store its outcome.
func (s *serving[U]) spill(n int, p []byte) error {
	lease := s.d.lease
	if lease == nil {
		return errors.ErrUnsupported
	}
	dctx := detach(s.r.Context())
	defer dctx.cancel()
	return lease.WritePiece(dctx, n, p)
}

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

// replay writes a stored response (Engine.replay), whose body, if it is
// in pieces, is read under ref's claim.
func (o *Operation[U]) replay(w http.ResponseWriter, r *http.Request, resp Response, ref Ref) {
	if resp.Pieces <= 0 && (r.Header.Get(headerLastEventID) == "" || !isEventStream(resp.Header)) {
		// The common case: the whole body is in the record.
		o.e.replay(w, r, resp, nil)
		return
	}
	ctx := r.Context()
	o.e.replay(w, r, resp, func(n int) ([]byte, error) { return o.store.ReadPiece(ctx, ref, n) })
}

// replay writes a stored response: the same status and body bytes, the
// allow-listed headers, and Idempotent-Replayed. A body stored in pieces
// (read by read) is sent a piece at a time, so a replay holds one piece
// in memory; a piece that cannot be read breaks the answer off (its
// Content-Length unmet), so that no client takes a part for the whole. A
// stream (text/event-stream) asked for with a Last-Event-ID that names
// one of its events resumes after that event.
func (e *Engine) replay(w http.ResponseWriter, r *http.Request, resp Response, read func(n int) ([]byte, error)) {
	if read == nil {
		setReplayHeader(w.Header(), resp.Header, int64(len(resp.Body)))
		w.WriteHeader(resp.Status)
		_, _ = w.Write(resp.Body)
		return
	}
	// The first piece of a body in pieces is its head (pieceHead); a body
	// kept in the record is its only piece.
	first, pieces, size := 1, resp.Pieces, resp.Size
	if pieces <= 0 {
		body := resp.Body
		first, pieces, size, read = 0, 1, int64(len(body)), func(int) ([]byte, error) { return body, nil }
	}
	offset := 0
	if last := r.Header.Get(headerLastEventID); last != "" && isEventStream(resp.Header) {
		piece, off, skipped, ok, err := resumeAt(read, first, pieces, last)
		if err != nil {
			e.cfg.Logger.Error("idempotency: a replay could not be sent: a piece of its stored body could not be read", "error", err)
			e.writeError(w, r, ErrUnavailable)
			return
		}
		if ok {
			first, offset, size = piece, off, size-skipped
		}
	}
	setReplayHeader(w.Header(), resp.Header, size)
	w.WriteHeader(resp.Status)
	e.writePieces(w, read, first, pieces, size, offset)
}

// writePieces sends pieces first to pieces-1 of a stored body (read by
// read), size bytes from offset in the first, a piece at a time; a piece
// that cannot be read breaks the answer off (its Content-Length unmet),
// so that no client takes a part for the whole.
func (e *Engine) writePieces(w http.ResponseWriter, read func(n int) ([]byte, error), first, pieces int, size int64, offset int) {
	var sent int64
	for i := first; i < pieces; i++ {
		p, err := read(i)
		if i == first && p != nil {
			p = p[min(offset, len(p)):]
		}
		if err != nil || p == nil || sent+int64(len(p)) > size {
			if !errors.Is(err, context.Canceled) { // else the client left
				e.cfg.Logger.Error("idempotency: an answer broke off: a piece of its stored body could not be read", "error", errPieceLost(i, err), "pieces", pieces)
			}
			panic(http.ErrAbortHandler)
		}
		sent += int64(len(p))
		if _, err := w.Write(p); err != nil {
			return // the client left
		}
	}
	if sent != size {
		e.cfg.Logger.Error("idempotency: an answer broke off: its stored pieces are shorter than its body", "sent", sent, "size", size)
		panic(http.ErrAbortHandler)
	}
}

// setReplayHeader sets on h what a replay of a response with the header
// stored carries: its allow-listed headers, Idempotent-Replayed, and a
// Content-Length of size (none when size is negative: a body followed as
// it is stored, whose length is not known yet).
func setReplayHeader(h, stored http.Header, size int64) {
	n := 0
	for _, values := range stored {
		n += len(values)
	}
	// The values are copied into one slice, each header's with no spare
	// capacity (as http.Header.Clone does), so that appending to one never
	// writes into another; the replay's own two headers come last.
	all := make([]string, 0, n+2)
	for name, values := range stored {
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
	all = append(all, "true")
	h[HeaderReplayed] = all[end : end+1 : end+1]
	if size >= 0 {
		all = append(all, strconv.FormatInt(size, 10))
		h["Content-Length"] = all[end+1 : end+2 : end+2]
	}
}

// errPieceLost is why piece n of a stored body could not be read: err, or
// none kept.
func errPieceLost(n int, err error) error {
	if err != nil {
		return fmt.Errorf("piece %d of a stored body: %w", n, err)
	}
	return fmt.Errorf("piece %d of a stored body is not kept", n)
}

// refuse answers a request refused before its operation ran; no key is
// consumed.

func (e *Engine) report(label string, o Outcome) {
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

// Unsafe reports whether method changes state (RFC 9110 §9.2.1), and so
// needs an Idempotency-Key.
func Unsafe(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return false
	}
	return true
}
