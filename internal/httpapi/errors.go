package httpapi

import (
	"context"
	"errors"
	"log/slog"
	"net/http"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/ledger"
	"github.com/oncekey/oncekey/internal/orders"
	"github.com/oncekey/oncekey/internal/payments"
	"github.com/oncekey/oncekey/internal/problem"
)

// Errors of the HTTP layer itself.
var (
	errNoEndpoint           = errors.New("no such endpoint")
	errMethodNotAllowed     = errors.New("method not allowed")
	errUnauthorized         = errors.New("send an API key as 'Authorization: Bearer <key>'")
	errAuthUnavailable      = errors.New("the API key could not be checked")
	errBadRequest           = errors.New("the request is invalid")
	errUnsupportedMediaType = errors.New("send the body as the operation's media type: application/json (application/merge-patch+json for a PATCH)")
	// errNotReady makes /readyz answer 503.
	errNotReady = errors.New("not ready")
	// errNoAccount means a protected operation ran without an authenticated
	// caller: a wiring bug, answered with 500.
	errNoAccount = errors.New("operation reached without an authenticated account")
)

// problems is the one table that decides which problem, and so which
// status, an error is answered with: the front door's, the idempotency
// protocol's and the domain's errors alike. An error not in it is a 500.
// detail, where set, replaces the error's own message for the client.
var problems = []struct {
	err    error
	kind   problem.Kind
	detail string
}{
	{idempotency.ErrMissingKey, problem.MissingIdempotencyKey, ""},
	{idempotency.ErrInvalidKey, problem.InvalidIdempotencyKey, ""},
	{idempotency.ErrMalformedBody, problem.MalformedJSON, ""},
	{idempotency.ErrBodyTooLarge, problem.PayloadTooLarge, ""},
	{idempotency.ErrKeyMismatch, problem.KeyMismatch, ""},
	{idempotency.ErrInFlight, problem.InProgress, "the first request with this Idempotency-Key has not finished; retry with the same key after Retry-After seconds"},
	{errNoEndpoint, problem.NotFound, ""},
	{errMethodNotAllowed, problem.MethodNotAllowed, ""},
	{errUnauthorized, problem.Unauthorized, ""},
	{errBadRequest, problem.Validation, ""},
	{errUnsupportedMediaType, problem.UnsupportedMediaType, ""},
	{orders.ErrNotFound, problem.NotFound, ""},
	{orders.ErrUnknownCurrency, problem.UnknownCurrency, ""},
	{orders.ErrInvalidCursor, problem.Validation, ""},
	{orders.ErrNotModifiable, problem.OrderNotModifiable, ""},
	{orders.ErrNotCancellable, problem.OrderNotCancellable, ""},
	{payments.ErrNotFound, problem.NotFound, ""},
	{payments.ErrUnknownOrder, problem.UnknownOrder, ""},
	{payments.ErrOrderCancelled, problem.OrderCancelled, ""},
	{payments.ErrRefundNotFound, problem.NotFound, ""},
	{payments.ErrNotRefundable, problem.PaymentNotRefundable, ""},
	{payments.ErrRefundExceedsPayment, problem.RefundExceedsPayment, ""},
	{payments.ErrTooManyRefunds, problem.TooManyRefunds, ""},
	{ledger.ErrInsufficientFunds, problem.InsufficientFunds, ""},
	{ledger.ErrBalanceLimit, problem.BalanceLimitExceeded, ""},
	{errAuthUnavailable, problem.Unavailable, ""},
	{errNotReady, problem.Unavailable, ""},
	{idempotency.ErrUnavailable, problem.Unavailable, ""},
	{context.DeadlineExceeded, problem.Unavailable, ""},
}

// Details of server errors: retrying is safe, and internals stay in the log.
const (
	unavailableDetail = "a dependency is unavailable; retry later (with the same Idempotency-Key, if any)"
	internalDetail    = "the request could not be completed; if it carried an Idempotency-Key, retrying with the same key is safe"
)

// problemWriter writes every error response of the service as a problem,
// through the table: the front door's refusals, the protocol's answers
// (it is the engine's WriteError), handlers' errors and panics.
type problemWriter struct {
	log *slog.Logger
}

// write answers err.
func (p problemWriter) write(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		// The client went away (it timed out, say): whatever ran is rolled
		// back, and this is not a server error.
		p.log.InfoContext(r.Context(), "client went away", "err", err)
		problem.Write(w, problem.ClientClosedRequest, "the client closed the request")
		return
	}
	for _, row := range problems {
		if !errors.Is(err, row.err) {
			continue
		}
		detail := row.detail
		if detail == "" {
			detail = err.Error()
		}
		switch row.kind {
		case problem.Unavailable:
			p.log.WarnContext(r.Context(), "request failed", "err", err)
			detail = unavailableDetail
			w.Header().Set("Retry-After", "1")
		case problem.Unauthorized:
			w.Header().Set("WWW-Authenticate", `Bearer realm="oncekey"`)
		}
		problem.Write(w, row.kind, detail)
		return
	}
	p.log.ErrorContext(r.Context(), "request failed", "err", err)
	problem.Write(w, problem.Internal, internalDetail)
}

// request answers the generated code's parameter and body decoding errors.
// The front door has usually refused such requests already.
func (p problemWriter) request(w http.ResponseWriter, r *http.Request, err error) {
	p.write(w, r, &contractError{kind: errBadRequest, detail: err.Error()})
}
