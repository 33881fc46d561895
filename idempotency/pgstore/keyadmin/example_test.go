package keyadmin_test

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/pgstore/keyadmin"
	"github.com/oncekey/oncekey/idempotency/pgstore/pgstoretest"
)

// What an operator sees of a key: its record without the stored body, only
// its size. (The example runs on a database of its own, on the PostgreSQL
// of TEST_DATABASE_URL, by default postgres://postgres@127.0.0.1:5432/postgres.)
func Example() {
	ctx := context.Background()
	pool, drop, err := pgstoretest.Database()
	if err != nil {
		panic(err)
	}
	defer drop()
	keys, err := pgstore.New(pool, pgstore.Options{})
	if err != nil {
		panic(err)
	}
	lease, _, err := keys.Claim(ctx, idempotency.ClaimRequest{Scope: "acme", Key: "k1", Method: "POST", Route: "/widgets", TTL: time.Hour, Wait: time.Second})
	if err != nil {
		panic(err)
	}
	if err := lease.Commit(ctx, idempotency.Response{Status: http.StatusCreated, Body: []byte(`{"name":"gear"}`)}); err != nil {
		panic(err)
	}

	info, err := keyadmin.Inspect(ctx, keys, "acme", "k1")
	if err != nil {
		panic(err)
	}
	fmt.Println(info.Status, info.Method, info.Route, info.ResponseStatus, info.ResponseBytes)
	_, err = keyadmin.Inspect(ctx, keys, "acme", "k2")
	fmt.Println(err)
	expired, _ := keyadmin.CountExpired(ctx, keys)
	stuck, _ := keyadmin.Stuck(ctx, keys, time.Minute, 10)
	fmt.Println("expired:", expired, "stuck:", len(stuck))
	// Output:
	// completed POST /widgets 201 15
	// keyadmin: no such key
	// expired: 0 stuck: 0
}
