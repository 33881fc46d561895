package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/idempotency"
)

// maxBodyBytes bounds a charge or refund request; a real one is under 200
// bytes.
const maxBodyBytes = 64 << 10

// ReplayedHeader marks an answer that replays a stored charge or refund, as
// Stripe's Idempotent-Replayed does: the caller can tell a replay from a new
// one without comparing ids.
const ReplayedHeader = "Idempotent-Replayed"

// Server is the sandbox's HTTP API. It implements http.Handler.
type Server struct {
	store  Store
	faults Faults
	dice   *dice
	log    *slog.Logger
	mux    *http.ServeMux

	charges, refunds                         postCounters
	failFaults, timeoutFaults, declineFaults atomic.Int64

	// released is closed when the server shuts down (Listen's stop), so
	// that answers held by timeout faults are dropped at once instead of
	// holding up a graceful shutdown for TimeoutHold.
	released    chan struct{}
	releaseOnce sync.Once
}

// postCounters are one POST endpoint's counters in Stats: requests
// received, new objects stored and replays answered.
type postCounters struct {
	requests, stored, replays atomic.Int64
}

// NewServer returns the API over store with faults injected. logger may be
// nil (no logs). It panics if faults.Validate fails: FaultsFromEnv and the
// command's flags validate them, so a bad value here is a programming error.
func NewServer(store Store, faults Faults, logger *slog.Logger) *Server {
	if err := faults.Validate(); err != nil {
		panic("provider.NewServer: " + err.Error())
	}
	if faults.TimeoutHold == 0 {
		faults.TimeoutHold = DefaultTimeoutHold
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		store:    store,
		faults:   faults,
		dice:     newDice(faults.Seed),
		log:      logger,
		mux:      http.NewServeMux(),
		released: make(chan struct{}),
	}
	s.mux.HandleFunc("POST /v1/charges", s.createCharge)
	s.mux.HandleFunc("GET /v1/charges", s.getCharges)
	s.mux.HandleFunc("POST /v1/refunds", s.createRefund)
	s.mux.HandleFunc("GET /v1/refunds", s.getRefunds)
	s.mux.HandleFunc("GET /v1/stats", s.getStats)
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	// The patterns without a method catch the other methods, so that a 405
	// is a problem document like every other error (ServeMux's own is text).
	s.mux.HandleFunc("/v1/charges", methodNotAllowed("GET, HEAD, POST"))
	s.mux.HandleFunc("/v1/refunds", methodNotAllowed("GET, HEAD, POST"))
	s.mux.HandleFunc("/v1/stats", methodNotAllowed("GET, HEAD"))
	s.mux.HandleFunc("/healthz", methodNotAllowed("GET, HEAD"))
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, http.StatusNotFound, "not-found", "Not found", "no such endpoint: "+r.URL.Path)
	})
	return s
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Stats returns the counters since the server was made.
func (s *Server) Stats() Stats {
	return Stats{
		Requests:       s.charges.requests.Load(),
		Charges:        s.charges.stored.Load(),
		Replays:        s.charges.replays.Load(),
		RefundRequests: s.refunds.requests.Load(),
		Refunds:        s.refunds.stored.Load(),
		RefundReplays:  s.refunds.replays.Load(),
		Faults: FaultStats{
			Fail:    s.failFaults.Load(),
			Timeout: s.timeoutFaults.Load(),
			Decline: s.declineFaults.Load(),
		},
	}
}

// releaseHeld drops every answer a timeout fault is holding, now and later.
func (s *Server) releaseHeld() { s.releaseOnce.Do(func() { close(s.released) }) }

// createCharge is POST /v1/charges; servePost does the work.
func (s *Server) createCharge(w http.ResponseWriter, r *http.Request) {
	servePost(s, w, r, endpoint[ChargeRequest]{
		noun:     "charge",
		verb:     "charged",
		shape:    `{"amount": integer, "currency": string, "reference": string}`,
		mismatch: "this Idempotency-Key already charged a different amount, currency or reference",
		counts:   &s.charges,
		insert:   s.insertCharge,
	})
}

