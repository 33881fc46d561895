package oapi_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/go-chi/chi/v5"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/idempotency/oapi"
)

// The document says which operations take an Idempotency-Key; Bind gives
// each its store, and so the unit of work its handler writes through.
// Middleware goes on the router oapi-codegen's chi server is built on
// (ChiServerOptions.BaseRouter), so that it runs before the generated
// parameter binding; here a chi router stands in for it.
func Example() {
	doc, err := openapi3.NewLoader().LoadFromData([]byte(`
openapi: 3.0.3
info: {title: widgets, version: "1"}
paths:
  /widgets:
    post:
      operationId: createWidget
      parameters:
        - {name: Idempotency-Key, in: header, required: true, schema: {type: string}}
      responses: {"201": {description: created}}
`))
	if err != nil {
		panic(err)
	}
	engine := idempotency.New(idempotency.Config{
		Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-Tenant"), nil },
	})
	ops, err := oapi.New(doc, engine)
	if err != nil {
		panic(err)
	}
	createWidget, err := oapi.Bind(ops, "createWidget", idempotency.Store[*memstore.Tx](memstore.New()))
	if err != nil {
		panic(err)
	}
	middleware, err := ops.Middleware(nil)
	if err != nil {
		panic(err)
	}

	created := 0
	r := chi.NewRouter()
	r.With(middleware).Post("/widgets", func(w http.ResponseWriter, r *http.Request) {
		tx, _ := createWidget.Unit(r.Context()) // this operation's unit of work
		created++
		tx.OnRollback(func() { created-- })
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"widget":%d}`, created)
	})
	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/widgets", strings.NewReader(`{"name":"gear"}`))
		req.Header.Set("X-Tenant", "acme")
		req.Header.Set(idempotency.HeaderKey, "k1")
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, req)
		fmt.Printf("%d %s replayed=%q\n", rec.Code, rec.Body, rec.Header().Get(idempotency.HeaderReplayed))
	}
	// Output:
	// 201 {"widget":1} replayed=""
	// 201 {"widget":1} replayed="true"
}
