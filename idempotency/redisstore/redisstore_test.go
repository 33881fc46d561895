package redisstore_test

import (
	"fmt"
	"testing"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/internal/testharness"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/idempotency/redisstore"
	"github.com/oncekey/oncekey/idempotency/redisstore/redistest"
	"github.com/oncekey/oncekey/idempotency/storetest"
)

// TestConformance: with the fast path on the machine's Redis in front,
// memstore keeps every promise of the store contract, whether claims are
// looked up as replays come and go or always. The integration module runs
// the same on pgstore, on a Redis Cluster and through faults.
func TestConformance(t *testing.T) {
	t.Parallel()
	for _, always := range []bool{false, true} {
		t.Run(fmt.Sprintf("always look up %t", always), func(t *testing.T) {
			t.Parallel()
			fast := redisstore.New(redistest.Shared(t), redisstore.Config{Prefix: "conformance-" + t.Name() + ":", AlwaysLookUp: always})
			storetest.Run(t, testharness.Wrapped(testharness.Memstore(), func(_ *testing.T, next idempotency.Store[*memstore.Tx]) idempotency.Store[*memstore.Tx] {
				return redisstore.Wrap(fast, next)
			}))
		})
	}
}
