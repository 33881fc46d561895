package idempotency_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
)

// A handler made exactly-once: the same key replays the first response, the
// same key with another body is refused, and the widget is created once.
// The keys are kept in memory here; package pgstore keeps them in
// PostgreSQL, in the transaction of the handler's own writes.
func Example() {
	engine := idempotency.New(idempotency.Config{
		// Keys of two tenants never meet.
		Scope:           func(r *http.Request) (string, error) { return r.Header.Get("X-Tenant"), nil },
		ProblemTypeBase: "https://widgets.example/problems/",
	})
	var widgets atomic.Int64
	create := idempotency.NewOperation(engine, memstore.New(), idempotency.OperationConfig{})
	handler := create.HandlerFunc(func(w http.ResponseWriter, r *http.Request, tx *memstore.Tx) {
		n := widgets.Add(1)
		tx.OnRollback(func() { widgets.Add(-1) }) // undone if the operation fails
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"widget":%d}`, n)
	})

	send := func(key, body string) {
		req := httptest.NewRequest(http.MethodPost, "/widgets", strings.NewReader(body))
		req.Header.Set("X-Tenant", "acme")
		req.Header.Set(idempotency.HeaderKey, key)
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Header().Get(idempotency.HeaderReplayed), strings.TrimSpace(rec.Body.String()))
	}
	send("k1", `{"name":"gear"}`)
	send("k1", `{ "name" : "gear" }`) // the same request: replayed
	send("k1", `{"name":"cog"}`)      // another request under k1
	fmt.Println("widgets:", widgets.Load())
	// Output:
	// 201  {"widget":1}
	// 201 true {"widget":1}
	// 409  {"type":"https://widgets.example/problems/idempotency-key-mismatch","title":"Idempotency-Key was used for a different request","status":409,"detail":"this Idempotency-Key was already used with a different request (method, path, query or body); use a new key for a new operation"}
	// widgets: 1
}
