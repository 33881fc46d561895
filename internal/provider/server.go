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
)

// maxBodyBytes bounds a charge request; a real one is under 200 bytes.
const maxBodyBytes = 64 << 10

// ReplayedHeader marks an answer that replays a stored charge, as Stripe's
// Idempotent-Replayed does: the caller can tell a replay from a new charge
// without comparing ids.
const ReplayedHeader = "Idempotent-Replayed"

// Server is the sandbox's HTTP API. It implements http.Handler.
type Server struct {
	store  Store
	faults Faults
	dice   *dice
	log    *slog.Logger
	mux    *http.ServeMux

	requests, charges, replays               atomic.Int64
	failFaults, timeoutFaults, declineFaults atomic.Int64

	// released is closed when the server shuts down (Listen's stop), so
	// that answers held by timeout faults are dropped at once instead of
	// holding up a graceful shutdown for TimeoutHold.
	released    chan struct{}
	releaseOnce sync.Once
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
	s.mux.HandleFunc("GET /v1/stats", s.getStats)
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	// The patterns without a method catch the other methods, so that a 405
	// is a problem document like every other error (ServeMux's own is text).
	s.mux.HandleFunc("/v1/charges", methodNotAllowed("GET, HEAD, POST"))
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
		Requests: s.requests.Load(),
		Charges:  s.charges.Load(),
		Replays:  s.replays.Load(),
		Faults: FaultStats{
			Fail:    s.failFaults.Load(),
			Timeout: s.timeoutFaults.Load(),
			Decline: s.declineFaults.Load(),
		},
	}
}

// releaseHeld drops every answer a timeout fault is holding, now and later.
func (s *Server) releaseHeld() { s.releaseOnce.Do(func() { close(s.released) }) }

// createCharge is POST /v1/charges. The order of steps is the contract:
// read the body, latency, validation (a malformed request is refused the
// same way however the faults are set), the fail fault (nothing charged),
// the atomic insert, then the timeout fault (already charged).
func (s *Server) createCharge(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
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
		writeProblem(w, http.StatusBadRequest, "invalid-idempotency-key", "Idempotency-Key header is invalid", "send exactly one Idempotency-Key header")
		return
	}
	key := r.Header.Get("Idempotency-Key")
	if err := ValidateKey(key); err != nil {
		writeProblem(w, http.StatusBadRequest, "invalid-idempotency-key", "Idempotency-Key header is invalid", err.Error())
		return
	}
	req, ok := parseChargeRequest(w, body, readErr)
	if !ok {
		return
	}

	if s.dice.roll(s.faults.FailRate) {
		s.failFaults.Add(1)
		s.log.InfoContext(ctx, "fault: fail", "idempotency_key", key)
		writeProblem(w, http.StatusInternalServerError, "injected-failure", "Internal server error", "injected fault: nothing was charged")
		return
	}

	candidate := Record{Key: key, Fingerprint: req.Fingerprint(), Charge: Charge{
		ID:        "ch_" + uuid.NewString(),
		Status:    StatusSucceeded,
		Amount:    req.Amount,
		Currency:  req.Currency,
		Reference: req.Reference,
		CreatedAt: time.Now().UTC().Truncate(time.Microsecond),
	}}
	// Rolled before the insert, as a real processor decides before it
	// records; counted only if this request's charge is the one stored.
	declined := s.dice.roll(s.faults.DeclineRate)
	if declined {
		candidate.Charge.Status = StatusDeclined
		candidate.Charge.DeclineReason = DeclineCardDeclined
	}
	stored, inserted, err := s.store.Insert(ctx, candidate)
	if err != nil {
		s.log.ErrorContext(ctx, "store charge", "idempotency_key", key, "error", err)
		writeProblem(w, http.StatusInternalServerError, "internal-error", "Internal server error", "the charge could not be stored")
		return
	}
	if !inserted && stored.Fingerprint != candidate.Fingerprint {
		writeProblem(w, http.StatusConflict, "idempotency-key-mismatch", "Idempotency-Key was used for a different request",
			"this Idempotency-Key already charged a different amount, currency or reference")
		return
	}
	status := http.StatusOK
	if inserted {
		status = http.StatusCreated
		s.charges.Add(1)
		if declined {
			s.declineFaults.Add(1)
		}
		s.log.InfoContext(ctx, "charge", "idempotency_key", key, "id", stored.Charge.ID, "status", stored.Charge.Status, "reference", stored.Charge.Reference)
	} else {
		s.replays.Add(1)
		s.log.InfoContext(ctx, "replay", "idempotency_key", key, "id", stored.Charge.ID)
	}

	if s.dice.roll(s.faults.TimeoutRate) {
		s.timeoutFaults.Add(1)
		s.log.InfoContext(ctx, "fault: timeout", "idempotency_key", key, "id", stored.Charge.ID)
		s.holdThenAbort(ctx)
	}
	if !inserted {
		w.Header().Set(ReplayedHeader, "true")
	}
	writeJSON(w, status, stored.Charge)
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

