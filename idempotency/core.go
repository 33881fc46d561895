package idempotency

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"
)

// Request is one request of an operation as the protocol sees it, whatever
// carries it (HTTP, gRPC, a queue): whose key it is, and what the
// fingerprint binds the key to. The engine computes the fingerprint from
// it, so that every transport agrees with the HTTP layer on what makes two
// requests one.
type Request struct {
	// Scope is whose key it is (a tenant, an authenticated principal):
	// keys of two scopes never meet. Empty, or longer than
	// MaxScopeLength, is ErrNoScope.
	Scope string
	// Key is the idempotency key, as ParseKey accepts it.
	Key string
	// Method, Route and Path name the operation and the resource: "POST",
	// the route pattern ("/widgets/{id}") and the path as sent (escaped).
	// A transport without routes gives its method's full name for both.
	Method, Route, Path string
	// Query is the raw query string, without '?'; one that does not parse
	// as pairs is ErrMalformedQuery.
	Query string
	// ContentType is the body's media type, which says how the body is
	// read (see Fingerprint); empty reads it as JSON.
	ContentType string
	// Body is the whole body as sent: the operation reads these bytes.
	Body []byte
	// Repeat says that the client means this request as a new one even if
	// it repeats, under another key, one made within the operation's
	// RepeatWindow (Idempotency-Repeat: ?1): it is neither reported nor
	// refused as a repeat.
	Repeat bool
	// Check, if set, checks the request once the protocol has decided to
	// run it, and before it answers a mismatch, never for a replay (whose
	// body means what the body that passed when it ran meant): a front
	// door's schema check. Its error refuses the request, which consumes
	// no key, so that a request the operation would refuse is refused
	// alike whether or not its key was used before. It is not part of the
	// fingerprint. Config.Validate is the same check for Operation.Handler.
	Check func() error
}

// Fingerprint is the fingerprint the engine gives r, for front doors and
// tools that must agree with it (a record written by hand, a migration).
// It covers the body's meaning, never how it is spelled, so that a retry
// spelled differently is still the same request; the operation is handed
// the bytes as sent. How the body is read depends on its media type:
//
//   - none, application/json or any +json type: its canonical form (RFC
//     8785, but numbers compared as exact decimals: 1.0 and 1 are one
//     number, 123456789.123456789123 and 123456789.12345679 two), and the
//     media type, normalised, unless it is application/json (with no
//     parameter but charset=utf-8) or none: application/merge-patch+json
//     or another charset is another request;
//   - application/x-www-form-urlencoded: its canonical form (its fields in
//     their order, each spelled with one percent-encoding, "a" and "a="
//     kept apart; an error whose problem (ProblemOf) is malformed-form
//     where that is ambiguous or the charset is not UTF-8), and the media
//     type;
//   - any other type (multipart/form-data, application/octet-stream, ...):
//     the exact bytes, and the media type with its parameters, normalised
//     (type, subtype and parameter names in lower case), so that the same
//     bytes sent as another type are another request.
//
// The method, route, path and sorted query are hashed with it,
// length-prefixed so that no two different tuples hash alike: the route
// binds the key to the operation, the path to the resource, so that one
// key sent to /widgets/1/paint and then to /widgets/2/paint is a conflict,
// not a replay. A body without content (empty, JSON whitespace, a form
// without fields) is fingerprinted as no body whatever its type. JSON that
// is invalid or ambiguous is ErrMalformedBody, a Content-Type that does
// not parse an error whose problem is malformed-content-type (a JSON
// one's is hashed as sent).
// docs/protocol.md lists every difference the fingerprint ignores.
func (r Request) Fingerprint() (Fingerprint, error) {
	query, err := parseQuery(r.Query)
	if err != nil {
		return Fingerprint{}, err
	}
	media, canonical, err := canonicalBody(r.ContentType, r.Body)
	if err != nil {
		return Fingerprint{}, err
	}
	return fingerprintCanonical(r.Method, r.Route, r.Path, query, media, canonical), nil
}

// parseQuery reads a raw query; none, as most requests have, is nil
// (Encode makes "" of both).
func parseQuery(raw string) (url.Values, error) {
	if raw == "" {
		return nil, nil
	}
	query, err := url.ParseQuery(raw)
	if err != nil {
		// URL.Query() would drop what it cannot read, and a proxy
		// forwards the raw query: "?to=alice;" and "?to=bob;" would share
		// a fingerprint.
		return nil, fmt.Errorf("%w: %w", ErrMalformedQuery, err)
	}
	return query, nil
}

