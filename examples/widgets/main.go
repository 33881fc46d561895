// Command widgets is an example service whose unsafe operations run exactly
// once per Idempotency-Key, using only the public packages of
// github.com/oncekey/oncekey/idempotency: openapi.yaml says which
// operations take a key, oapi-codegen generates the chi server (package
// api), and pgstore keeps the keys in PostgreSQL beside the widgets.
//
//	DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres go run .
//
// ADDR overrides the listen address (127.0.0.1:8090).
package main

import (
	"cmp"
	"context"
	"errors"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore"
)

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dbURL := os.Getenv("DATABASE_URL")
	if dbURL == "" {
		return errors.New("set DATABASE_URL, e.g. postgres://postgres@127.0.0.1:5432/postgres")
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrate(ctx, pool); err != nil {
		return err
	}
	keys, err := pgstore.New(pool, pgstore.Options{})
	if err != nil {
		return err
	}
	handler, err := newHandler(pool, keys)
	if err != nil {
		return err
	}
	// Expired keys are already free to claim again; purging only keeps the
	// table small. One replica at a time purges (an advisory lock).
	go idempotency.Cleanup{Purge: keys.PurgeExpired, Interval: time.Hour, Batch: 1000}.Run(ctx)

	srv := &http.Server{Addr: cmp.Or(os.Getenv("ADDR"), "127.0.0.1:8090"), Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.ListenAndServe() }()
	log.Printf("widgets: listening on http://%s", srv.Addr)
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	// Let requests in flight finish: each one's outcome is committed
	// before it is answered, so cutting one short only costs its client
	// a retry with the same key.
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Shutdown(shutdownCtx)
}
