package servicetest

import (
	"context"
	"errors"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/orders"
	"github.com/oncekey/oncekey/internal/service/store"
)

// WrapOrders is keys with the order writes of each of its claims going
// through wrap: a fault injected where POST /orders writes, its claim and
// commit left as keys make them. The service has no hook of its own for
// it; a test reaches the writes through the key store it is built with,
// as any caller of httpapi.New could.
func WrapOrders(keys idempotency.Store[store.Deferred], wrap func(orders.Writer) orders.Writer) idempotency.Store[store.Deferred] {
	return idempotency.MapUnit(keys, func(unit store.Deferred, _ idempotency.Ref) store.Deferred { return wrap(unit) })
}

// KeepNothing is a key store that keeps nothing, for a baseline that
// measures what the protocol's store costs: every claim is a lease whose
// order goes to write on its own (one INSERT, as the service's would be
// without a key, or nowhere) and whose commit stores no record. The
// service has no switch that turns its protocol off; on this store it runs
// POST /orders exactly as on a real one, less the claim, the key row and
// the round trip they share with the order.
func KeepNothing(write func(context.Context, orders.Order) error) idempotency.Store[store.Deferred] {
	return keepNothing{write: write}
}

type keepNothing struct {
	write func(context.Context, orders.Order) error
}

// Claim implements idempotency.Store: the key is always free.
func (s keepNothing) Claim(_ context.Context, req idempotency.ClaimRequest) (idempotency.Lease[store.Deferred], *idempotency.Record, error) {
	return keptNothing{write: s.write, ref: idempotency.Ref{Scope: req.Scope, Key: req.Key}}, nil, nil
}

// Settle, Release, PurgeExpired and KeyStats implement idempotency.Store:
// a store that keeps nothing has nothing to settle, purge or count.
func (keepNothing) Settle(context.Context, idempotency.Ref, idempotency.Response) (bool, error) {
	return false, errors.ErrUnsupported
}

func (keepNothing) Release(context.Context, idempotency.Ref) (bool, error) {
	return false, errors.ErrUnsupported
}

// WritePiece and ReadPiece implement idempotency.Store: a store that
// keeps no records keeps no pieces of their bodies either, and a caller
// that asks it for one is told so rather than given a piece that looks
// lost.
func (keepNothing) WritePiece(context.Context, idempotency.Ref, int, []byte) (bool, error) {
	return false, errors.ErrUnsupported
}

func (keepNothing) ReadPiece(context.Context, idempotency.Ref, int) ([]byte, error) {
	return nil, errors.ErrUnsupported
}

func (keepNothing) PurgeExpired(context.Context, int) (int64, error) { return 0, errors.ErrUnsupported }

func (keepNothing) KeyStats(context.Context) (idempotency.Stats, error) {
	return idempotency.Stats{}, errors.ErrUnsupported
}

// keptNothing is keepNothing's lease, and its unit of work: the order is
// written when the operation writes it, committed on its own.
type keptNothing struct {
	write func(context.Context, orders.Order) error
	ref   idempotency.Ref
}

func (l keptNothing) Unit() store.Deferred                             { return l }
func (l keptNothing) Ref() idempotency.Ref                             { return l.ref }
func (keptNothing) Commit(context.Context, idempotency.Response) error { return nil }
func (keptNothing) Rollback(context.Context) error                     { return nil }
func (keptNothing) WritePiece(context.Context, int, []byte) error {
	return errors.ErrUnsupported
}

// CreateOrder implements orders.Writer.
func (l keptNothing) CreateOrder(ctx context.Context, o orders.Order) error { return l.write(ctx, o) }
