package servicetest

import (
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
