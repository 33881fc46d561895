package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/google/uuid"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/orders"
	"github.com/oncekey/oncekey/internal/service/payments"
	"github.com/oncekey/oncekey/internal/service/provider"
	"github.com/oncekey/oncekey/internal/service/store/memory"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
	"github.com/oncekey/oncekey/internal/wire/problem"
)

// FuzzHandler sends random requests (method, path, Idempotency-Key,
// Content-Type, body, and which of two accounts sends them) to the whole
// handler on the in-memory store. Whatever arrives, the service never
// answers 5xx (a panic would be a 500 from the recoverer), and never replays
// a response to an account that had not itself sent that key before.
// The seeds in testdata/fuzz/FuzzHandler run in make test; make fuzz runs it
// longer.
func FuzzHandler(f *testing.F) {
	store := memory.New()
	sandbox := httptest.NewServer(provider.NewServer(provider.NewMemoryStore(), provider.Faults{}, slog.New(slog.DiscardHandler)))
	f.Cleanup(sandbox.Close)
	worker := payments.NewWorker(payments.WorkerConfig{
		Repo: store, Render: httpapi.PaymentOutcome, RenderRefund: httpapi.RefundOutcome,
		Provider: provider.NewClient(sandbox.URL, nil),
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		payments.RunLocal(ctx, store, worker, fastPolicy, 2, slog.New(slog.DiscardHandler))
	}()
	f.Cleanup(func() { cancel(); <-done })
	handler, err := httpapi.New(httpapi.Config{
		Backend: store, Payments: payments.NewService(store), Wait: 50 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		f.Fatal(err)
	}
	var accounts [2]auth.Credentials
	for i := range accounts {
		if accounts[i], err = auth.CreateAccount(ctx, store, "fuzz", ""); err != nil {
			f.Fatal(err)
		}
	}
	order, err := orders.NewService(store).Create(ctx, store, accounts[0].AccountID, orders.NewOrder{Items: []orders.Item{{SKU: "s", Qty: 1}}, Amount: 1, Currency: "RUB"})
	if err != nil {
		f.Fatal(err)
	}
	sent := [2]map[string]bool{{}, {}} // keys each account has sent

	f.Add("POST", "/orders", "k1", "application/json", []byte(seedBody), false)
	f.Add("POST", "/orders", "k1", "application/json", []byte(seedBody), true)
	f.Add("POST", "/payments", "k2", "application/json", []byte(`{"order_id":"`+order.ID.String()+`","amount":5,"currency":"RUB"}`), false)
	f.Add("POST", "/bonus/debits", "k3", "application/json", []byte(`{"amount":5,"reason":"x"}`), true)
	f.Add("GET", "/payments/"+uuid.NewString(), "", "", []byte(nil), false)
	f.Add("PATCH", "/orders/x", "k", "text/plain", []byte("\xff\xfe"), false)
	f.Fuzz(func(t *testing.T, method, path, key, contentType string, body []byte, asB bool) {
		req, err := http.NewRequest(method, "http://oncekey.test"+path, bytes.NewReader(body))
		if err != nil || !strings.HasPrefix(path, "/") {
			return // not a request a client could send
		}
		who := 0
		if asB {
			who = 1
		}
		req.Header.Set("Authorization", "Bearer "+accounts[who].APIKey)
		if key != "" {
			req.Header.Set(idempotency.HeaderKey, key)
		}
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)

		if rec.Code >= 500 {
			t.Fatalf("%s %q (key %q, %q, body %q) answered %d: %s", method, path, key, contentType, body, rec.Code, rec.Body)
		}
		if rec.Header().Get(idempotency.HeaderReplayed) == "true" && !sent[who][key] {
			t.Fatalf("account %d got a replay for key %q it never sent: %s", who, key, rec.Body)
		}
		if key != "" {
			sent[who][key] = true
		}
	})
}

// FuzzOperationsOnPostgres sends the unsafe operations bodies with random
// values in every field (strings of any content, numbers of any size) to
// the whole service on PostgreSQL, which refuses values memory takes (a NUL
// in text, say). A request either breaks the contract, and must get a 4xx
// problem (kin-openapi, on the document alone, is the judge), or passes
// it, and then it must never get a 5xx: nothing here is down. The seeds
// run in make test; make fuzz runs it longer, and .ci/run briefly.
func FuzzOperationsOnPostgres(f *testing.F) {
	breaks := contractJudge(f)
	store := postgres.New(testdb.Pool(f), nil)
	handler, err := httpapi.New(httpapi.Config{Backend: store, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	ctx := context.Background()
	creds, err := auth.CreateAccount(ctx, store, "fuzz", "")
	if err != nil {
		f.Fatal(err)
	}
	operations := []string{"/orders", "/bonus/credits", "/bonus/debits"}
	f.Add(uint8(0), "SKU-1", int64(2), int64(1200), "RUB")
	f.Add(uint8(0), "a\x00b", int64(1), int64(1), "RUB")
	f.Add(uint8(0), "\U0001F600 \u2028 \\ \"", int64(2147483647), int64(999999999999999), "EUR")
	f.Add(uint8(1), "welcome", int64(0), int64(1000000000000000), "")
	f.Add(uint8(1), "x\x00", int64(0), int64(5), "")
	f.Add(uint8(2), strings.Repeat("r", 500), int64(0), int64(1), "")
	f.Fuzz(func(t *testing.T, op uint8, text string, qty, amount int64, currency string) {
		var body any = map[string]any{"amount": amount, "reason": text}
		path := operations[int(op)%len(operations)]
		if path == "/orders" {
			body = map[string]any{"items": []any{map[string]any{"sku": text, "qty": qty}}, "amount": amount, "currency": currency}
		}
		raw, err := json.Marshal(body)
		if err != nil {
			return // not JSON: the other fuzz target sends such bodies
		}
		req, err := http.NewRequest(http.MethodPost, "http://oncekey.test"+path, bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+creds.APIKey)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idempotency.HeaderKey, uuid.NewString())
		refused := breaks(req, raw)
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		switch {
		case rec.Code >= 500:
			t.Fatalf("POST %s %s answered %d: %s", path, raw, rec.Code, rec.Body)
		case refused != nil && (rec.Code < 400 || rec.Header().Get("Content-Type") != problem.ContentType):
			t.Fatalf("POST %s %s breaks the contract (%v) but was answered %d: %s", path, raw, refused, rec.Code, rec.Body)
		}
	})
}

// contractJudge returns what openapi.yaml alone says of a request with
// body: nil when it keeps the contract, else why not. It is kin-openapi on
// the document, apart from the service's own front door.
func contractJudge(tb testing.TB) func(r *http.Request, body []byte) error {
	tb.Helper()
	doc, err := httpapi.LoadSpec()
	if err != nil {
		tb.Fatal(err)
	}
	doc.Servers = openapi3.Servers{{URL: "http://oncekey.test"}}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		tb.Fatal(err)
	}
	return func(r *http.Request, body []byte) error {
		route, params, err := router.FindRoute(r)
		if err != nil {
			return err
		}
		probe := r.Clone(r.Context())
		probe.Body = io.NopCloser(bytes.NewReader(body))
		return openapi3filter.ValidateRequest(r.Context(), &openapi3filter.RequestValidationInput{
			Request: probe, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc},
		})
	}
}
