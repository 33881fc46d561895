// Package client is the Go SDK for Oncekey: the generated client in gen/api
// plus what every caller of an exactly-once API needs and tends to get
// wrong by hand — one Idempotency-Key per logical operation, kept across
// every retry of it, and retries with exponential backoff and jitter for the
// answers where retrying is safe and useful.
//
// Retried: network errors (the request may or may not have reached the
// server: the key makes the retry safe either way), 5xx (including 503) and
// 202 request-in-progress, honouring Retry-After. Not retried: 4xx, which
// will not change by sending the same request again, and the 202 of a long
// operation (a payment, a refund) that carries the accepted, pending resource: that is
// the operation's answer, and its resource is polled with a GET.
package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/gen/api"
	"github.com/oncekey/oncekey/gen/apiclient"
)

// Config configures a Client. BaseURL and APIKey are required.
type Config struct {
	BaseURL string
	APIKey  string
	// HTTPClient sends the requests (default: a client with a 30s timeout).
	HTTPClient *http.Client
	// MaxAttempts bounds the tries of one operation (default 5).
	MaxAttempts int
	// BaseDelay and MaxDelay shape the backoff: attempt n waits a random
	// duration in [0, min(MaxDelay, BaseDelay·2^n)) ("full jitter"), or
	// the server's Retry-After when it sends one (capped by MaxDelay).
	// Defaults 100ms and 5s.
	BaseDelay time.Duration
	MaxDelay  time.Duration
	// NewKey makes the Idempotency-Key of each logical operation
	// (default: a random UUID v4).
	NewKey func() string
	// Journal, when set, keeps each operation's key beyond the process
	// (see Journal): written before the first attempt leaves, so a crash
	// between sending and reading the answer does not lose it; it enables
	// Intent, Pending and Resume. Nil keeps keys in memory only.
	Journal Journal
	// KeyRetention is how long a server is taken to keep a key when it
	// has not advertised its own (Idempotency-TTL): an operation never
	// answered and older than that is not resent. Default 24h, less than
	// the service's default of 48h, to err on the side of not resending.
	KeyRetention time.Duration
}

// Client calls Oncekey.
type Client struct {
	api *apiclient.Client
	cfg Config
	// intent is the name Intent gave this copy's operations.
	intent  string
	intents *intentLocks
}

// New returns a client for cfg.
func New(cfg Config) (*Client, error) {
	if cfg.BaseURL == "" || cfg.APIKey == "" {
		return nil, errors.New("client: BaseURL and APIKey are required")
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 30 * time.Second}
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 5
	}
	if cfg.BaseDelay <= 0 {
		cfg.BaseDelay = 100 * time.Millisecond
	}
	if cfg.MaxDelay <= 0 {
		cfg.MaxDelay = 5 * time.Second
	}
	if cfg.NewKey == nil {
		cfg.NewKey = uuid.NewString
	}
	if cfg.KeyRetention <= 0 {
		cfg.KeyRetention = defaultKeyRetention
	}
	sdk := &Client{cfg: cfg, intents: &intentLocks{locks: map[string]*intentLock{}, inflight: map[string]bool{}}}
	if cfg.Journal != nil {
		// The journal sits in the transport, where it sees each request's
		// body and each answer as sent and received; a copy of the
		// caller's *http.Client, so theirs is left as it was.
		httpClient := *cfg.HTTPClient
		next := httpClient.Transport
		if next == nil {
			next = http.DefaultTransport
		}
		httpClient.Transport = &journalTransport{next: next, c: sdk}
		cfg.HTTPClient = &httpClient
		sdk.cfg.HTTPClient = &httpClient
	}
	c, err := apiclient.NewClient(cfg.BaseURL,
		apiclient.WithHTTPClient(cfg.HTTPClient),
		apiclient.WithRequestEditorFn(func(_ context.Context, r *http.Request) error {
			r.Header.Set("Authorization", "Bearer "+cfg.APIKey)
			return nil
		}))
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	sdk.api = c
	return sdk, nil
}

// ProblemError is a non-success answer, with the server's RFC 9457 problem
// when it sent one. Branch on Problem.Type.
type ProblemError struct {
	Status  int
	Problem api.Problem
}

