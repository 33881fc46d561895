package redistest_test

import (
	"context"
	"testing"

	"github.com/oncekey/oncekey/idempotency/redisstore"
	"github.com/oncekey/oncekey/idempotency/redisstore/redistest"
)

// A test that must see the fast path lose Redis starts a server of its own
// and kills it; the others share the machine's, apart by their key prefix.
func Example() {
	testOutage := func(t *testing.T) {
		server := redistest.Start(t)
		rdb, err := redisstore.NewClient(server.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer rdb.Close()
		fast := redisstore.New(rdb, redisstore.Config{Prefix: t.Name() + ":"})
		_ = fast // wrap the durable store, then:
		_ = server.Process.Kill()
		if rdb.Ping(context.Background()).Err() == nil {
			t.Fatal("Redis still answers after the kill")
		}
	}
	_ = testOutage
}
