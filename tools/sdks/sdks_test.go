package sdks_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/stripe/stripe-go/v82"
)

// chargeRun is one run of an SDK: its calls, made at once (or one after
// the other when sequential), each by a client of its own configured as
// here.
type chargeRun struct {
	URL               string       `json:"url"`
	APIKey            string       `json:"apiKey"`
	TimeoutMS         int          `json:"timeout"`
	MaxNetworkRetries int          `json:"maxNetworkRetries"`
	Sequential        bool         `json:"sequential"`
	Calls             []chargeCall `json:"calls"`
}

// chargeCall is one charge an application asks its SDK for.
type chargeCall struct {
	Amount   int64             `json:"amount"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// IdempotencyKey is the application's own; empty, the SDK makes one.
	IdempotencyKey string `json:"idempotencyKey,omitempty"`
	// StartAfterMS delays the call from the start of the run.
	StartAfterMS int `json:"startAfterMs,omitempty"`
}

// callResult is what a call ended in: the charge the application got (OK
// and Body), or the error the SDK raised.
type callResult struct {
	Key      string          `json:"key"`      // the Idempotency-Key it was sent under
	Attempts int             `json:"attempts"` // HTTP requests the SDK sent for it
	MS       int             `json:"ms"`
	OK       bool            `json:"ok"`
	Body     json.RawMessage `json:"body"`
	Error    *sdkError       `json:"error"`
}

// sdkError is an error an SDK raised, as the application sees it.
type sdkError struct {
	Class      string `json:"class"` // the SDK's error class (Node) or Go type
	Type       string `json:"type"`  // Stripe's error type (the body's error.type), where the SDK read one
	StatusCode int    `json:"statusCode"`
	Code       string `json:"code"`
	Message    string `json:"message"`
}

func (e *sdkError) String() string {
	s := e.Class
	if e.Type != "" && e.Type != e.Class {
		s += " " + e.Type
	}
	if e.StatusCode != 0 {
		s += fmt.Sprint(" ", e.StatusCode)
	}
	return s
}

// sdk is an official SDK that makes its own Idempotency-Keys and retries.
type sdk struct {
	name   string
	charge func(ctx context.Context, run chargeRun) ([]callResult, error)
	// idempotencyError is the class of the SDK's error for a 422 of
	// Stripe's type idempotency_error. Stripe's Node SDK raises
	// StripeIdempotencyError for that type only with a 400 or a 404 (its
	// generateV1Error: Stripe's own API answers a reused key with 400), and
	// StripeAPIError, whose rawType says idempotency_error, for any other
	// status.
	idempotencyError string
	// retriesStripeErrors: the SDK retries a 409 or a 5xx whose body is in
	// Stripe's error shape. Stripe's Node SDK retries every 409 and 5xx;
	// stripe-go retries no answer in Stripe's error shape (but a 429
	// lock_timeout), only failed connections and bodies it cannot read as
	// Stripe's errors.
	retriesStripeErrors bool
}

var sdks = []sdk{
	{name: "node", charge: nodeCharges, idempotencyError: "StripeAPIError", retriesStripeErrors: true},
	{name: "go", charge: goCharges, idempotencyError: "*stripe.Error"},
}

// nodeCharges runs charges.mjs: Stripe's Node SDK, installed by npm ci in
// this directory.
func nodeCharges(ctx context.Context, run chargeRun) ([]callResult, error) {
	if _, err := os.Stat("node_modules/stripe/package.json"); err != nil {
		return nil, fmt.Errorf("Stripe's Node SDK is not installed: run npm ci in tools/sdks (make test/sdks does): %w", err)
	}
	input, err := json.Marshal(run)
	if err != nil {
		return nil, err
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "node", "charges.mjs", string(input))
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("node charges.mjs: %w\n%s", err, &stderr)
	}
	var results []callResult
	if err := json.Unmarshal(stdout.Bytes(), &results); err != nil {
		return nil, fmt.Errorf("node charges.mjs printed %q: %w\n%s", &stdout, err, &stderr)
	}
	return results, nil
}

// goCharges makes the charges with stripe-go, each call on a client of its
// own whose transport counts its attempts.
func goCharges(ctx context.Context, run chargeRun) ([]callResult, error) {
	results := make([]callResult, len(run.Calls))
	one := func(i int) {
		call := run.Calls[i]
		// pacing: each call starts when the run says (a duplicate sent
		// while the first is in flight), as charges.mjs's calls do.
		time.Sleep(time.Duration(call.StartAfterMS) * time.Millisecond)
		sent := &attemptCounter{next: &http.Transport{}}
		sc := stripe.NewClient(run.APIKey, stripe.WithBackends(stripe.NewBackendsWithConfig(&stripe.BackendConfig{
			URL:               stripe.String(run.URL),
			MaxNetworkRetries: stripe.Int64(int64(run.MaxNetworkRetries)),
			HTTPClient:        &http.Client{Timeout: time.Duration(run.TimeoutMS) * time.Millisecond, Transport: sent},
			LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
		})))
		params := &stripe.ChargeCreateParams{
			Amount:   stripe.Int64(call.Amount),
			Currency: stripe.String("usd"),
			Source:   &stripe.PaymentSourceSourceParams{Token: stripe.String("tok_visa")},
			Metadata: call.Metadata,
		}
		if call.IdempotencyKey != "" {
			params.SetIdempotencyKey(call.IdempotencyKey)
		}
		start := time.Now()
		charge, err := sc.V1Charges.Create(ctx, params)
		r := callResult{MS: int(time.Since(start).Milliseconds())}
		r.Key, r.Attempts = sent.seen()
		if err != nil {
			r.Error = goError(err)
		} else {
			r.OK, r.Body = true, charge.LastResponse.RawJSON
		}
		results[i] = r
	}
	if run.Sequential {
		for i := range run.Calls {
			one(i)
		}
		return results, nil
	}
	var wg sync.WaitGroup
	for i := range run.Calls {
		wg.Go(func() { one(i) })
	}
	wg.Wait()
	return results, nil
}

// goError is what stripe-go raised: a *stripe.Error when it read Stripe's
// error shape, another error otherwise.
func goError(err error) *sdkError {
	var se *stripe.Error
	if errors.As(err, &se) {
		return &sdkError{Class: "*stripe.Error", Type: string(se.Type), StatusCode: se.HTTPStatusCode, Code: string(se.Code), Message: se.Msg}
	}
	return &sdkError{Class: fmt.Sprintf("%T", err), Message: err.Error()}
}

// attemptCounter counts the requests stripe-go sends for one call, and the
// key it sends them under.
type attemptCounter struct {
	next http.RoundTripper

	mu       sync.Mutex
	key      string
	attempts int
}

func (c *attemptCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.attempts++
	c.key = req.Header.Get("Idempotency-Key")
	c.mu.Unlock()
	return c.next.RoundTrip(req)
}

func (c *attemptCounter) seen() (key string, attempts int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.key, c.attempts
}
