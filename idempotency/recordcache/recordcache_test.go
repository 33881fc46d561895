package recordcache_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/internal/testharness"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/idempotency/recordcache"
	"github.com/oncekey/oncekey/idempotency/storetest"
)

// TestConformance: with the cache in front, memstore keeps every promise of
// the store contract. The integration module runs the same on pgstore.
func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, testharness.Wrapped(testharness.Memstore(), func(t *testing.T, next idempotency.Store[*memstore.Tx]) idempotency.Store[*memstore.Tx] {
		cache, err := recordcache.New(1000, nil)
		require.NoError(t, err)
		return recordcache.Wrap(cache, next)
	}))
}
