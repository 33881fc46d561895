package httpapi

import (
	"context"
	"errors"
	"log/slog"
	"net/http"

	"github.com/oncekey/oncekey/internal/idempotency"
	"github.com/oncekey/oncekey/internal/ledger"
	"github.com/oncekey/oncekey/internal/orders"
	"github.com/oncekey/oncekey/internal/payments"
	"github.com/oncekey/oncekey/internal/problem"
)

// errorKinds maps domain errors to problem kinds. It is the one table that
// decides which status an error is sent with; an error not in it is a 500.
var errorKinds = []struct {
	err  error
	kind problem.Kind
}{
	{orders.ErrNotFound, problem.NotFound},
	{orders.ErrUnknownCurrency, problem.UnknownCurrency},
	{orders.ErrInvalidCursor, problem.Validation},
	{payments.ErrNotFound, problem.NotFound},
	{payments.ErrUnknownOrder, problem.UnknownOrder},
	{ledger.ErrInsufficientFunds, problem.InsufficientFunds},
	{errNotReady, problem.Unavailable},
	{idempotency.ErrUnavailable, problem.Unavailable},
	{context.DeadlineExceeded, problem.Unavailable},
}

// errorResponder writes errors returned by handlers (and by the generated
// request decoding) as problems.
type errorResponder struct {
	log *slog.Logger
}

// response handles an error returned by a strict handler.
func (e errorResponder) response(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		// The client disconnected mid-operation (it timed out, say): the
		// idempotency layer rolls back, and this is not a server error.
		e.log.InfoContext(r.Context(), "client went away", "err", err)
		problem.Write(w, problem.ClientClosedRequest, "the client closed the request")
		return
	}
	for _, m := range errorKinds {
		if errors.Is(err, m.err) {
			detail := err.Error()
			if m.kind.Status >= 500 {
				e.log.WarnContext(r.Context(), "request failed", "err", err)
				detail = "a dependency is unavailable; retry later (with the same Idempotency-Key, if any)"
				w.Header().Set("Retry-After", "1")
			}
			problem.Write(w, m.kind, detail)
			return
		}
	}
	e.log.ErrorContext(r.Context(), "request failed", "err", err)
	problem.Write(w, problem.Internal, "the request could not be completed; if it carried an Idempotency-Key, retrying with the same key is safe")
}

// request handles parameter and body decoding errors of the generated code.
// The validator has usually rejected such requests already.
func (e errorResponder) request(w http.ResponseWriter, _ *http.Request, err error) {
	problem.Write(w, problem.Validation, err.Error())
}
