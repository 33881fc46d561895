package recordcache_test

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/idempotency/recordcache"
)

// looks prints what the cache found.
type looks struct{}

func (looks) RecordCache(result string) { fmt.Println("record cache:", result) }

// One cache serves every store it wraps; a record this process committed
// or read before is replayed from memory without asking the store.
func Example() {
	ctx := context.Background()
	cache, err := recordcache.New(recordcache.DefaultSize, looks{})
	if err != nil {
		panic(err)
	}
	durable := memstore.New() // pgstore in production
	keys := recordcache.Wrap(cache, idempotency.Store[*memstore.Tx](durable))

	req := idempotency.ClaimRequest{Scope: "acme", Key: "k1", TTL: time.Hour, Wait: time.Second}
	lease, _, _ := keys.Claim(ctx, req)
	_ = lease.Commit(ctx, idempotency.Response{Status: http.StatusCreated, Body: []byte(`{"id":1}`)})

	_, rec, _ := keys.Claim(ctx, req)
	fmt.Println(rec.Response.Status, string(rec.Response.Body))
	// Output:
	// record cache: miss
	// record cache: hit
	// 201 {"id":1}
}
