package httpapi

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/ledger"
	"github.com/oncekey/oncekey/internal/service/orders"
	"github.com/oncekey/oncekey/internal/service/payments"
	"github.com/oncekey/oncekey/internal/service/store"
	"github.com/oncekey/oncekey/internal/wire/problem"
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
// An operation's business outcomes declare their kind right here, next to
// their error; docs/problems.md is generated from the table.
// detail, where set, replaces the error's own message for the client.
var problems = []struct {
	err    error
	kind   problem.Kind
	detail string
}{
	{err: idempotency.ErrMissingKey, kind: problem.MissingIdempotencyKey},
	{err: idempotency.ErrInvalidKey, kind: problem.InvalidIdempotencyKey},
	{err: idempotency.ErrMalformedBody, kind: problem.MalformedJSON},
	{err: idempotency.ErrMalformedQuery, kind: problem.MalformedQuery},
	{err: idempotency.ErrBodyTooLarge, kind: problem.PayloadTooLarge},
	{err: idempotency.ErrKeyMismatch, kind: problem.KeyMismatch},
	{err: idempotency.ErrInFlight, kind: problem.InProgress, detail: "the first request with this Idempotency-Key has not finished; retry with the same key after Retry-After seconds"},
	{err: errNoEndpoint, kind: problem.NotFound},
	{err: errMethodNotAllowed, kind: problem.MethodNotAllowed},
	{err: errUnauthorized, kind: problem.Unauthorized},
	{err: errBadRequest, kind: problem.Validation},
	{err: errUnsupportedMediaType, kind: problem.UnsupportedMediaType},
	{err: orders.ErrNotFound, kind: problem.NotFound},
	{err: orders.ErrInvalidCursor, kind: problem.Validation},
	{err: payments.ErrNotFound, kind: problem.NotFound},
	{err: payments.ErrRefundNotFound, kind: problem.NotFound},
	{err: errAuthUnavailable, kind: problem.Unavailable},
	{err: errNotReady, kind: problem.Unavailable},
	{err: idempotency.ErrUnavailable, kind: problem.Unavailable},
	{err: context.DeadlineExceeded, kind: problem.Unavailable},

	{err: orders.ErrUnknownCurrency, kind: business("unknown-currency", http.StatusUnprocessableEntity, "Unknown currency",
		"The currency is well-formed but not an ISO 4217 code.")},
	{err: orders.ErrNotModifiable, kind: business("order-not-modifiable", http.StatusConflict, "The order cannot be changed",
		"`PATCH /orders/{id}` of an order that is cancelled or has a pending or succeeded payment.")},
	{err: orders.ErrNotCancellable, kind: business("order-not-cancellable", http.StatusConflict, "The order cannot be cancelled",
		"`DELETE /orders/{id}` of an order with a pending or succeeded payment.")},
	{err: payments.ErrUnknownOrder, kind: business("unknown-order", http.StatusUnprocessableEntity, "No such order",
		"`POST /payments` names an order that does not exist in the caller's account. Nothing is charged.")},
	{err: payments.ErrOrderCancelled, kind: business("order-cancelled", http.StatusConflict, "The order is cancelled",
		"`POST /payments` of a cancelled order. Nothing is charged.")},
	{err: payments.ErrPaymentInProgress, kind: business("payment-in-progress", http.StatusConflict, "The order has a payment in progress",
		"`POST /payments` of an order with a pending payment, accepted under another key: poll that payment (the detail names it). Nothing is charged; a client that lost its key cannot pay twice.")},
	{err: payments.ErrOrderAlreadyPaid, kind: business("order-already-paid", http.StatusConflict, "The order is paid",
		"`POST /payments` of an order with a succeeded payment (the detail names it). Nothing is charged.")},
	{err: payments.ErrAmountMismatch, kind: business("payment-amount-mismatch", http.StatusUnprocessableEntity, "The payment does not match the order",
		"`POST /payments` whose amount or currency is not the order's (the detail says both). Nothing is charged.")},
	{err: payments.ErrNotRefundable, kind: business("payment-not-refundable", http.StatusConflict, "The payment cannot be refunded",
		"`POST /payments/{id}/refunds` of a payment that has not succeeded (pending or failed).")},
	{err: payments.ErrRefundExceedsPayment, kind: business("refund-exceeds-payment", http.StatusUnprocessableEntity, "The refund exceeds what is left of the payment",
		"The refund is larger than what the payment's other refunds (those that have not failed) left of it. Use a new key for a new attempt.")},
	{err: payments.ErrTooManyRefunds, kind: business("too-many-refunds", http.StatusUnprocessableEntity, "The payment has all the refunds it can take",
		"The payment has 100 refunds, the most it takes (failed ones count).")},
	{err: ledger.ErrInsufficientFunds, kind: business("insufficient-funds", http.StatusUnprocessableEntity, "Insufficient bonus balance",
		"`POST /bonus/debits` asks for more than the bonus balance; the same key never succeeds later because credits arrived in between. Use a new key for a new attempt.")},
	{err: ledger.ErrBalanceLimit, kind: business("balance-limit-exceeded", http.StatusUnprocessableEntity, "Bonus balance limit exceeded",
		"`POST /bonus/credits` would take the balance beyond 10^18. Use a new key for a new attempt.")},
}