// insertCharge stores a new charge for req under key, unless key holds one.
func (s *Server) insertCharge(ctx context.Context, key, fp string, req ChargeRequest, declined bool) (stored, error) {
	rec := Record{Key: key, Fingerprint: fp, Charge: Charge{
		ID:        "ch_" + uuid.NewString(),
		Amount:    req.Amount,
		Currency:  req.Currency,
		Reference: req.Reference,
		CreatedAt: createdNow(),
	}}
	rec.Charge.Status, rec.Charge.DeclineReason = decide(declined, DeclineCardDeclined)
	got, inserted, err := s.store.Insert(ctx, rec)
	c := got.Charge
	return stored{inserted: inserted, fingerprint: got.Fingerprint, id: c.ID, object: c,
		logAttrs: []any{"id", c.ID, "status", c.Status, "reference", c.Reference}}, err
}

// createRefund is POST /v1/refunds; servePost does the work. Unlike a
// charge, a refund can be refused for what is stored (see refusals).
func (s *Server) createRefund(w http.ResponseWriter, r *http.Request) {
	servePost(s, w, r, endpoint[RefundRequest]{
		noun:     "refund",
		verb:     "refunded",
		shape:    `{"charge_id": string, "amount": integer, "reference": string}`,
		mismatch: "this Idempotency-Key already refunded a different charge, amount or reference",
		counts:   &s.refunds,
		insert:   s.insertRefund,
	})
}

// insertRefund stores a new refund for req under key, unless key holds one
// or the store refuses it.
func (s *Server) insertRefund(ctx context.Context, key, fp string, req RefundRequest, declined bool) (stored, error) {
	rec := RefundRecord{Key: key, Fingerprint: fp, Refund: Refund{
		ID:        "re_" + uuid.NewString(),
		ChargeID:  req.ChargeID,
		Amount:    req.Amount,
		Reference: req.Reference,
		CreatedAt: createdNow(),
	}}
	rec.Refund.Status, rec.Refund.DeclineReason = decide(declined, DeclineRefundDeclined)
	got, inserted, err := s.store.InsertRefund(ctx, rec)
	re := got.Refund
	return stored{inserted: inserted, fingerprint: got.Fingerprint, id: re.ID, object: re,
		logAttrs: []any{"id", re.ID, "status", re.Status, "charge_id", re.ChargeID, "reference", re.Reference}}, err
}

// decide is the status and decline reason of a new charge or refund.
func decide(declined bool, reason string) (status, declineReason string) {
	if declined {
		return StatusDeclined, reason
	}
	return StatusSucceeded, ""
}

// createdNow is a new object's CreatedAt: UTC, to PostgreSQL's microsecond.
func createdNow() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }

// request is what servePost needs of a request body.
type request interface {
	Validate() error
	Fingerprint() string
}

// endpoint is what sets one idempotent POST endpoint apart from the other;
// servePost does everything else, the same way for both, so that charges
// and refunds keep the same guarantees and the same faults.
type endpoint[Req request] struct {
	noun     string // "charge" or "refund", in logs and problem details
	verb     string // "charged" or "refunded": what a fail fault did not do
	shape    string // the JSON object wanted, for a malformed body's 400
	mismatch string // the detail of the 409 for a key reused with another body
	counts   *postCounters
	// insert stores a new object for req under key (fingerprint fp),
	// declined if the decline fault fired, unless key holds one already,
	// and returns what the key holds. Its error may be a refusal.
	insert func(ctx context.Context, key, fp string, req Req, declined bool) (stored, error)
}

// stored is what a key holds after an insert, in the terms servePost needs.
type stored struct {
	inserted    bool
	fingerprint string
	id          string
	object      any   // the Charge or Refund the answer carries
	logAttrs    []any // what the log says of a new one
}