// Decision is what the protocol decided for a request (Operation.Begin):
// send a stored response again (Replay), or run the operation (Replay is
// nil) through Unit and end the run with Finish or Abandon. A refusal is
// Begin's error instead.
type Decision[U any] struct {
	// Replay is the response the key holds for this very request: send it
	// again, as it was. Nil while the operation is to run; Finish sets it
	// when a concurrent request turned out to hold the key (see Finish).
	Replay *Response
	// Unit is what the operation writes through (a transaction, or writes
	// queued to go with the claim, as the store defines U): its writes
	// commit with the response Finish stores, or not at all. The zero U
	// for a held operation, which runs outside the store.
	Unit U
	// Ref names the claim the operation runs under, so that a long
	// operation can bind its background work to the key and later replace
	// the provisional response stored under it.
	Ref Ref
	// Again is set by a Finish that returned nil without storing: the key
	// was not free when a store that claims at commit came to claim it (an
	// expired record of the key was still there), and a fresh claim now
	// holds it. The writes and the response of the run were discarded: run
	// the operation again through the new Unit and Ref, then Finish again.
	Again bool

	op      *Operation[U]
	req     Request
	label   string
	fp      Fingerprint
	query   url.Values
	lease   Lease[U] // nil once the run ended
	checker checker  // nil: nothing to check
	// claimStart is when the claim began, for the wait a duplicate spent;
	// heldSince is when a held operation's lease began counting.
	claimStart, heldSince time.Time
	// holds: the request holds its key on this process (the collapser)
	// until its run ends; contended: it claims at once (ClaimRequest.AtOnce).
	holds, contended bool
	// legacy is the request's fingerprint under the rules before the
	// current ones, computed when a stored record needs it (legacyDone).
	legacy               Fingerprint
	legacyOK, legacyDone bool
	// outcome is what was last reported of the request.
	outcome Outcome
	// follows: the caller can follow a held operation's body as it is
	// stored (Serve); follow is that body's head when the request is to
	// (Operation.follow), the operation still running elsewhere.
	follows bool
	follow  []byte
	// repeat names the request among those its repeats are spotted by,
	// and repeatSeq its record there while it runs (0: none).
	repeat    repeatID
	repeatSeq uint64
}

// checker checks a request's body before its operation runs and before a
// mismatch is answered (Request.Check, or Config.Validate for the HTTP
// layer).
type checker interface{ check() error }

// checkFunc is Request.Check as a checker.
type checkFunc func() error

func (f checkFunc) check() error { return f() }

// Begin runs the protocol for req up to the operation: it claims req's key
// and decides. A nil error with d.Replay set: send that stored response
// again. A nil error without it: run the operation through d.Unit, then
// call d.Finish with its response (or d.Abandon, which is safe to defer:
// it does nothing after Finish). An error answers the request instead:
// ErrKeyMismatch (the key holds another request's outcome), ErrInFlight
// (a duplicate still runs: retry later), ErrOutcomeUnknown or
// ErrNotStored (a held operation's key), ErrUnavailable (the store
// failed: retrying with the same key is safe), ErrNoScope,
// ErrMalformedBody and the other malformed errors of the fingerprint
// (refused before any store is asked), or the context's error. Every
// outcome is reported to Config.Observer. For a held operation
// (OperationConfig.Held), Begin commits the hold before it decides to run, and
// Finish settles it.
func (o *Operation[U]) Begin(ctx context.Context, req Request) (*Decision[U], error) {
	d := &Decision[U]{req: req}
	if err := o.begin(ctx, d); err != nil {
		return nil, err
	}
	return d, nil
}

