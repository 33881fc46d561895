package httpapi

import (
	"context"
	"net/http"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/idempotency"
)

// call is what a handler runs with, which the front door puts in its
// context: the authenticated caller and, for an operation that takes an
// Idempotency-Key, the unit of work of its claim (U).
// An operation without one has a call[noUnit].
type call[U any] struct {
	account uuid.UUID
	unit    U
}

// noUnit is the unit of work of an operation that takes no
// Idempotency-Key (a read), or runs without the protocol.
type noUnit struct{}

type callKey[U any] struct{}

// callFrom returns the call of the request in ctx, whose operation's unit
// of work is a U: errNoUnit if the operation ran outside the protocol (or
// with another kind of unit), errNoAccount if no caller was authenticated.
func callFrom[U any](ctx context.Context) (call[U], error) {
	c, ok := ctx.Value(callKey[U]{}).(call[U])
	switch {
	case !ok:
		return call[U]{}, errNoUnit
	case c.account == uuid.Nil:
		return call[U]{}, errNoAccount
	}
	return c, nil
}

// withCall is r with c in its context.
func withCall[U any](r *http.Request, c call[U]) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), callKey[U]{}, c))
}

// protocol runs an operation that takes an Idempotency-Key under the
// idempotency protocol, and hands next its call.
type protocol func(w http.ResponseWriter, r *http.Request, in idempotency.Request, account uuid.UUID, next http.Handler) idempotency.Outcome

// underProtocol is the protocol of op.
func underProtocol[U any](op *idempotency.Operation[U]) protocol {
	return func(w http.ResponseWriter, r *http.Request, in idempotency.Request, account uuid.UUID, next http.Handler) idempotency.Outcome {
		return op.Serve(w, r, in, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			unit, _ := op.Unit(r.Context())
			r.Body = requestFrom(r.Context()).validated(r.Body)
			next.ServeHTTP(w, withCall(r, call[U]{account: account, unit: unit}))
		}))
	}
}
