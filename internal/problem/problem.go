// Package problem writes every error response of the service as an RFC 9457
// problem details document, so that clients can branch on a stable type URI
// instead of parsing messages.
package problem

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
)

// ContentType is the media type of every error body (RFC 9457 §3).
const ContentType = "application/problem+json"

// TypeBase prefixes every problem type URI. The URIs are identifiers, stable
// across releases; docs/problems.md describes each one.
const TypeBase = "https://oncekey.dev/problems/"

// Kind is one class of error with its status and stable type URI.
type Kind struct {
	// Slug is the last path segment of the type URI.
	Slug string
	// Status is the HTTP status code the kind is always sent with.
	Status int
	// Title is the short, human-readable summary that RFC 9457 says must not
	// change between occurrences of the same type.
	Title string
}

// The kinds of problem the service sends. Adding one is an API change: it
// belongs in openapi.yaml's description of the operation too.
var (
	Validation            = Kind{"validation-error", http.StatusBadRequest, "The request is invalid"}
	MalformedJSON         = Kind{"malformed-json", http.StatusBadRequest, "The request body is not valid JSON"}
	MissingIdempotencyKey = Kind{"missing-idempotency-key", http.StatusBadRequest, "Idempotency-Key header is required"}
	InvalidIdempotencyKey = Kind{"invalid-idempotency-key", http.StatusBadRequest, "Idempotency-Key header is invalid"}
	Unauthorized          = Kind{"unauthorized", http.StatusUnauthorized, "Missing or invalid API key"}
	NotFound              = Kind{"not-found", http.StatusNotFound, "Not found"}
	MethodNotAllowed      = Kind{"method-not-allowed", http.StatusMethodNotAllowed, "Method not allowed"}
	KeyMismatch           = Kind{"idempotency-key-mismatch", http.StatusConflict, "Idempotency-Key was used for a different request"}
	PayloadTooLarge       = Kind{"payload-too-large", http.StatusRequestEntityTooLarge, "Request body too large"}
	UnsupportedMediaType  = Kind{"unsupported-media-type", http.StatusUnsupportedMediaType, "Unsupported Content-Type"}
	UnknownCurrency       = Kind{"unknown-currency", http.StatusUnprocessableEntity, "Unknown currency"}
	UnknownOrder          = Kind{"unknown-order", http.StatusUnprocessableEntity, "No such order"}
	InsufficientFunds     = Kind{"insufficient-funds", http.StatusUnprocessableEntity, "Insufficient bonus balance"}
	BalanceLimitExceeded  = Kind{"balance-limit-exceeded", http.StatusUnprocessableEntity, "Bonus balance limit exceeded"}
	OrderNotModifiable    = Kind{"order-not-modifiable", http.StatusConflict, "The order cannot be changed"}
	OrderNotCancellable   = Kind{"order-not-cancellable", http.StatusConflict, "The order cannot be cancelled"}
	OrderCancelled        = Kind{"order-cancelled", http.StatusConflict, "The order is cancelled"}
	PaymentNotRefundable  = Kind{"payment-not-refundable", http.StatusConflict, "The payment cannot be refunded"}
	RefundExceedsPayment  = Kind{"refund-exceeds-payment", http.StatusUnprocessableEntity, "The refund exceeds what is left of the payment"}
	TooManyRefunds        = Kind{"too-many-refunds", http.StatusUnprocessableEntity, "The payment has all the refunds it can take"}
	InProgress            = Kind{"request-in-progress", http.StatusAccepted, "A request with this Idempotency-Key is still in progress"}
	Internal              = Kind{"internal-error", http.StatusInternalServerError, "Internal server error"}
	// ClientClosedRequest is written when the client went away before the
	// answer was ready (nginx's 499). Nobody reads it; the status keeps a
	// client's disconnect out of the server-error figures.
	ClientClosedRequest = Kind{"client-closed-request", 499, "Client closed request"}
	Unavailable         = Kind{"unavailable", http.StatusServiceUnavailable, "Service temporarily unavailable"}
)

// Kinds lists every kind, for documentation checks.
var Kinds = []Kind{
	Validation, MalformedJSON, MissingIdempotencyKey, InvalidIdempotencyKey,
	Unauthorized, NotFound, MethodNotAllowed, KeyMismatch, PayloadTooLarge,
	UnsupportedMediaType, UnknownCurrency, UnknownOrder, InsufficientFunds, BalanceLimitExceeded,
	OrderNotModifiable, OrderNotCancellable, OrderCancelled, PaymentNotRefundable, RefundExceedsPayment, TooManyRefunds,
	InProgress, Internal, Unavailable, ClientClosedRequest,
}

// Type returns the kind's full type URI.
func (k Kind) Type() string { return TypeBase + k.Slug }

// Details is the RFC 9457 document. It mirrors the Problem schema in
// openapi.yaml; it is declared here rather than taken from gen/api so that
// packages below the HTTP layer (the idempotency middleware) can write
// problems without importing generated server code.
type Details struct {
	Type     string `json:"type"`
	Title    string `json:"title"`
	Status   int    `json:"status"`
	Detail   string `json:"detail,omitempty"`
	Instance string `json:"instance,omitempty"`
}

// New builds the document for kind with a specific detail message.
func New(kind Kind, detail string) Details {
	return Details{Type: kind.Type(), Title: kind.Title, Status: kind.Status, Detail: detail}
}

// Write sends kind with detail. Headers already set on w (Retry-After,
// Idempotency-Key, WWW-Authenticate) are kept.
func Write(w http.ResponseWriter, kind Kind, detail string) {
	WriteDetails(w, New(kind, detail))
}

// WriteDetails sends d as the whole response.
func WriteDetails(w http.ResponseWriter, d Details) {
	body, err := marshal(d)
	if err != nil { // cannot happen: Details has only strings and an int
		body = []byte(`{"type":"` + Internal.Type() + `","title":"Internal server error","status":500}`)
	}
	h := w.Header()
	h.Set("Content-Type", ContentType)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(d.Status)
	_, _ = w.Write(body)
}

// marshal encodes v without escaping <, > and &: a detail such as
// "Bearer <key>" reads as written, and the body is never HTML.
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