// servePost is an idempotent POST. The order of steps is the contract:
// read the body, latency, validation (a malformed request is refused the
// same way however the faults are set), the fail fault (nothing stored),
// the atomic insert (which may refuse a refund), then the timeout fault
// (already stored).
func servePost[Req request](s *Server, w http.ResponseWriter, r *http.Request, ep endpoint[Req]) {
	ep.counts.requests.Add(1)
	ctx := r.Context()
	// Reading the body to its end first is what lets net/http notice a
	// client hanging up (it cancels ctx then); before that, a sleeping or
	// holding handler would outlive its client.
	body, readErr := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if s.faults.Latency > 0 && !sleep(ctx, s.faults.Latency) {
		// The client left (or the server is closing) while we slept. Any
		// answer now would go nowhere, and returning without one would make
		// net/http send an empty 200; drop the connection instead.
		panic(http.ErrAbortHandler)
	}

	keys := r.Header.Values("Idempotency-Key")
	if len(keys) > 1 {
		writeProtocolProblem(w, idempotency.ProblemOf(idempotency.ErrInvalidKey), "send exactly one Idempotency-Key header")
		return
	}
	key := r.Header.Get("Idempotency-Key")
	if err := ValidateKey(key); err != nil {
		writeProtocolProblem(w, idempotency.ProblemOf(idempotency.ErrInvalidKey), err.Error())
		return
	}
	req, ok := parseRequest[Req](w, body, readErr, ep.shape)
	if !ok {
		return
	}

	if s.dice.roll(s.faults.FailRate) {
		s.failFaults.Add(1)
		s.log.InfoContext(ctx, "fault: fail", "kind", ep.noun, "idempotency_key", key)
		writeProblem(w, http.StatusInternalServerError, "injected-failure", "Internal server error", "injected fault: nothing was "+ep.verb)
		return
	}

	// Rolled before the insert, as a real processor decides before it
	// records; counted only if this request's object is the one stored.
	declined := s.dice.roll(s.faults.DeclineRate)
	fp := req.Fingerprint()
	got, err := ep.insert(ctx, key, fp, req, declined)
	if err != nil {
		if writeRefusal(w, err) {
			s.log.InfoContext(ctx, "refused", "kind", ep.noun, "idempotency_key", key, "reason", err.Error())
			return
		}
		s.log.ErrorContext(ctx, "store "+ep.noun, "idempotency_key", key, "error", err)
		writeProtocolProblem(w, problemInternal, "the "+ep.noun+" could not be stored")
		return
	}
	if !got.inserted && got.fingerprint != fp {
		writeProtocolProblem(w, idempotency.ProblemOf(idempotency.ErrKeyMismatch), ep.mismatch)
		return
	}
	status := http.StatusOK
	if got.inserted {
		status = http.StatusCreated
		ep.counts.stored.Add(1)
		if declined {
			s.declineFaults.Add(1)
		}
		s.log.InfoContext(ctx, ep.noun, append([]any{"idempotency_key", key}, got.logAttrs...)...)
	} else {
		ep.counts.replays.Add(1)
		s.log.InfoContext(ctx, "replay", "kind", ep.noun, "idempotency_key", key, "id", got.id)
	}

	if s.dice.roll(s.faults.TimeoutRate) {
		s.timeoutFaults.Add(1)
		s.log.InfoContext(ctx, "fault: timeout", "kind", ep.noun, "idempotency_key", key, "id", got.id)
		s.holdThenAbort(ctx)
	}
	if !got.inserted {
		w.Header().Set(ReplayedHeader, "true")
	}
	writeJSON(w, status, got.object)
}

// holdThenAbort withholds the answer until the client gives up, the hold
// passes or the server shuts down, then drops the connection without a
// response: to the client it is indistinguishable from a hung provider.
func (s *Server) holdThenAbort(ctx context.Context) {
	t := time.NewTimer(s.faults.TimeoutHold)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	case <-s.released:
	}
	panic(http.ErrAbortHandler)
}

// parseRequest decodes and validates the body read (or readErr) as a Req
// whose JSON is shape, answering 400 or 413 itself when it cannot.
func parseRequest[Req request](w http.ResponseWriter, body []byte, readErr error, shape string) (Req, bool) {
	var req Req
	if readErr != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(readErr, &tooLarge) {
			writeProtocolProblem(w, idempotency.ProblemOf(idempotency.ErrBodyTooLarge),
				fmt.Sprintf("the body must be at most %d bytes", maxBodyBytes))
		} else {
			writeProtocolProblem(w, idempotency.ProblemOf(idempotency.ErrMalformedBody), "the body could not be read")
		}
		return req, false
	}
	if err := decodeStrict(body, &req, shape); err != nil {
		writeProtocolProblem(w, idempotency.ProblemOf(idempotency.ErrMalformedBody), err.Error())
		return req, false
	}
	if err := req.Validate(); err != nil {
		writeProblem(w, http.StatusBadRequest, "validation-error", "The request is invalid", err.Error())
		return req, false
	}
	return req, true
}

