// Package store declares, once, what Oncekey runs on: the idempotency
// engine's key stores, handing out Oncekey's units of work, and the domain
// repositories beside them. The PostgreSQL store (package postgres) and the
// in-memory one (package memory) both provide it, and the suite in package
// storetest holds them to one behaviour.
package store

import (
	"context"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/ledger"
	"github.com/oncekey/oncekey/internal/service/orders"
	"github.com/oncekey/oncekey/internal/service/payments"
)

// Tx is the unit of work of an operation that reads as it writes (a
// payment, a refund, a change of an order, a bonus booking): its reads and
// writes run in the transaction that claimed the key, and commit with the
// stored response.
type Tx interface {
	payments.Unit
	payments.RefundUnit
	orders.Changer
	ledger.Booker
}

// Deferred is the unit of work of an operation that only writes (creating an
// order): its writes may wait for the commit and go with the claim, in one
// round trip, and it can read nothing back.
type Deferred interface {
	orders.Writer
}

// Backend is everything Oncekey's service runs on.
type Backend interface {
	// Keys claims the keys of operations that read as they write.
	Keys() idempotency.Store[Tx]
	// DeferredKeys claims the keys of operations that only write.
	DeferredKeys() idempotency.Store[Deferred]

	Reads
	payments.Settlements
	auth.Store
	// PurgeExpired and KeyStats are the key store's, for cleanup and the
	// metrics (idempotency.Store).
	PurgeExpired(ctx context.Context, batch int) (int64, error)
	KeyStats(ctx context.Context) (idempotency.Stats, error)
	// PendingStats counts the payments and refunds still pending, for the
	// metrics that tell a stuck payment.
	PendingStats(ctx context.Context) (payments.PendingStats, error)
	// AccountsNamed returns up to ten accounts of that name: names need not
	// be unique, but `oncekey accounts create` refuses a second one unless
	// told.
	AccountsNamed(ctx context.Context, name string) ([]uuid.UUID, error)
	// Ready reports, within a short deadline of its own, whether the
	// backend can serve writes now (GET /readyz): nil, or why not, as a
	// *NotReadyError where the backend can say.
	Ready(ctx context.Context) error
}

// NotReadyError says why a backend cannot serve: Reason, for GET /readyz's
// answer, names the state (read-only, no connection to be had) and never
// quotes the error; Err, for the log, is what failed.
type NotReadyError struct {
	Reason string
	Err    error
}

func (e *NotReadyError) Error() string {
	if e.Err == nil {
		return e.Reason
	}
	return e.Reason + ": " + e.Err.Error()
}

func (e *NotReadyError) Unwrap() error { return e.Err }

// Reads is what the HTTP layer's read operations read through: the
// backend itself, or a replica in front of it (postgres.Replica), whose
// reads may lag unless their context is Strong. Background work never
// reads through it: it gets the backend, whose reads are the primary's.
type Reads interface {
	orders.Repository
	payments.Reads
	ledger.Repository
}

// strongKey marks a context whose reads must see every write committed
// before them.
type strongKey struct{}

// Strong returns ctx with its reads on the primary: a store that reads
// from a replica (postgres.Replica) reads from the primary for it,
// so that a client reads its own writes (the Consistency: strong header).
func Strong(ctx context.Context) context.Context { return context.WithValue(ctx, strongKey{}, true) }

// IsStrong reports whether ctx asks for reads that see every committed write.
func IsStrong(ctx context.Context) bool { v, _ := ctx.Value(strongKey{}).(bool); return v }
