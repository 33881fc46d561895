package memstore_test

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
)

// An operation's writes in memory are made at once and undone if its lease
// rolls back; the first claim of a key gets a lease, and once it commits,
// every later claim gets the record.
func Example() {
	ctx := context.Background()
	keys := memstore.New()
	balance := 100
	req := idempotency.ClaimRequest{Scope: "acme", Key: "k1", TTL: time.Hour, Wait: time.Second}

	lease, _, _ := keys.Claim(ctx, req)
	balance -= 30
	lease.Unit().OnRollback(func() { balance += 30 })
	_ = lease.Commit(ctx, idempotency.Response{Status: http.StatusCreated, Body: []byte(`{"balance":70}`)})

	_, rec, _ := keys.Claim(ctx, req)
	fmt.Println(rec.Response.Status, string(rec.Response.Body), balance)
	// Output: 201 {"balance":70} 70
}