// business declares the kind of an operation's business outcome: a 4xx that
// is stored under the key and replayed like a success.
func business(slug string, status int, title, when string) problem.Kind {
	return problem.Kind{
		Slug: slug, Status: status, Title: title,
		When:        when + " A business outcome: stored and replayed.",
		KeyConsumed: "yes",
	}
}

// problemRow is the row of the table err matches, if any: the first, so
// that the table's order decides.
func problemRow(err error) (kind problem.Kind, detail string, ok bool) {
	for _, row := range problems {
		if errors.Is(err, row.err) {
			return row.kind, row.detail, true
		}
	}
	return problem.Internal, "", false
}

// ProblemFor returns the kind of problem err is answered with, and Internal
// for an error the table does not know; tests name domain outcomes by their
// error through it.
func ProblemFor(err error) problem.Kind {
	kind, _, _ := problemRow(err)
	return kind
}

// Problems lists every kind of problem the service sends, once each and
// ordered by status, for docs/problems.md.
func Problems() []problem.Kind {
	kinds := []problem.Kind{problem.Internal, problem.ClientClosedRequest}
	for _, row := range problems {
		if !slices.ContainsFunc(kinds, func(k problem.Kind) bool { return k.Slug == row.kind.Slug }) {
			kinds = append(kinds, row.kind)
		}
	}
	slices.SortStableFunc(kinds, func(a, b problem.Kind) int { return cmp.Compare(a.Status, b.Status) })
	return kinds
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
	kind, detail, ok := problemRow(err)
	if engine := idempotency.ProblemOf(err); !ok && engine.Status < http.StatusInternalServerError {
		// A refusal of the protocol's that the table does not name (a
		// repeat under a new key refused, a malformed Idempotency-Repeat):
		// answered as the engine answers it.
		problem.Write(w, problem.Kind{Slug: engine.Slug, Status: engine.Status, Title: engine.Title}, engine.Detail)
		return
	}
	if !ok {
		p.log.ErrorContext(r.Context(), "request failed", "err", err)
		problem.Write(w, problem.Internal, internalDetail)
		return
	}
	if detail == "" {
		detail = err.Error()
	}
	switch kind {
	case problem.Unavailable:
		p.log.WarnContext(r.Context(), "request failed", "err", err)
		detail = unavailableDetail
		if notReady := (*store.NotReadyError)(nil); errors.Is(err, errNotReady) && errors.As(err, &notReady) {
			detail = "not ready: " + notReady.Reason
		}
		w.Header().Set("Retry-After", "1")
	case problem.Unauthorized:
		w.Header().Set("WWW-Authenticate", `Bearer realm="oncekey"`)
	}
	problem.Write(w, kind, detail)
}

// request answers the generated code's parameter and body decoding errors.
// The front door has usually refused such requests already.
func (p problemWriter) request(w http.ResponseWriter, r *http.Request, err error) {
	p.write(w, r, &contractError{kind: errBadRequest, detail: err.Error()})
}