// begin is Begin into d, whose req the caller has set (and a checker, used
// unless req has a Check): the HTTP layer keeps d inside its own state, so
// that a request costs one allocation for both.
func (o *Operation[U]) begin(ctx context.Context, d *Decision[U]) error {
	if d.req.Check != nil {
		d.checker = checkFunc(d.req.Check)
	}
	d.op = o
	d.label = o.labelOf(d.req.Method, d.req.Route)
	switch {
	case d.req.Scope == "":
		return d.refuse(ErrNoScope)
	case len(d.req.Scope) > MaxScopeLength:
		// Refused before any store is asked: PostgreSQL's would fail the
		// claim (500, "retrying is safe") for a scope no retry can shorten.
		return d.refuse(fmt.Errorf("%w: the scope is %d bytes, over the %d a key's scope can be", ErrNoScope, len(d.req.Scope), MaxScopeLength))
	}
	query, err := parseQuery(d.req.Query)
	if err != nil {
		return d.refuse(err)
	}
	media, canonical, err := canonicalBody(d.req.ContentType, d.req.Body)
	if err != nil {
		return d.refuse(err)
	}
	d.query = query
	d.fp = fingerprintCanonical(d.req.Method, d.req.Route, d.req.Path, query, media, canonical)
	// The operation reads the body as it was sent: the canonical form is
	// the fingerprint's alone. Two requests with one fingerprint still mean
	// the same to every reader, because the fingerprint ignores only what
	// no parser reads (docs/protocol.md lists it).

	d.claimStart = time.Now()
	// Concurrent duplicates on this process queue here, one at a time to
	// the store, within the same wait budget.
	holds, queued, ok := o.e.inFlight.enter(ctx, d.req.Scope, d.req.Key, o.cfg.Wait)
	if !ok && ctx.Err() != nil {
		return d.fail(ctx, ctx.Err())
	}
	if !ok && d.follows && o.held != nil {
		// The request before it on this process still runs: if it stores
		// its body as it passes (a stream), the store says so, and this
		// one follows it.
		d.contended = true
		return d.claim(ctx)
	}
	if !ok {
		return d.answer(ctx, nil, ErrInFlight)
	}
	d.holds = holds
	// A request that queued behind a duplicate almost surely finds the key
	// taken: it claims in the way that answers from the record without
	// running the operation at all.
	d.contended = queued
	return d.claim(ctx)
}

// claim claims the key until the request may run (nil, d.lease set), is
// answered from a record (nil, d.Replay set) or refused.
func (d *Decision[U]) claim(ctx context.Context) error {
	o := d.op
	for {
		req := ClaimRequest{
			Scope: d.req.Scope, Key: d.req.Key, Fingerprint: d.fp,
			Method: d.req.Method, Route: d.req.Route, TTL: o.cfg.TTL,
			Wait:   max(o.cfg.Wait-time.Since(d.claimStart), minStoreWait),
			AtOnce: d.contended,
		}
		var lease Lease[U]
		var rec *Record
		var err error
		if o.held != nil {
			// An outcome this process has and its store has not taken
			// yet answers as the store would once it does.
			rec = o.e.settles.remembered(d.req.Scope, d.req.Key, o.held.RetryUnknown)
		}
		if rec == nil {
			lease, rec, err = o.store.Claim(ctx, req)
		}
		if lease != nil {
			var ran bool
			if ran, err = d.start(ctx, lease); ran {
				return err
			}
			// Declared only here: errors.As moves it to the heap.
			var taken *TakenError
			switch {
			case errors.As(err, &taken) && taken.Record == nil && !d.contended:
				// A concurrent first request got the key between the look
				// and the insert of a deferred claim: claim again, now,
				// which waits for its outcome.
				d.contended = true
				continue
			case errors.As(err, &taken):
				rec, err = taken.Record, nil
			default:
				rec = nil
			}
		}
		if rec != nil && d.matches(rec.Fingerprint) {
			if h, ok := o.heldAt(rec); ok {
				// A held operation runs, or ran, under the key elsewhere.
				ref := Ref{Scope: d.req.Scope, Key: d.req.Key, ClaimedAt: rec.CreatedAt}
				if h.State == HeldRunning && d.follows {
					// Its body is being stored: follow it.
					if head, err := o.store.ReadPiece(ctx, ref, 0); err == nil && head != nil {
						d.leave()
						d.follow, d.Ref = head, ref
						d.duplicate(OutcomeReplayed, time.Since(d.claimStart))
						return nil
					}
				}
				again, herr := o.meetHeld(ctx, h, ref, o.cfg.Wait-time.Since(d.claimStart))
				if again {
					// Claimed at once from now on: it reads the key's
					// record, where a deferred claim would try to insert.
					d.contended = true
					continue
				}
				rec, err = nil, herr
			}
		}
		return d.answer(ctx, rec, err)
	}
}

