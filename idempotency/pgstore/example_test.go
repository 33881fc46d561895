package pgstore_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/pgstore/pgstoretest"
)

// An operation whose write and stored response commit in one transaction:
// a crash at any instant leaves both or neither. The second claim of the key
// finds the record and writes nothing. (This example creates a database of
// its own on the PostgreSQL of TEST_DATABASE_URL, by default
// postgres://postgres@127.0.0.1:5432/postgres, and drops it.)
func Example() {
	ctx := context.Background()
	pool, drop := exampleDatabase()
	defer drop()
	if err := pgstore.Migrate(ctx, pool, pgstore.Options{}); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE widgets (name text)"); err != nil {
		panic(err)
	}
	keys, err := pgstore.New(pool, pgstore.Options{})
	if err != nil {
		panic(err)
	}

	req := idempotency.ClaimRequest{Scope: "acme", Key: "k1", TTL: time.Hour, Wait: time.Second}
	for range 2 {
		lease, rec, err := keys.Claim(ctx, req)
		switch {
		case err != nil:
			panic(err)
		case rec != nil:
			fmt.Println("replay:", rec.Response.Status, string(rec.Response.Body))
			continue
		}
		tx := lease.Unit() // the operation writes in the claim's transaction
		if _, err := tx.Exec(ctx, "INSERT INTO widgets VALUES ('gear')"); err != nil {
			_ = lease.Rollback(ctx)
			panic(err)
		}
		if err := lease.Commit(ctx, idempotency.Response{Status: http.StatusCreated, Body: []byte(`{"name":"gear"}`)}); err != nil {
			panic(err)
		}
		fmt.Println("created")
	}
	var widgets int
	_ = pool.QueryRow(ctx, "SELECT count(*) FROM widgets").Scan(&widgets)
	fmt.Println("widgets:", widgets)
	// Output:
	// created
	// replay: 201 {"name":"gear"}
	// widgets: 1
}

// A handler that opens its own transaction joins the claim to it: the key
// row commits with the handler's writes, or, as here, rolls back with them,
// and the key is free for the retry.
func ExampleStore_Join() {
	ctx := context.Background()
	pool, drop := exampleDatabase()
	defer drop()
	if err := pgstore.Migrate(ctx, pool, pgstore.Options{}); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE widgets (name text)"); err != nil {
		panic(err)
	}
	keys, err := pgstore.New(pool, pgstore.Options{})
	if err != nil {
		panic(err)
	}
	req := idempotency.ClaimRequest{Scope: "acme", Key: "k1", TTL: time.Hour, Wait: time.Second}

	for _, commit := range []bool{false, true} {
		tx, err := pool.Begin(ctx) // the handler's own transaction
		if err != nil {
			panic(err)
		}
		lease, rec, err := keys.Join(ctx, tx, req)
		if err != nil || rec != nil {
			panic(fmt.Sprint("the key is free: ", rec, err))
		}
		if _, err := tx.Exec(ctx, "INSERT INTO widgets VALUES ('gear')"); err != nil {
			panic(err)
		}
		if err := lease.Commit(ctx, idempotency.Response{Status: http.StatusCreated, Body: []byte(`{"name":"gear"}`)}); err != nil {
			panic(err)
		}
		if !commit { // the handler fails after storing the response
			_ = tx.Rollback(ctx)
			continue
		}
		if err := tx.Commit(ctx); err != nil { // answer the client only after this
			panic(err)
		}
	}
	var widgets, keyRows int
	_ = pool.QueryRow(ctx, "SELECT count(*) FROM widgets").Scan(&widgets)
	_ = pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_keys").Scan(&keyRows)
	fmt.Println("widgets:", widgets, "keys:", keyRows)
	// Output:
	// widgets: 1 keys: 1
}

// A whole service in plain net/http, as README.md shows it: the key table
// migrated at start, the middleware on the handler, expired keys cleaned
// up. The retry with the same key replays the first answer, and one widget
// is created.
func Example_service() {
	ctx := context.Background()
	pool, drop := exampleDatabase()
	defer drop()
	if err := pgstore.Migrate(ctx, pool, pgstore.Options{}); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE widgets (name text)"); err != nil {
		panic(err)
	}
	keys, err := pgstore.New(pool, pgstore.Options{})
	if err != nil {
		panic(err)
	}
	// A service runs it in the background: go cleanup.Run(ctx).
	cleanup := idempotency.Cleanup{Purge: keys.PurgeExpired}
	if _, err := cleanup.Once(ctx); err != nil {
		panic(err)
	}

	engine := idempotency.New(idempotency.Config{
		Scope:           func(r *http.Request) (string, error) { return r.Header.Get("X-Tenant"), nil },
		ProblemTypeBase: "https://api.example.com/problems/",
	})
	create := idempotency.NewOperation(engine, keys, idempotency.OperationConfig{})
	mux := http.NewServeMux()
	mux.Handle("POST /widgets", create.HandlerFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) {
		if _, err := tx.Exec(r.Context(), "INSERT INTO widgets (name) VALUES ('gear')"); err != nil {
			http.Error(w, "the widget could not be created", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"name":"gear"}`))
	}))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/widgets", strings.NewReader(`{"name":"gear"}`))
		req.Header.Set("X-Tenant", "acme")
		req.Header.Set(idempotency.HeaderKey, "3f1c9a52-widget-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get(idempotency.HeaderReplayed), string(body))
	}
	var widgets int
	_ = pool.QueryRow(ctx, "SELECT count(*) FROM widgets").Scan(&widgets)
	fmt.Println("widgets:", widgets)
	// Output:
	// 201  {"name":"gear"}
	// 201 true {"name":"gear"}
	// widgets: 1
}

// exampleDatabase is a database of the example's own (on TEST_DATABASE_URL,
// by default postgres://postgres@127.0.0.1:5432/postgres), and what drops it.
func exampleDatabase() (*pgxpool.Pool, func()) {
	pool, drop, err := pgstoretest.Database()
	if err != nil {
		panic(err)
	}
	return pool, drop
}
