package idempotency

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
)

// StatusClientClosedRequest is what a request whose client went away before
// its answer was ready is logged with (nginx's 499). Nobody reads it; the
// status keeps a client's disconnect out of the server-error figures.
const StatusClientClosedRequest = 499

// Problem is how the default error writer describes one of the protocol's
// errors: its status and an RFC 9457 type slug and title.
type Problem struct {
	Status int
	Slug   string
	Title  string
}

// The protocol's problems, one for each error the engine answers: status,
// RFC 9457 type slug and title, declared once here for the default writer,
// for an application's own writer, and for any API that speaks the same
// protocol.
var (
	ProblemMissingKey           = Problem{http.StatusBadRequest, "missing-idempotency-key", "Idempotency-Key header is required"}
	ProblemInvalidKey           = Problem{http.StatusBadRequest, "invalid-idempotency-key", "Idempotency-Key header is invalid"}
	ProblemMalformedBody        = Problem{http.StatusBadRequest, "malformed-json", "The request body is not valid JSON"}
	ProblemMalformedForm        = Problem{http.StatusBadRequest, "malformed-form", "The request body is not a valid form"}
	ProblemMalformedContentType = Problem{http.StatusBadRequest, "malformed-content-type", "The Content-Type header is not a valid media type"}
	ProblemMalformedQuery       = Problem{http.StatusBadRequest, "malformed-query", "The query string is not valid"}
	ProblemBodyTooLarge         = Problem{http.StatusRequestEntityTooLarge, "payload-too-large", "Request body too large"}
	ProblemNoScope              = Problem{http.StatusUnauthorized, "unauthorized", "Missing or invalid credentials"}
	ProblemKeyMismatch          = Problem{http.StatusConflict, "idempotency-key-mismatch", "Idempotency-Key was used for a different request"}
	ProblemInFlight             = Problem{http.StatusAccepted, "request-in-progress", "A request with this Idempotency-Key is still in progress"}
	ProblemOutcomeUnknown       = Problem{http.StatusConflict, "outcome-unknown", "The outcome of the request with this Idempotency-Key is unknown"}
	ProblemNotStored            = Problem{http.StatusConflict, "response-not-stored", "The response to the request with this Idempotency-Key was not stored"}
	ProblemUnavailable          = Problem{http.StatusServiceUnavailable, "unavailable", "Service temporarily unavailable"}
	ProblemClientClosed         = Problem{StatusClientClosedRequest, "client-closed-request", "Client closed request"}
	ProblemInternal             = Problem{http.StatusInternalServerError, "internal-error", "Internal server error"}
)

// problems describe the protocol's errors, in the order Describe looks for
// them.
var problems = []struct {
	Err     error
	Problem Problem
}{
	{ErrMissingKey, ProblemMissingKey},
	{ErrInvalidKey, ProblemInvalidKey},
	{ErrMalformedBody, ProblemMalformedBody},
	{ErrMalformedForm, ProblemMalformedForm},
	{ErrMalformedContentType, ProblemMalformedContentType},
	{ErrMalformedQuery, ProblemMalformedQuery},
	{ErrBodyTooLarge, ProblemBodyTooLarge},
	{ErrNoScope, ProblemNoScope},
	{ErrKeyMismatch, ProblemKeyMismatch},
	{ErrInFlight, ProblemInFlight},
	{ErrOutcomeUnknown, ProblemOutcomeUnknown},
	{ErrNotStored, ProblemNotStored},
	{ErrUnavailable, ProblemUnavailable},
	{context.Canceled, ProblemClientClosed},
}

// Describe returns how the default writer answers err, and whether err is
// one of the protocol's errors (otherwise it is a 500), for writers of
// their own that keep its statuses.
func Describe(err error) (Problem, bool) {
	for _, p := range problems {
		if errors.Is(err, p.Err) {
			return p.Problem, true
		}
	}
	return ProblemInternal, false
}

// ProblemWriter returns a Config.WriteError that answers with RFC 9457
// problem+json documents whose type is typeBase followed by the problem's
// slug ("about:blank" when typeBase is empty). Client errors carry err's
// message as their detail; server errors carry a fixed one, so that no
// internal detail leaks.
func ProblemWriter(typeBase string) func(w http.ResponseWriter, r *http.Request, err error) {
	return func(w http.ResponseWriter, _ *http.Request, err error) {
		p, _ := Describe(err)
		detail := Detail(err)
		typ := "about:blank"
		if typeBase != "" {
			typ = typeBase + p.Slug
		}
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false) // a detail reads as written; the body is never HTML
		_ = enc.Encode(struct {
			Type   string `json:"type"`
			Title  string `json:"title"`
			Status int    `json:"status"`
			Detail string `json:"detail,omitempty"`
		}{typ, p.Title, p.Status, detail})
		body := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
		h := w.Header()
		h.Set("Content-Type", "application/problem+json")
		h.Set("Content-Length", strconv.Itoa(len(body)))
		h.Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(p.Status)
		_, _ = w.Write(body)
	}
}

// Detail is the detail the default writer gives err: its message for a
// client error, and a fixed sentence for a duplicate in flight, an
// outcome unknown, a client gone and a server error, so that no internal
// detail leaks (an unknown outcome's cause names the upstream's address).
// For writers of their own in another shape.
func Detail(err error) string {
	switch p, _ := Describe(err); {
	case errors.Is(err, ErrInFlight):
		return "the first request with this Idempotency-Key has not finished; retry with the same key after Retry-After seconds"
	case errors.Is(err, ErrOutcomeUnknown):
		return ErrOutcomeUnknown.Error()
	case p.Status == StatusClientClosedRequest:
		return "the client closed the request"
	case p.Status >= 500:
		return "the request could not be completed; retrying with the same Idempotency-Key is safe"
	}
	return err.Error()
}