// Error says the status and, when the server sent a problem, its type and
// detail.
func (e *ProblemError) Error() string {
	if e.Problem.Type == "" {
		return fmt.Sprintf("oncekey: HTTP %d", e.Status)
	}
	detail := e.Problem.Title
	if e.Problem.Detail != nil {
		detail = *e.Problem.Detail
	}
	return fmt.Sprintf("oncekey: HTTP %d %s: %s", e.Status, e.Problem.Type, detail)
}

// CreateOrder creates an order exactly once, however many attempts it
// takes: every attempt carries the same Idempotency-Key, so at most one of
// them creates the order and the others get its stored response.
func (c *Client) CreateOrder(ctx context.Context, in api.NewOrder) (*api.Order, error) {
	return once[api.Order](ctx, c, func(ctx context.Context, key string) (*http.Response, error) {
		return c.api.CreateOrder(ctx, &api.CreateOrderParams{IdempotencyKey: key}, in)
	})
}

// GetOrder returns one of the caller's orders.
func (c *Client) GetOrder(ctx context.Context, id string) (*api.Order, error) {
	return get[api.Order](c.api.GetOrder(ctx, id, nil))
}

// UpdateOrder changes one of the caller's unpaid orders exactly once, as
// CreateOrder creates one. patch is sent as a JSON Merge Patch
// (application/merge-patch+json): the fields it leaves nil keep their
// value, and Items, when set, replaces the items as a whole. It returns the
// order right after this change. A cancelled order, or one with a pending
// or succeeded payment, is a *ProblemError 409 order-not-modifiable.
func (c *Client) UpdateOrder(ctx context.Context, id string, patch api.OrderPatch) (*api.Order, error) {
	return once[api.Order](ctx, c, func(ctx context.Context, key string) (*http.Response, error) {
		return c.api.UpdateOrderWithApplicationMergePatchPlusJSONBody(ctx, id, &api.UpdateOrderParams{IdempotencyKey: key}, patch)
	})
}

// CancelOrder cancels one of the caller's unpaid orders exactly once, as
// CreateOrder creates one, and returns it cancelled (Status cancelled,
// CancelledAt set); an order cancelled before is returned as it is. An
// order with a pending or succeeded payment is a *ProblemError 409
// order-not-cancellable.
func (c *Client) CancelOrder(ctx context.Context, id string) (*api.Order, error) {
	return once[api.Order](ctx, c, func(ctx context.Context, key string) (*http.Response, error) {
		return c.api.CancelOrder(ctx, id, &api.CancelOrderParams{IdempotencyKey: key})
	})
}

// CreateRefund refunds part or all of one of the caller's succeeded
// payments exactly once, however many attempts it takes, as CreateOrder
// creates an order. A refund is a long operation: the service accepts it at
// once (202) and the provider refunds it later, so CreateRefund returns the
// refund as accepted, pending, or final when a retry came after it became
// final (200); poll GetRefund until it is succeeded or failed. A payment
// that has not succeeded is a *ProblemError 409 payment-not-refundable; a
// refund larger than what is left of the payment is 422
// refund-exceeds-payment, one refund too many 422 too-many-refunds.
func (c *Client) CreateRefund(ctx context.Context, paymentID string, in api.NewRefund) (*api.Refund, error) {
	return once[api.Refund](ctx, c, func(ctx context.Context, key string) (*http.Response, error) {
		return c.api.CreateRefund(ctx, paymentID, &api.CreateRefundParams{IdempotencyKey: key}, in)
	})
}

// GetRefund returns one of the caller's refunds. While it is pending, look
// again later (after the answer's Retry-After).
func (c *Client) GetRefund(ctx context.Context, id string) (*api.Refund, error) {
	return get[api.Refund](c.api.GetRefund(ctx, id, nil))
}

