package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
)

// bareInsert is the orders row OrderCreate (queries/orders.sql) inserts,
// written as a hand-written endpoint would: a literal statement, which
// pgx prepares once per connection as it does sqlc's.
const bareInsert = `INSERT INTO orders (account_id, id, status, amount, currency, items, created_at)
VALUES ($1, $2, 'created', $3, $4, $5, $6)`

// bareAnswer is bare's whole response body: fixed, because building the
// order's JSON is part of what the service does and bare measures without.
const bareAnswer = `{"status":"created"}`

// bareOrder is what bare reads from the request: only what the row needs.
// The items go to the jsonb column as the client sent them.
type bareOrder struct {
	Items    json.RawMessage `json:"items"`
	Amount   int64           `json:"amount"`
	Currency string          `json:"currency"`
}

// bareHandler is the hand-written endpoint: it decodes the body, inserts
// the order for account (there is no authentication to say whose it is)
// in one round trip with insert (bareInsert, or the same into another
// table), and answers 201. A body that does not decode is a 400 and a
// failed INSERT a 500, each of which fails the measurement, as any answer
// but 201 does.
func bareHandler(pool *pgxpool.Pool, account uuid.UUID, insert string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		raw, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var in bareOrder
		if err := json.Unmarshal(raw, &in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		// Time-ordered like the service's order ids, so that both insert
		// at the right edge of the primary key and write the same WAL.
		id, err := uuid.NewV7()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		// [16]byte, which pgx encodes as a uuid directly: uuid.UUID would
		// go through its database/sql Valuer, a string PostgreSQL parses.
		if _, err := pool.Exec(r.Context(), insert, [16]byte(account), [16]byte(id), in.Amount, in.Currency, in.Items, time.Now()); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, bareAnswer)
	})
	return mux
}

// startBare starts the bare endpoint on a listener and a pool of its own
// (b.barePool, as large as the servers'), adds what stops both to stops,
// and returns its URL. The pool carries the benchmark's counting tracer,
// as the servers' does, so that the cost phase counts bare's round trips
// too.
func (b *bench) startBare(ctx context.Context, stops *[]func()) (string, error) {
	cfg, err := pgxpool.ParseConfig(b.dbURL)
	if err != nil {
		return "", err
	}
	cfg.MaxConns = poolMaxConns
	cfg.ConnConfig.Tracer = b.counters
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return "", fmt.Errorf("bare: %w", err)
	}
	b.barePool = pool
	*stops = append(*stops, pool.Close)
	if err := pool.Ping(ctx); err != nil {
		return "", fmt.Errorf("bare: %w", err)
	}
	return listen(bareHandler(pool, b.creds.AccountID, bareInsert), stops)
}

// upstreamTable is the table of the upstream that writes (startWriting):
// the orders table's shape and indexes, so that its INSERT is bare's.
const upstreamTable = "upstream_orders"

// startWriting starts the upstream a real POST has, for the proxy phase:
// the hand-written endpoint, writing each order with one durable INSERT
// into a table of its own (upstreamTable) through a pool of its own. The
// pool carries no counting tracer, so that the gateway's round trips are
// counted alone; it commits synchronously whatever the server's default,
// as an API that promises an order is kept does.
func (b *bench) startWriting(ctx context.Context, stops *[]func()) (http.Handler, error) {
	cfg, err := pgxpool.ParseConfig(b.dbURL)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = poolMaxConns
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	*stops = append(*stops, pool.Close)
	if _, err := pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+upstreamTable+" (LIKE orders INCLUDING ALL)"); err != nil {
		return nil, fmt.Errorf("upstream: create %s: %w", upstreamTable, err)
	}
	return bareHandler(pool, b.creds.AccountID, strings.Replace(bareInsert, "INTO orders ", "INTO "+upstreamTable+" ", 1)), nil
}
