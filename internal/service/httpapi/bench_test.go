package httpapi_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/orders"
	"github.com/oncekey/oncekey/internal/service/servicetest"
	servicestore "github.com/oncekey/oncekey/internal/service/store"
	"github.com/oncekey/oncekey/internal/service/store/memory"
)

// BenchmarkMiddlewareOverhead measures what the idempotency protocol adds
// to a request through the whole handler stack (gate, auth, routing,
// logging, metrics) on the in-memory store, without a network: "first"
// claims a fresh key and runs the operation, "replay" answers from the
// stored response, and "read" is a GET that does no idempotency work, the
// floor the other two are compared to. "baseline" is POST /orders on the
// same stack with a key store that keeps nothing (servicetest.KeepNothing)
// whose order writes go nowhere either: what the service costs around
// the write, as tools/bench's baseline mode measures it with PostgreSQL.
func BenchmarkMiddlewareOverhead(b *testing.B) {
	store := memory.New()
	build := func(keys idempotency.Store[servicestore.Deferred]) http.Handler {
		handler, err := httpapi.New(httpapi.Config{
			Backend: store, DeferredKeys: keys,
			// As serve wires it.
			Auth:   auth.NewCache(store, auth.DefaultCacheSize, auth.DefaultCacheTTL),
			Logger: slog.New(slog.DiscardHandler),
		})
		if err != nil {
			b.Fatalf("build the service: %v", err)
		}
		return handler
	}
	handler := build(nil)
	creds, err := auth.CreateAccount(context.Background(), store, "bench", "")
	if err != nil {
		b.Fatalf("create an account: %v", err)
	}

	// Requests are built inside the loops: ServeHTTP consumes the body.
	request := func(method, path, key, body string) *http.Request {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+creds.APIKey)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		if key != "" {
			req.Header.Set(idempotency.HeaderKey, key)
		}
		return req
	}
	serve := func(req *http.Request) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		return rec
	}
	// Each loop checks only the status, so that a broken handler cannot
	// benchmark fast; the full check is done once, before the loop.
	loop := func(b *testing.B, want int, req func(i int) *http.Request) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if rec := serve(req(i)); rec.Code != want {
				b.Fatalf("request %d: status %d, want %d: %s", i, rec.Code, want, rec.Body)
			}
			i++
		}
	}

	first := serve(request(http.MethodPost, "/orders", "bench-seed", seedBody))
	if first.Code != http.StatusCreated || first.Header().Get(idempotency.HeaderReplayed) != "" {
		b.Fatalf("first POST /orders: %d (replayed %q), want a fresh 201: %s",
			first.Code, first.Header().Get(idempotency.HeaderReplayed), first.Body)
	}
	var order struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(first.Body.Bytes(), &order); err != nil || order.ID == "" {
		b.Fatalf("decode the order %s: %v", first.Body, err)
	}

	runs := 0 // -count runs "first" again: each run has keys of its own
	b.Run("first", func(b *testing.B) {
		runs++
		prefix := "bench-first-" + strconv.Itoa(runs) + "-"
		loop(b, http.StatusCreated, func(i int) *http.Request {
			return request(http.MethodPost, "/orders", prefix+strconv.Itoa(i), seedBody)
		})
	})

	b.Run("baseline", func(b *testing.B) {
		handler := build(servicetest.KeepNothing(func(context.Context, orders.Order) error { return nil }))
		serve := func(req *http.Request) *httptest.ResponseRecorder {
			rec := httptest.NewRecorder()
			handler.ServeHTTP(rec, req)
			return rec
		}
		b.ReportAllocs()
		for b.Loop() {
			if rec := serve(request(http.MethodPost, "/orders", "bench-baseline", seedBody)); rec.Code != http.StatusCreated {
				b.Fatalf("baseline POST /orders: status %d, want 201: %s", rec.Code, rec.Body)
			}
		}
	})

	b.Run("replay", func(b *testing.B) {
		if rec := serve(request(http.MethodPost, "/orders", "bench-seed", seedBody)); rec.Code != http.StatusCreated || rec.Header().Get(idempotency.HeaderReplayed) != "true" {
			b.Fatalf("replayed POST /orders: %d (replayed %q), want 201 replayed: %s",
				rec.Code, rec.Header().Get(idempotency.HeaderReplayed), rec.Body)
		}
		loop(b, http.StatusCreated, func(int) *http.Request {
			return request(http.MethodPost, "/orders", "bench-seed", seedBody)
		})
	})

	b.Run("read", func(b *testing.B) {
		if rec := serve(request(http.MethodGet, "/orders/"+order.ID, "", "")); rec.Code != http.StatusOK {
			b.Fatalf("GET /orders/%s: %d, want 200: %s", order.ID, rec.Code, rec.Body)
		}
		loop(b, http.StatusOK, func(int) *http.Request {
			return request(http.MethodGet, "/orders/"+order.ID, "", "")
		})
	})
}
