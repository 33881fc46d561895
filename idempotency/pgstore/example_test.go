package pgstore_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore"
)

// An operation whose write and stored response commit in one transaction:
// a crash at any instant leaves both or neither. The second claim of the key
// finds the record and writes nothing. (This example creates a database of
// its own on the PostgreSQL of TEST_DATABASE_URL, by default
// postgres://postgres@127.0.0.1:5432/postgres, and drops it.)
func Example() {
	ctx := context.Background()
	pool, drop := exampleDatabase(ctx)
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

// exampleDatabase creates a database for the example and returns a pool on
// it and what drops it.
func exampleDatabase(ctx context.Context) (*pgxpool.Pool, func()) {
	admin := os.Getenv("TEST_DATABASE_URL")
	if admin == "" {
		admin = "postgres://postgres@127.0.0.1:5432/postgres"
	}
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		panic(err)
	}
	name := "pgstore_example_" + strings.ToLower(rand.Text())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		panic(err)
	}
	cfg, err := pgxpool.ParseConfig(admin)
	if err != nil {
		panic(err)
	}
	cfg.ConnConfig.Database = name
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		panic(err)
	}
	return pool, func() {
		pool.Close()
		_, _ = conn.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)")
		_ = conn.Close(ctx)
	}
}

// A handler that opens its own transaction joins the claim to it: the key
// row commits with the handler's writes, or, as here, rolls back with them,
// and the key is free for the retry.
func ExampleStore_Join() {
	ctx := context.Background()
	pool, drop := exampleDatabase(ctx)
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