// parseChargeRequest decodes and validates the body read (or readErr),
// answering 400 or 413 itself when it cannot.
func parseChargeRequest(w http.ResponseWriter, body []byte, readErr error) (ChargeRequest, bool) {
	if readErr != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(readErr, &tooLarge) {
			writeProblem(w, http.StatusRequestEntityTooLarge, "payload-too-large", "Request body too large",
				fmt.Sprintf("the body must be at most %d bytes", maxBodyBytes))
		} else {
			writeProblem(w, http.StatusBadRequest, "malformed-json", "The request body is not valid JSON", "the body could not be read")
		}
		return ChargeRequest{}, false
	}
	var req ChargeRequest
	if err := decodeStrict(body, &req); err != nil {
		writeProblem(w, http.StatusBadRequest, "malformed-json", "The request body is not valid JSON", err.Error())
		return ChargeRequest{}, false
	}
	if err := req.Validate(); err != nil {
		writeProblem(w, http.StatusBadRequest, "validation-error", "The request is invalid", err.Error())
		return ChargeRequest{}, false
	}
	return req, true
}

// decodeStrict refuses unknown fields and trailing data: a test double that
// ignored a misspelt "ammount" would let a caller's bug through to
// production.
func decodeStrict(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("want {\"amount\": integer, \"currency\": string, \"reference\": string}: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("unexpected data after the JSON object")
	}
	return nil
}

// getCharges is GET /v1/charges?idempotency_key=K (one charge, for
// reconciling after a lost answer) or ?reference=R (all charges of one
// payment, for tests counting charges). Exactly one of the two is accepted.
func (s *Server) getCharges(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	hasKey, hasRef := q.Has("idempotency_key"), q.Has("reference")
	if hasKey == hasRef {
		writeProblem(w, http.StatusBadRequest, "validation-error", "The request is invalid", "give exactly one of idempotency_key and reference")
		return
	}
	if hasKey {
		key := q.Get("idempotency_key")
		if err := ValidateKey(key); err != nil {
			writeProblem(w, http.StatusBadRequest, "invalid-idempotency-key", "Idempotency-Key header is invalid", err.Error())
			return
		}
		rec, err := s.store.Get(r.Context(), key)
		if errors.Is(err, ErrNotFound) {
			writeProblem(w, http.StatusNotFound, "not-found", "Not found", "no charge under this idempotency key")
			return
		}
		if err != nil {
			s.log.ErrorContext(r.Context(), "get charge", "idempotency_key", key, "error", err)
			writeProblem(w, http.StatusInternalServerError, "internal-error", "Internal server error", "the charge could not be read")
			return
		}
		writeJSON(w, http.StatusOK, rec.Charge)
		return
	}
	ref := q.Get("reference")
	if ref == "" {
		writeProblem(w, http.StatusBadRequest, "validation-error", "The request is invalid", "reference must not be empty")
		return
	}
	list, err := s.store.ListByReference(r.Context(), ref)
	if err != nil {
		s.log.ErrorContext(r.Context(), "list charges", "reference", ref, "error", err)
		writeProblem(w, http.StatusInternalServerError, "internal-error", "Internal server error", "the charges could not be read")
		return
	}
	writeJSON(w, http.StatusOK, chargeList{Charges: list})
}

// chargeList is the body of GET /v1/charges?reference=R.
type chargeList struct {
	Charges []Charge `json:"charges"`
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