// decodeStrict refuses unknown fields and trailing data: a test double that
// ignored a misspelt "ammount" would let a caller's bug through to
// production. shape, the object wanted, goes into the error.
func decodeStrict(body []byte, v any, shape string) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("want %s: %w", shape, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("unexpected data after the JSON object")
	}
	return nil
}

// getCharges is GET /v1/charges?idempotency_key=K (one charge, for
// reconciling after a lost answer) or ?reference=R (all charges of one
// payment, for tests counting charges); serveGet does the work.
func (s *Server) getCharges(w http.ResponseWriter, r *http.Request) {
	serveGet(s, w, r, "charge", "charges",
		func(ctx context.Context, key string) (any, error) {
			rec, err := s.store.Get(ctx, key)
			return rec.Charge, err
		},
		func(ctx context.Context, ref string) (any, error) {
			list, err := s.store.ListByReference(ctx, ref)
			return chargeList{Charges: list}, err
		})
}

// getRefunds is GET /v1/refunds?idempotency_key=K or ?reference=R, as
// getCharges is for charges.
func (s *Server) getRefunds(w http.ResponseWriter, r *http.Request) {
	serveGet(s, w, r, "refund", "refunds",
		func(ctx context.Context, key string) (any, error) {
			rec, err := s.store.GetRefund(ctx, key)
			return rec.Refund, err
		},
		func(ctx context.Context, ref string) (any, error) {
			list, err := s.store.ListRefundsByReference(ctx, ref)
			return refundList{Refunds: list}, err
		})
}

// serveGet answers ?idempotency_key=K with get (404 on ErrNotFound) or
// ?reference=R with list; exactly one of the two is accepted. noun and
// plural name what is read, in problem details and logs.
func serveGet(s *Server, w http.ResponseWriter, r *http.Request, noun, plural string,
	get func(ctx context.Context, key string) (any, error),
	list func(ctx context.Context, reference string) (any, error),
) {
	ctx := r.Context()
	q := r.URL.Query()
	hasKey, hasRef := q.Has("idempotency_key"), q.Has("reference")
	if hasKey == hasRef {
		writeProblem(w, http.StatusBadRequest, "validation-error", "The request is invalid", "give exactly one of idempotency_key and reference")
		return
	}
	if hasKey {
		key := q.Get("idempotency_key")
		if err := ValidateKey(key); err != nil {
			writeProtocolProblem(w, idempotency.ProblemOf(idempotency.ErrInvalidKey), err.Error())
			return
		}
		v, err := get(ctx, key)
		if errors.Is(err, ErrNotFound) {
			writeProblem(w, http.StatusNotFound, "not-found", "Not found", "no "+noun+" under this idempotency key")
			return
		}
		if err != nil {
			s.log.ErrorContext(ctx, "get "+noun, "idempotency_key", key, "error", err)
			writeProtocolProblem(w, problemInternal, "the "+noun+" could not be read")
			return
		}
		writeJSON(w, http.StatusOK, v)
		return
	}
	ref := q.Get("reference")
	if ref == "" {
		writeProblem(w, http.StatusBadRequest, "validation-error", "The request is invalid", "reference must not be empty")
		return
	}
	v, err := list(ctx, ref)
	if err != nil {
		s.log.ErrorContext(ctx, "list "+plural, "reference", ref, "error", err)
		writeProtocolProblem(w, problemInternal, "the "+plural+" could not be read")
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// chargeList is the body of GET /v1/charges?reference=R.
type chargeList struct {
	Charges []Charge `json:"charges"`
}

// refundList is the body of GET /v1/refunds?reference=R.
type refundList struct {
	Refunds []Refund `json:"refunds"`
}

func (s *Server) getStats(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.Stats())
}

// sleep waits d, or less if ctx ends first; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