// start readies the run under lease: the request's check, then, for a
// held operation, the hold. ran reports that the request is decided (err
// nil: it runs; else refused); otherwise err is what the store's hold
// found holding the key (*TakenError, ErrInFlight), nothing written.
func (d *Decision[U]) start(ctx context.Context, lease Lease[U]) (ran bool, err error) {
	if d.checker != nil {
		if err := d.checker.check(); err != nil {
			d.rollback(ctx, lease)
			return true, d.refuse(err)
		}
	}
	if err := d.enterRepeats(); err != nil {
		d.rollback(ctx, lease)
		return true, d.refuse(err)
	}
	if d.op.held != nil {
		if err := d.hold(ctx, lease); err != nil {
			d.repeatDone(nil)
			var taken *TakenError
			if errors.As(err, &taken) || errors.Is(err, ErrInFlight) {
				return false, err
			}
			return true, err
		}
	}
	d.lease, d.Unit, d.Ref = lease, lease.Unit(), lease.Ref()
	return true, nil
}

// answer decides a request that does not run the operation: its key holds
// rec, or the claim failed with err.
func (d *Decision[U]) answer(ctx context.Context, rec *Record, err error) error {
	d.leave()
	waited := time.Since(d.claimStart)
	switch {
	case errors.Is(err, ErrInFlight):
		d.duplicate(OutcomeInFlight, waited)
		return ErrInFlight
	case errors.Is(err, ErrOutcomeUnknown):
		d.duplicate(OutcomeUnknown, waited)
		return err
	case errors.Is(err, ErrNotStored):
		d.duplicate(OutcomeNotStored, waited)
		return err
	case err != nil:
		return d.fail(ctx, fmt.Errorf("claim idempotency key: %w", err))
	case rec == nil:
		return d.fail(ctx, errors.New("claim returned neither a lease, a record nor an error"))
	case !d.matches(rec.Fingerprint):
		// A body the operation would refuse is refused alike whether or
		// not its key was used before.
		if d.checker != nil {
			if err := d.checker.check(); err != nil {
				return d.refuse(err)
			}
		}
		d.duplicate(OutcomeConflict, waited)
		return ErrKeyMismatch
	}
	d.Replay = &rec.Response
	if rec.Response.Pieces > 0 {
		// The replay reads the body's pieces under the claim that stored
		// them.
		d.Ref = Ref{Scope: d.req.Scope, Key: d.req.Key, ClaimedAt: rec.CreatedAt}
	}
	d.duplicate(OutcomeReplayed, waited)
	return nil
}

// matches reports whether stored, a record's fingerprint, is this
// request's: the fingerprint of the current rules, or, for a record
// stored before them (whose fingerprint has no marker), the request's
// fingerprint under the rules it was computed by. A record of the current
// rules is never compared with a legacy fingerprint, under which
// 123456789.123456789123 and 123456789.12345679 were one request.
func (d *Decision[U]) matches(stored Fingerprint) bool {
	if stored == d.fp {
		return true
	}
	if stored.current() {
		return false
	}
	if !d.legacyDone {
		d.legacyDone = true
		d.legacy, d.legacyOK = legacyFingerprint(d.req.Method, d.req.Route, d.req.Path, d.query, d.req.ContentType, d.req.Body)
	}
	return d.legacyOK && stored == d.legacy
}

// Finish ends the run with resp, the operation's response, and answers
// only once it is durable: a client never sees a success that a crash
// could still undo. A response that is the operation's outcome is stored
// under the key with the writes made through Unit, atomically (a held
// operation's record is settled with it), and replayed to every retry for
// the operation's TTL. One that is not (a server error, or a refusal
// before the operation could start: 400, 401, 403, 408, 413, 415, 429,
// 499) discards the writes and frees the key, so that a retry runs the
// operation again. Store resp's headers as a replay should carry them:
// Finish keeps what it is given. A held record (Held.Response) settles a
// held operation's key with that state.
//
// A nil error means: send resp. A store that defers its claim to this
// commit may find the key taken by a concurrent request after all; then
// nothing was written, and Finish sets d.Replay to the response to send
// instead, or returns the error that answers the request, as Begin would.
// Finish stores the outcome even if ctx is canceled (the client went
// away), within its deadline and ten seconds at most.
func (d *Decision[U]) Finish(ctx context.Context, resp Response) error {
	lease := d.lease
	if lease == nil {
		return errors.New("idempotency: Finish of a decision that is not running")
	}
	d.lease, d.Again = nil, false
	if d.op.held != nil {
		d.settleHeld(ctx, resp)
		d.leave()
		return nil
	}
	if !replayable(resp.Status) {
		// A server error or a rejection inside the operation: nothing is
		// stored, so a retry with the same key runs the operation again.
		d.repeatDone(nil)
		d.rollback(ctx, lease)
		d.leave()
		d.finished(resp.Status)
		return nil
	}
	// The operation ran; finish storing it even if the client went away, so
	// its retry replays instead of finding nothing.
	dctx := detach(ctx)
	err := lease.Commit(dctx, resp)
	dctx.cancel()
	if err == nil {
		d.repeatDone(&resp)
		d.leave()
		d.report(OutcomeExecuted)
		return nil
	}
	// A failed commit has rolled back.
	d.repeatDone(nil)
	var taken *TakenError
	switch {
	case errors.As(err, &taken) && taken.Record == nil && !d.contended:
		// The key's row was there as the deferred claim came to insert
		// it: a concurrent first request's, or an expired record's. Claim
		// at once, which waits for the first's outcome, or takes the
		// expired key for this request, to run again (Again).
		d.contended = true
		if err := d.claim(ctx); err != nil {
			return err
		}
		d.Again = d.lease != nil
		return nil
	case errors.As(err, &taken):
		return d.answer(ctx, taken.Record, nil)
	case errors.Is(err, ErrInFlight):
		return d.answer(ctx, nil, err)
	}
	d.leave()
	return d.fail(ctx, fmt.Errorf("commit idempotent operation: %w", err))
}

