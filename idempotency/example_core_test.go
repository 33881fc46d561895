package idempotency_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
)

// The protocol without HTTP: a job runner (a queue consumer, a CLI, a gRPC
// layer) begins each request's key, runs the operation when told to, and
// finishes it with the response to keep; a retry gets that response
// again, and the same key with another request is refused.
func ExampleOperation_Begin() {
	engine := idempotency.New(idempotency.Config{})
	charge := idempotency.NewOperation(engine, memstore.New(), idempotency.OperationConfig{Name: "charge"})
	charged := 0

	run := func(key, body string) {
		ctx := context.Background()
		d, err := charge.Begin(ctx, idempotency.Request{
			Scope: "acme", Key: key, Method: "charge", Route: "charge", Path: "charge", Body: []byte(body),
		})
		switch {
		case errors.Is(err, idempotency.ErrKeyMismatch):
			fmt.Println("refused: the key was used for another charge")
			return
		case err != nil:
			fmt.Println("failed:", err)
			return
		case d.Replay != nil:
			fmt.Println("replayed:", d.Replay.Status, string(d.Replay.Body))
			return
		}
		defer d.Abandon(ctx) // rolls back if Finish is never reached
		charged++
		d.Unit.OnRollback(func() { charged-- }) // the unit's writes commit with the response
		resp := idempotency.Response{Status: 201, Body: fmt.Appendf(nil, `{"charge":%d}`, charged)}
		if err := d.Finish(ctx, resp); err != nil {
			fmt.Println("failed:", err)
			return
		}
		fmt.Println("ran:", resp.Status, string(resp.Body))
	}
	run("k1", `{"amount":500}`)
	run("k1", `{ "amount": 500 }`) // the same request: replayed
	run("k1", `{"amount":700}`)    // another request under k1
	fmt.Println("charged:", charged)
	// Output:
	// ran: 201 {"charge":1}
	// replayed: 201 {"charge":1}
	// refused: the key was used for another charge
	// charged: 1
}
