package redisstore_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"time"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/idempotency/redisstore"
)

// The fast path in front of a durable store (pgstore in production). While
// replays are rare a claim goes straight to the durable store and costs
// Redis nothing; in a storm of retries claims are looked up on Redis: the
// first looked-up replay is answered by the durable store and cached on its
// way (read through), and later replays, on any process, are answered from
// Redis. Redis failing only costs speed: the durable store still decides.
// (This example needs a Redis at 127.0.0.1:6379.)
func Example() {
	ctx := context.Background()
	rdb, err := redisstore.NewClient("redis://127.0.0.1:6379/0")
	if err != nil {
		panic(err)
	}
	defer rdb.Close()
	fast := redisstore.New(rdb, redisstore.Config{Prefix: "example:"})
	keys := redisstore.Wrap(fast, idempotency.Store[*memstore.Tx](memstore.New()))

	req := idempotency.ClaimRequest{Scope: "acme-" + rand.Text(), Key: "k1", TTL: time.Minute, Wait: time.Second}
	lease, _, _ := keys.Claim(ctx, req)
	_ = lease.Commit(ctx, idempotency.Response{Status: http.StatusCreated, Body: []byte(`{"id":1}`)})
	record, _ := fast.KeyNames(req.Scope, req.Key)
	cached, _ := rdb.Exists(ctx, record).Result()
	fmt.Println("cached after the first request:", cached)

	var rec *idempotency.Record
	for range 10 { // a client retrying in a loop
		_, rec, _ = keys.Claim(ctx, req)
	}
	cached, _ = rdb.Exists(ctx, record).Result()
	fmt.Println("cached during a storm of replays:", cached)
	fmt.Println("replay:", rec.Response.Status, string(rec.Response.Body))
	// Output:
	// cached after the first request: 0
	// cached during a storm of replays: 1
	// replay: 201 {"id":1}
}
