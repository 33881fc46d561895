package storetest_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/idempotency/storetest"
)

// A store of your own runs the suite from a test of its own:
//
//	func TestConformance(t *testing.T) { storetest.Run(t, harness) }
//
// with a harness that says how to open the store and write through its
// unit of work. Here the suite runs on memstore, whose unit of work is a
// list of hooks, and on rows kept in a map.
func ExampleRun() {
	var (
		mu   sync.Mutex
		rows = map[string]string{} // id → scope, committed
	)
	keys := memstore.New()
	harness := storetest.Harness[*memstore.Tx]{
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
	// go test runs TestConformance; an example runs it by hand.
	ok := testing.RunTests(func(string, string) (bool, error) { return true, nil }, []testing.InternalTest{
		{Name: "TestConformance", F: func(t *testing.T) { storetest.Run(t, harness) }},
	})
	fmt.Fprintln(os.Stdout, "conformant:", ok)
	// Output: conformant: true
}