// Abandon ends a run without an outcome: the writes made through Unit are
// discarded and the key is free again, so that a retry runs the operation
// anew. It does nothing once the run has ended (after Finish), so that it
// can be deferred right after Begin, for panics and early returns. A held
// operation's key is released. It reports nothing: the caller knows why
// it gave up.
func (d *Decision[U]) Abandon(ctx context.Context) {
	lease := d.lease
	if lease == nil {
		return
	}
	d.lease = nil
	if d.op.held != nil {
		d.settleHeld(ctx, Response{Status: 500})
	} else {
		d.repeatDone(nil)
		d.rollback(ctx, lease)
	}
	d.leave()
}

// leave ends the request's hold of its key on this process, letting
// through whoever waits for it.
func (d *Decision[U]) leave() {
	if d.holds {
		d.holds = false
		d.op.e.inFlight.leave(d.req.Scope, d.req.Key)
	}
}

// rollback rolls lease back, even if the client went away.
func (d *Decision[U]) rollback(ctx context.Context, lease Lease[U]) {
	dctx := detach(ctx)
	defer dctx.cancel()
	if err := lease.Rollback(dctx); err != nil {
		d.op.e.cfg.Logger.ErrorContext(ctx, "idempotency: rollback failed", "err", err)
	}
}

// refuse reports a request refused before its operation ran (no key is
// consumed), and returns err, which answers it.
func (d *Decision[U]) refuse(err error) error {
	d.leave()
	d.report(OutcomeRejected)
	return err
}

// fail reports a store or wiring failure, and returns the error that
// answers it: ErrUnavailable, wrapping the cause, when retrying with the
// same key is safe and right (the store did not answer in time).
func (d *Decision[U]) fail(ctx context.Context, err error) error {
	d.leave()
	log := d.op.e.cfg.Logger
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		// The client went away; nothing ran to completion and nothing is
		// stored. Not a server error.
		log.InfoContext(ctx, "idempotency: client went away", "err", err)
		d.report(OutcomeRejected)
		return context.Canceled
	}
	if errors.Is(err, ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
		log.WarnContext(ctx, "idempotency: store unavailable", "err", err)
		if !errors.Is(err, ErrUnavailable) {
			err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
	} else {
		log.ErrorContext(ctx, "idempotency: store failed", "err", err)
	}
	d.report(OutcomeError)
	return err
}

// finished reports a run that ended with status, which is not stored: an
// error or a rejection.
func (d *Decision[U]) finished(status int) {
	if status >= 500 {
		d.report(OutcomeError)
		return
	}
	d.report(OutcomeRejected)
}

// report tells the observer what the protocol did with the request.
func (d *Decision[U]) report(o Outcome) {
	d.outcome = o
	d.op.e.report(d.label, o)
}

// duplicate reports the outcome of a request that did not run the
// operation, with the time its claim took.
func (d *Decision[U]) duplicate(o Outcome, waited time.Duration) {
	d.op.e.cfg.Observer.DuplicateWait(d.label, o, waited)
	d.report(o)
}

// replayable reports whether a response with this status is the
// operation's outcome, to be stored and replayed. Server errors are not (a
// retry must be able to run the operation), and neither are the statuses
// that mean the request was refused before the operation could start.
func replayable(status int) bool {
	switch status {
	case 400, 401, 403, 408, 413, 415, 429, 499: // 499: statusClientClosed
		return false
	}
	return status < 500
}
