package client_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"

	"github.com/oncekey/oncekey/client"
	"github.com/oncekey/oncekey/gen/api"
)

// Idempotent knows nothing of Oncekey's API: the attempt sends any request
// with the operation's one key, and it is retried on a network error, a
// 5xx or a 202. Here, a Stripe-shaped charge (a form body) against an API
// that answers 500, then 200: BaseURL and APIKey are that API's, and the
// attempt sets its own credentials, as Idempotent leaves the request to it.
func ExampleClient_Idempotent_anotherAPI() {
	var calls atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			http.Error(w, `{"error":{"type":"api_error"}}`, http.StatusInternalServerError)
			return
		}
		_ = r.ParseForm()
		fmt.Fprintf(w, `{"id":"ch_1","amount":%s,"key":%q}`, r.PostForm.Get("amount"), r.Header.Get("Idempotency-Key"))
	}))
	defer api.Close()

	c, err := client.New(client.Config{BaseURL: api.URL, APIKey: "sk_test_123", NewKey: func() string { return "charge-order-42" }})
	if err != nil {
		log.Fatal(err)
	}
	form := url.Values{"amount": {"1200"}, "currency": {"eur"}, "source": {"tok_visa"}}
	var charge string
	err = c.Idempotent(context.Background(), func(ctx context.Context, key string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, api.URL+"/v1/charges", strings.NewReader(form.Encode()))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer sk_test_123")
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err // a network error: retried with the same key
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if resp.StatusCode >= 300 {
			return resp, &client.ProblemError{Status: resp.StatusCode} // a 5xx is retried, a 4xx is final
		}
		charge = string(body)
		return resp, err
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(calls.Load(), "attempts:", charge)
	// Output: 2 attempts: {"id":"ch_1","amount":1200,"key":"charge-order-42"}
}

// A journal keeps each operation's key beyond the process. Here the first
// "process" sends an order under an intent and loses the answer (the
// connection drops after the server created it, as if the process had been
// killed); the next one opens the same journal, finds the operation
// pending, resumes it with its own key (the server replays its answer:
// still one order) and then runs the intent again, answered from the
// journal without a request.
func ExampleClient_Intent() {
	var created, requests atomic.Int32
	orders := map[string]string{} // key → order, as the server stores them
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		key := r.Header.Get("Idempotency-Key")
		if _, ok := orders[key]; !ok {
			orders[key] = fmt.Sprintf(`{"id":"ord_%d","amount":1200,"currency":"RUB","items":[],"status":"created"}`, created.Add(1))
			if created.Load() == 1 { // the first answer is lost
				conn, _, _ := http.NewResponseController(w).Hijack()
				_ = conn.Close()
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, orders[key])
	}))
	defer srv.Close()
	dir, err := os.MkdirTemp("", "journal")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "oncekey.journal")
	ctx := context.Background()
	order := api.NewOrder{Items: []api.OrderItem{{Sku: "SKU-1", Qty: 2}}, Amount: 1200, Currency: "RUB"}

	// The first process: one attempt, and its answer never comes.
	journal, err := client.OpenFileJournal(ctx, path, client.FileJournalOptions{})
	if err != nil {
		log.Fatal(err)
	}
	c, err := client.New(client.Config{BaseURL: srv.URL, APIKey: "ok_local_demo", Journal: journal, MaxAttempts: 1})
	if err != nil {
		log.Fatal(err)
	}
	_, err = c.Intent("checkout cart 123").CreateOrder(ctx, order)
	fmt.Println("first run failed:", err != nil)
	_ = journal.Close()

	// The next process: resume what is pending, then run the intent again.
	journal, err = client.OpenFileJournal(ctx, path, client.FileJournalOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer journal.Close()
	c, err = client.New(client.Config{BaseURL: srv.URL, APIKey: "ok_local_demo", Journal: journal})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("pending:", len(c.Pending()))
	outcomes, err := c.Resume(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, o := range outcomes {
		fmt.Println("resumed", o.Entry.Intent+":", o.Kind, o.Status)
	}
	again, err := c.Intent("checkout cart 123").CreateOrder(ctx, order)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("order:", again.Id, "created:", created.Load(), "requests:", requests.Load())
	// Output:
	// first run failed: true
	// pending: 1
	// resumed checkout cart 123: answered 201
	// order: ord_1 created: 1 requests: 2
}
