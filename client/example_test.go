package client_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"

	"github.com/oncekey/oncekey/client"
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
