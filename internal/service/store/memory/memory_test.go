package memory_test

import (
	"testing"

	"github.com/oncekey/oncekey/internal/service/store/memory"
	"github.com/oncekey/oncekey/internal/service/store/storetest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) storetest.Store { return memory.New() })
}
