package pgstoretest_test

import (
	"context"
	"testing"

	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/pgstore/pgstoretest"
)

// A package's tests share one migrated database, made on first use and
// dropped after the last test; a test that counts rows takes one of its own.
func Example() {
	// In the package's main_test.go:
	//
	//	func TestMain(m *testing.M) { pgstoretest.Main(m, pgstoretest.Options{}) }
	testStore := func(t *testing.T) {
		store, err := pgstore.New(pgstoretest.Pool(t), pgstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		_ = store // claim, commit and replay keys of the test's own

		_, own := pgstoretest.Fresh(t) // a key table no other test writes
		var n int
		if err := own.QueryRow(context.Background(), "SELECT count(*) FROM idempotency_keys").Scan(&n); err != nil {
			t.Fatal(err)
		}
	}
	_ = testStore
}
