package redisstore_test

import (
	"testing"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/internal/testharness"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/idempotency/redisstore"
	"github.com/oncekey/oncekey/idempotency/redisstore/redistest"
	"github.com/oncekey/oncekey/idempotency/storetest"
)

// TestConformance: with the fast path on the machine's Redis in front,
// memstore keeps every promise of the store contract. The integration
// module runs the same on pgstore, on a Redis Cluster and through faults.
func TestConformance(t *testing.T) {
	t.Parallel()
	fast := redisstore.New(redistest.Shared(t), redisstore.Config{Prefix: "conformance-" + t.Name() + ":"})
	storetest.Run(t, testharness.Wrapped(testharness.Memstore(), func(_ *testing.T, next idempotency.Store[*memstore.Tx]) idempotency.Store[*memstore.Tx] {
		return redisstore.Wrap(fast, next)
	}))
}
