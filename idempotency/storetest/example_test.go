package storetest_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/idempotency/storetest"
)

// A store of your own runs the suite from a test of its own, with a
// harness that says how to open the store, write through its unit of work
// and count what was written. Here the suite runs on memstore, whose unit
// of work is a list of hooks, and on rows kept in a map
// (TestExampleHarness runs this very harness through the suite).
func ExampleRun() {
	harness := exampleHarness()
	conformance := func(t *testing.T) { storetest.Run(t, harness) }
	// In the store's package: func TestConformance(t *testing.T) { ... }
	fmt.Printf("%T\n", conformance)
	// Output: func(*testing.T)
}

// TestExampleHarness runs ExampleRun's harness through the suite, so that
// the example shows a harness that passes it. (An example cannot run the
// suite itself: testing.RunTests inside an example loses the example's
// output under go test -json, which make test uses.)
func TestExampleHarness(t *testing.T) {
	t.Parallel()
	storetest.Run(t, exampleHarness())
}

// exampleHarness is memstore with rows kept in a map.
func exampleHarness() storetest.Harness[*memstore.Tx] {
	var (
		mu   sync.Mutex
		rows = map[string]string{} // id → scope, committed
	)
	keys := memstore.New()
	return storetest.Harness[*memstore.Tx]{
		Open: func(*testing.T) idempotency.Store[*memstore.Tx] { return keys },
		Write: func(_ context.Context, tx *memstore.Tx, ref idempotency.Ref, id string) error {
			// Visible at commit only; a second write of id waits for no
			// one here, so the cases about waiting writes are left out.
			tx.OnCommit(func() { mu.Lock(); rows[id] = ref.Scope; mu.Unlock() })
			return nil
		},
		Count: func(_ context.Context, _ *testing.T, scope string) int {
			mu.Lock()
			defer mu.Unlock()
			n := 0
			for _, s := range rows {
				if s == scope {
					n++
				}
			}
			return n
		},
		Queued: true,
	}
}
