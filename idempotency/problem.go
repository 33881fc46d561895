package idempotency

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
)

// statusClientClosed is what a request whose client went away before its
// answer was ready is logged with (nginx's 499). Nobody reads it; the
// status keeps a client's disconnect out of the server-error figures.
const statusClientClosed = 499

// Problem is how the default error writer answers one of the protocol's
// errors: its status, an RFC 9457 type slug and title, which stay the same
// for every error of its kind, and the detail of this one error.
type Problem struct {
	Status int
	Slug   string
	Title  string
	// Detail is err's message for a client error, and a fixed sentence
	// for a duplicate in flight, an outcome unknown, a client gone and a
	// server error, so that no internal detail leaks (an unknown
	// outcome's cause names the upstream's address).
	Detail string
}

// problemInternal answers every error that is none of the protocol's.
var problemInternal = Problem{Status: http.StatusInternalServerError, Slug: "internal-error", Title: "Internal server error"}

// problems is the protocol's one table of errors and their problems:
// status, RFC 9457 type slug and title, declared here once for the default
// writer, for an application's own writer, and for any API that speaks the
// same protocol (through ProblemOf). describe looks for an error in this
// order; every other error is problemInternal.
var problems = []struct {
	err     error
	problem Problem
}{
	{ErrMissingKey, Problem{Status: http.StatusBadRequest, Slug: "missing-idempotency-key", Title: "Idempotency-Key header is required"}},
	{ErrInvalidKey, Problem{Status: http.StatusBadRequest, Slug: "invalid-idempotency-key", Title: "Idempotency-Key header is invalid"}},
	{ErrMalformedBody, Problem{Status: http.StatusBadRequest, Slug: "malformed-json", Title: "The request body is not valid JSON"}},
	{errMalformedForm, Problem{Status: http.StatusBadRequest, Slug: "malformed-form", Title: "The request body is not a valid form"}},
	{errMalformedContentType, Problem{Status: http.StatusBadRequest, Slug: "malformed-content-type", Title: "The Content-Type header is not a valid media type"}},
	{ErrMalformedQuery, Problem{Status: http.StatusBadRequest, Slug: "malformed-query", Title: "The query string is not valid"}},
	{ErrBodyTooLarge, Problem{Status: http.StatusRequestEntityTooLarge, Slug: "payload-too-large", Title: "Request body too large"}},
	{ErrNoScope, Problem{Status: http.StatusUnauthorized, Slug: "unauthorized", Title: "Missing or invalid credentials"}},
	{ErrKeyMismatch, Problem{Status: http.StatusConflict, Slug: "idempotency-key-mismatch", Title: "Idempotency-Key was used for a different request"}},
	{ErrInFlight, Problem{Status: http.StatusAccepted, Slug: "request-in-progress", Title: "A request with this Idempotency-Key is still in progress"}},
	{errRepeated, Problem{Status: http.StatusConflict, Slug: "repeated-request", Title: "An identical request was made under another Idempotency-Key"}},
	{errInvalidRepeat, Problem{Status: http.StatusBadRequest, Slug: "invalid-idempotency-repeat", Title: "Idempotency-Repeat header is invalid"}},
	{ErrOutcomeUnknown, Problem{Status: http.StatusConflict, Slug: "outcome-unknown", Title: "The outcome of the request with this Idempotency-Key is unknown"}},
	{ErrNotStored, Problem{Status: http.StatusConflict, Slug: "response-not-stored", Title: "The response to the request with this Idempotency-Key was not stored"}},
	{ErrUnavailable, Problem{Status: http.StatusServiceUnavailable, Slug: "unavailable", Title: "Service temporarily unavailable"}},
	{context.Canceled, Problem{Status: statusClientClosed, Slug: "client-closed-request", Title: "Client closed request"}},
}

// ProblemOf is how the default writer answers err, with its detail: for
// writers of an application's own, in another shape or with statuses of
// their own, and for APIs that speak the protocol without the engine, so
// that all of them answer alike. An error that is none of the protocol's
// (an operation's failure, a store's) is a 500, internal-error, whose
// detail says only that retrying with the same key is safe.
func ProblemOf(err error) Problem {
	p, _ := describe(err)
	switch {
	case errors.Is(err, ErrInFlight):
		p.Detail = "the first request with this Idempotency-Key has not finished; retry with the same key after Retry-After seconds"
	case errors.Is(err, ErrOutcomeUnknown):
		p.Detail = ErrOutcomeUnknown.Error()
	case p.Status == statusClientClosed:
		p.Detail = "the client closed the request"
	case p.Status >= 500:
		p.Detail = "the request could not be completed; retrying with the same Idempotency-Key is safe"
	default:
		p.Detail = err.Error()
	}
	return p
}

// describe is err's problem, without its detail, and whether err is one of
// the protocol's errors (otherwise it is problemInternal).
func describe(err error) (Problem, bool) {
	for _, p := range problems {
		if errors.Is(err, p.err) {
			return p.problem, true
		}
	}
	return problemInternal, false
}

// ProblemWriter returns a Config.WriteError that answers with RFC 9457
// problem+json documents whose type is typeBase followed by the problem's
// slug ("about:blank" when typeBase is empty), with ProblemOf's status,
// title and detail.
func ProblemWriter(typeBase string) func(w http.ResponseWriter, r *http.Request, err error) {
	return func(w http.ResponseWriter, _ *http.Request, err error) {
		p := ProblemOf(err)
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
		}{typ, p.Title, p.Status, p.Detail})
		body := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
		h := w.Header()
		h.Set("Content-Type", "application/problem+json")
		h.Set("Content-Length", strconv.Itoa(len(body)))
		h.Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(p.Status)
		_, _ = w.Write(body)
	}
}
