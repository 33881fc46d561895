package memstore_test

import (
	"testing"

	"github.com/oncekey/oncekey/idempotency/internal/testharness"
	"github.com/oncekey/oncekey/idempotency/storetest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, testharness.Memstore())
}