// ListRefunds returns every refund of one of the caller's payments, oldest
// first.
func (c *Client) ListRefunds(ctx context.Context, paymentID string) ([]api.Refund, error) {
	list, err := get[api.RefundList](c.api.ListRefunds(ctx, paymentID, nil))
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// ListOrders returns one page of the caller's orders, newest first: params
// nil for the first page of the default size; pass the page's NextCursor as
// params.Cursor for the next one (nil on the last page).
func (c *Client) ListOrders(ctx context.Context, params *api.ListOrdersParams) (*api.OrderPage, error) {
	return get[api.OrderPage](c.api.ListOrders(ctx, params))
}

// CreatePayment pays for one of the caller's orders exactly once, however
// many attempts it takes, as CreateOrder creates an order. A payment is a
// long operation: the service accepts it at once (202) and charges the
// provider later, so CreatePayment returns the payment as accepted,
// pending, or final when a retry came after it became final (200); poll
// GetPayment until it is succeeded or failed. An order is paid at most
// once whatever key each attempt carries: while it has a pending payment
// another is a *ProblemError 409 payment-in-progress, once it is paid 409
// order-already-paid; an amount or currency other than the order's is 422
// payment-amount-mismatch.
func (c *Client) CreatePayment(ctx context.Context, in api.NewPayment) (*api.Payment, error) {
	return once[api.Payment](ctx, c, func(ctx context.Context, key string) (*http.Response, error) {
		return c.api.CreatePayment(ctx, &api.CreatePaymentParams{IdempotencyKey: key}, in)
	})
}

// GetPayment returns one of the caller's payments. While it is pending,
// look again later (after the answer's Retry-After).
func (c *Client) GetPayment(ctx context.Context, id string) (*api.Payment, error) {
	return get[api.Payment](c.api.GetPayment(ctx, id, nil))
}

// CreateBonusCredit credits bonuses to the caller's balance exactly once,
// as CreateOrder creates an order, and returns the entry and the balance
// right after it. A credit that would take the balance beyond 10^18 is a
// *ProblemError 422 balance-limit-exceeded, stored under the key like a
// success: a new attempt needs a new call.
func (c *Client) CreateBonusCredit(ctx context.Context, in api.NewBonusEntry) (*api.BonusEntryResult, error) {
	return once[api.BonusEntryResult](ctx, c, func(ctx context.Context, key string) (*http.Response, error) {
		return c.api.CreateBonusCredit(ctx, &api.CreateBonusCreditParams{IdempotencyKey: key}, in)
	})
}

// CreateBonusDebit debits bonuses from the caller's balance exactly once,
// as CreateBonusCredit credits them. A debit larger than the balance is a
// *ProblemError 422 insufficient-funds, stored under the key: the same
// operation never succeeds later because credits arrived in between.
func (c *Client) CreateBonusDebit(ctx context.Context, in api.NewBonusEntry) (*api.BonusEntryResult, error) {
	return once[api.BonusEntryResult](ctx, c, func(ctx context.Context, key string) (*http.Response, error) {
		return c.api.CreateBonusDebit(ctx, &api.CreateBonusDebitParams{IdempotencyKey: key}, in)
	})
}

// GetBonusBalance returns the caller's bonus balance (0 before any credit).
func (c *Client) GetBonusBalance(ctx context.Context) (*api.BonusBalance, error) {
	return get[api.BonusBalance](c.api.GetBonusBalance(ctx, nil))
}

// GetHealth reports whether the service's process is up (GET /healthz).
func (c *Client) GetHealth(ctx context.Context) (*api.Health, error) {
	return get[api.Health](c.api.GetHealth(ctx))
}

// GetReadiness reports whether the service can serve (GET /readyz): its
// database answers. Not ready is a *ProblemError 503.
func (c *Client) GetReadiness(ctx context.Context) (*api.Health, error) {
	return get[api.Health](c.api.GetReadiness(ctx))
}

// GetSpec returns the contract the service enforces: its openapi.yaml, as
// it was built with.
func (c *Client) GetSpec(ctx context.Context) ([]byte, error) {
	return raw(c.api.GetSpec(ctx))
}

// GetDocs returns the service's API reference page (HTML, for browsers).
func (c *Client) GetDocs(ctx context.Context) ([]byte, error) {
	return raw(c.api.GetDocs(ctx))
}

// once runs one logical operation through Idempotent: send makes one
// attempt of it with the operation's key. It returns the final answer's
// body decoded as T.
func once[T any](ctx context.Context, c *Client, send func(ctx context.Context, key string) (*http.Response, error)) (*T, error) {
	var out *T
	err := c.Idempotent(ctx, func(ctx context.Context, key string) (*http.Response, error) {
		var resp *http.Response
		var err error
		out, resp, err = decode[T](send(ctx, key))
		return resp, err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// get is a request that is not retried (a GET): its answer's body decoded
// as T, or its problem.
func get[T any](resp *http.Response, err error) (*T, error) {
	out, _, err := decode[T](resp, err)
	return out, err
}

// raw is a request that is not retried and whose answer is not JSON (the
// contract, the reference page): its body as sent, or its problem.
func raw(resp *http.Response, err error) ([]byte, error) {
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("oncekey: read the answer: %w", err)
	}
	if err := problemOf(resp, body); err != nil {
		return nil, err
	}
	return body, nil
}

// Attempt is one try of an operation with the operation's key. It returns
// the HTTP response (nil on a network error) and an error: a *ProblemError
// for a non-2xx answer, or the transport's error.
type Attempt func(ctx context.Context, key string) (*http.Response, error)

// Idempotent runs one logical operation: it makes one Idempotency-Key and
// calls attempt with it until an answer is final, the attempts run out or
// ctx ends. Every operation of openapi.yaml has a method of its own (the
// unsafe ones run through this); use it for a request of your own shape,
// such as one with headers of your own.
//
// With Config.Journal, the key is journaled before the first attempt
// leaves, provided the attempt sends with Client.Do; under an Intent, a
// key journaled before is reused (see Intent).
func (c *Client) Idempotent(ctx context.Context, attempt Attempt) error {
	if c.cfg.Journal != nil {
		return c.journaled(ctx, attempt)
	}
	if c.intent != "" {
		return fmt.Errorf("oncekey: intent %q: an intent needs Config.Journal", c.intent)
	}
	return c.run(ctx, &operation{key: c.cfg.NewKey()}, attempt)
}

// run makes the attempts of op until an answer is final, the attempts run
// out or ctx ends.
func (c *Client) run(ctx context.Context, op *operation, attempt Attempt) error {
	key := op.key
	if c.cfg.Journal != nil {
		ctx = context.WithValue(ctx, operationKey{}, op)
	}
	var lastErr error
	for n := 0; n < c.cfg.MaxAttempts; n++ {
		resp, err := attempt(ctx, key)
		if op.journalErr != nil {
			return op.journalErr
		}
		retry, wait := c.classify(resp, err, n)
		if !retry {
			return err
		}
		lastErr = err
		if lastErr == nil { // 202: in progress, no error yet
			lastErr = &ProblemError{Status: resp.StatusCode}
		}
		if n == c.cfg.MaxAttempts-1 {
			break
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("oncekey: gave up after %d attempts with key %s: %w (last: %w)", n+1, key, ctx.Err(), lastErr)
		case <-timer.C:
		}
	}
	return fmt.Errorf("oncekey: gave up after %d attempts with key %s: %w", c.cfg.MaxAttempts, key, lastErr)
}

// classify decides whether attempt n's outcome is worth another try, and
// after how long.
func (c *Client) classify(resp *http.Response, err error, n int) (retry bool, wait time.Duration) {
	backoff := c.backoff(n)
	if resp == nil {
		return err != nil, backoff // network error: the key makes the retry safe
	}
	switch {
	case inProgress(resp), resp.StatusCode >= 500:
		if ra, ok := retryAfter(resp.Header.Get("Retry-After")); ok {
			return true, min(ra, c.cfg.MaxDelay)
		}
		return true, backoff
	default:
		return false, 0
	}
}

// backoff is full jitter: uniform in [0, min(MaxDelay, BaseDelay·2^n)).
func (c *Client) backoff(n int) time.Duration {
	ceiling := c.cfg.MaxDelay
	if n < 30 {
		ceiling = min(ceiling, c.cfg.BaseDelay<<n)
	}
	return time.Duration(rand.Int64N(int64(ceiling) + 1))
}

func retryAfter(v string) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0), true
	}
	return 0, false
}
