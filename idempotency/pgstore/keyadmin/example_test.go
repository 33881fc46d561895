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

// An operator frees a held key whose operation is known not to have run,
// and the audit trail says who did, why, and what the key held.
func ExampleRelease() {
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
	// A gateway held the key, and its outcome turned out unknown.
	lease, _, err := keys.Claim(ctx, idempotency.ClaimRequest{Scope: "acme", Key: "k1", Method: "POST", Route: "/transfers", TTL: time.Hour, Wait: time.Second})
	if err != nil {
		panic(err)
	}
	if err := lease.Commit(ctx, idempotency.Held{State: idempotency.HeldUnknown, Reason: "reset"}.Response()); err != nil {
		panic(err)
	}

	change := keyadmin.Change{Scope: "acme", Key: "k1", Actor: "alice", Reason: "TICKET-1: no transfer upstream"}
	if _, err := keyadmin.Release(ctx, keys, change); err != nil {
		panic(err)
	}
	_, err = keyadmin.Release(ctx, keys, change) // again: nothing to release
	fmt.Println(err)

	trail, err := keyadmin.Audit(ctx, keys, keyadmin.AuditFilter{Scope: "acme"})
	if err != nil {
		panic(err)
	}
	for _, e := range trail { // newest first
		fmt.Println(e.Actor, e.Action, e.Key, e.PreviousState, e.Outcome, e.Reason)
	}
	// Output:
	// keyadmin: no such key
	// alice release k1 absent refused TICKET-1: no transfer upstream
	// alice release k1 unknown done TICKET-1: no transfer upstream
}
