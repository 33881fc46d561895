package servicetest

import (
	"context"

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
	return wrappedOrders{next: keys, wrap: wrap}
}

// wrappedOrders is WrapOrders' store.
type wrappedOrders struct {
	next idempotency.Store[store.Deferred]
	wrap func(orders.Writer) orders.Writer
}

// Claim implements idempotency.Store.
func (s wrappedOrders) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Lease[store.Deferred], *idempotency.Record, error) {
	return s.lease(s.next.Claim(ctx, req))
}

// ClaimNow implements idempotency.DeferringStore, keeping the choice of
// the store it wraps: a deferred claim stays deferred.
func (s wrappedOrders) ClaimNow(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Lease[store.Deferred], *idempotency.Record, error) {
	return s.lease(idempotency.ClaimNow(ctx, s.next, req))
}

func (s wrappedOrders) lease(l idempotency.Lease[store.Deferred], rec *idempotency.Record, err error) (idempotency.Lease[store.Deferred], *idempotency.Record, error) {
	if l == nil {
		return nil, rec, err
	}
	return wrappedLease{Lease: l, unit: s.wrap(l.Unit())}, rec, err
}

// wrappedLease is a claim whose unit of work writes through the wrapper.
type wrappedLease struct {
	idempotency.Lease[store.Deferred]
	unit store.Deferred
}

// Unit implements idempotency.Lease.
func (l wrappedLease) Unit() store.Deferred { return l.unit }
