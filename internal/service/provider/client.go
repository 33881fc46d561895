package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// The client's errors, one per thing the caller does next. Every error the
// client returns wraps exactly one of them or ErrNotFound (or is a local
// mistake such as a malformed base URL); a refused refund wraps one of the
// refund refusals too (ErrChargeNotFound, ErrChargeNotRefundable,
// ErrRefundExceedsCharge), besides ErrRejected.
var (
	// ErrUnavailable is transient: a 5xx, 408 or 429, a timeout, a refused
	// or dropped connection, an answer cut off mid-body. The charge or
	// refund may or may not have been made, so the caller retries with the
	// SAME key (or reconciles with Lookup or LookupRefund); a new key could
	// charge or refund twice.
	ErrUnavailable = errors.New("provider unavailable")
	// ErrRejected is a permanent refusal: a 4xx other than 408, 429 and a
	// plain 404 (which is ErrNotFound), such as 400 (invalid request), 409
	// (the key was used with another body) or a refund refusal (404
	// charge-not-found, 409 charge-not-refundable, 422
	// refund-exceeds-charge). Retrying the same request cannot help.
	ErrRejected = errors.New("provider rejected the request")
)

// DefaultClientTimeout bounds each request when NewClient is given no
// http.Client. Without a bound, a provider that never answers would hold a
// worker forever.
const DefaultClientTimeout = 10 * time.Second

// maxAnswerBytes bounds what the client reads of an answer.
const maxAnswerBytes = 1 << 20

// Client talks to the sandbox's API. It is safe for concurrent use.
type Client struct {
	base string
	hc   *http.Client
}

// NewClient returns a client for the provider at baseURL (such as
// "http://127.0.0.1:8090"). hc nil means a client with DefaultClientTimeout.
// The client follows no redirect, whatever hc would: the provider's API
// answers where it is asked, and a redirect followed would carry the
// Idempotency-Key to another host (a POST turned into a GET, at that).
func NewClient(baseURL string, hc *http.Client) *Client {
	if hc == nil {
		hc = &http.Client{Timeout: DefaultClientTimeout}
	}
	own := *hc
	own.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &Client{base: strings.TrimRight(baseURL, "/"), hc: &own}
}

// Charge charges req under idempotencyKey. A new charge and a replay both
// return the charge; a declined charge is not an error either: read its
// Status.
func (c *Client) Charge(ctx context.Context, idempotencyKey string, req ChargeRequest) (Charge, error) {
	return post[Charge](ctx, c, "/v1/charges", idempotencyKey, req)
}

// Lookup returns the charge stored under idempotencyKey, or ErrNotFound if
// none is: after an ErrUnavailable it tells the caller whether the lost
// request charged.
func (c *Client) Lookup(ctx context.Context, idempotencyKey string) (Charge, error) {
	return get[Charge](ctx, c, "/v1/charges", url.Values{"idempotency_key": {idempotencyKey}})
}

// ChargesByReference returns every charge made with that reference, under
// any key, oldest first. Tests count charges per payment with it.
func (c *Client) ChargesByReference(ctx context.Context, reference string) ([]Charge, error) {
	list, err := get[chargeList](ctx, c, "/v1/charges", url.Values{"reference": {reference}})
	if err != nil {
		return nil, err
	}
	return nonNil(list.Charges), nil
}

// Refund refunds req under idempotencyKey. A new refund and a replay both
// return the refund; a declined refund is not an error either: read its
// Status (it took nothing from the charge). A refusal wraps ErrRejected and
// ErrChargeNotFound, ErrChargeNotRefundable or ErrRefundExceedsCharge; it
// stored nothing, so the key is free to be sent again.
func (c *Client) Refund(ctx context.Context, idempotencyKey string, req RefundRequest) (Refund, error) {
	return post[Refund](ctx, c, "/v1/refunds", idempotencyKey, req)
}

// LookupRefund returns the refund stored under idempotencyKey, or
// ErrNotFound if none is: after an ErrUnavailable it tells the caller
// whether the lost request refunded.
func (c *Client) LookupRefund(ctx context.Context, idempotencyKey string) (Refund, error) {
	return get[Refund](ctx, c, "/v1/refunds", url.Values{"idempotency_key": {idempotencyKey}})
}

// RefundsByReference returns every refund made with that reference, under
// any key, oldest first, as ChargesByReference does for charges.
func (c *Client) RefundsByReference(ctx context.Context, reference string) ([]Refund, error) {
	list, err := get[refundList](ctx, c, "/v1/refunds", url.Values{"reference": {reference}})
	if err != nil {
		return nil, err
	}
	return nonNil(list.Refunds), nil
}

// Stats returns the server's counters.
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	return get[Stats](ctx, c, "/v1/stats", nil)
}

// post sends req as JSON to path under idempotencyKey and decodes the
// answer as a T; the zero T with any error.
func post[T any](ctx context.Context, c *Client, path, idempotencyKey string, req any) (T, error) {
	var v T
	body, err := json.Marshal(req)
	if err != nil {
		return v, fmt.Errorf("provider: encode request: %w", err)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(body))
	if err != nil {
		return v, fmt.Errorf("provider: %w", err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Idempotency-Key", idempotencyKey)
	if err := c.do(hreq, &v); err != nil {
		var zero T
		return zero, err
	}
	return v, nil
}

// get fetches path with query and decodes the answer as a T; the zero T
// with any error.
func get[T any](ctx context.Context, c *Client, path string, query url.Values) (T, error) {
	var v T
	u := c.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return v, fmt.Errorf("provider: %w", err)
	}
	if err := c.do(hreq, &v); err != nil {
		var zero T
		return zero, err
	}
	return v, nil
}

// nonNil makes a list that the answer left null an empty one: "none" is
// always an empty slice, never nil.
func nonNil[T any](list []T) []T {
	if list == nil {
		return []T{}
	}
	return list
}

// refusedError is a refund refusal: errors.Is finds both ErrRejected and
// the refusal's sentinel, and its text is the one line every rejection has.
type refusedError struct {
	msg  string
	kind error
}

func (e *refusedError) Error() string   { return e.msg }
func (e *refusedError) Unwrap() []error { return []error{ErrRejected, e.kind} }

// do sends hreq and decodes a 200 or 201 into dst, mapping every other
// outcome onto the package's errors. Error messages carry the status and
// the problem's type and detail, never the raw body: a provider's error
// body may echo what it was sent.
func (c *Client) do(hreq *http.Request, dst any) error {
	op := hreq.Method + " " + hreq.URL.Path
	resp, err := c.hc.Do(hreq)
	if err != nil {
		// Transport failures, timeouts and the caller's own cancellation all
		// leave the outcome unknown; errors.Is still finds context.Canceled.
		return fmt.Errorf("%w: %s: %w", ErrUnavailable, op, err)
	}
	defer func() {
		// Drain a little so the connection can be reused, then close.
		_, _ = io.CopyN(io.Discard, resp.Body, 4<<10)
		_ = resp.Body.Close()
	}()

	s := resp.StatusCode
	if s == http.StatusOK || s == http.StatusCreated {
		if err := json.NewDecoder(io.LimitReader(resp.Body, maxAnswerBytes)).Decode(dst); err != nil {
			// The status arrived but the body did not: as good as no answer.
			return fmt.Errorf("%w: %s: read answer: %w", ErrUnavailable, op, err)
		}
		return nil
	}
	if s < 400 {
		// Anything else (a redirect, which is never followed, 202, 204) is
		// not an answer the API gives. Retrying with the same key is always safe, so it
		// counts as unavailable rather than as a verdict.
		return fmt.Errorf("%w: %s: unexpected %s", ErrUnavailable, op, resp.Status)
	}
	desc, slug := describe(resp)
	if s < 500 {
		// A refusal is known by its problem type, not its status alone: a
		// refund's 404 for its charge is not a lookup's 404 for its key.
		for _, r := range refusals {
			if slug == r.slug {
				return &refusedError{msg: fmt.Sprintf("%v: %s: %s", ErrRejected, op, desc), kind: r.err}
			}
		}
	}
	switch {
	case s == http.StatusNotFound:
		return fmt.Errorf("%w (%s: %s)", ErrNotFound, op, desc)
	case s == http.StatusRequestTimeout || s == http.StatusTooManyRequests || s >= 500:
		return fmt.Errorf("%w: %s: %s", ErrUnavailable, op, desc)
	default:
		return fmt.Errorf("%w: %s: %s", ErrRejected, op, desc)
	}
}

// describe summarises an error answer: its status and, if the body is a
// problem document, the problem's type and detail (shortened). It returns
// the type's slug apart too (empty when there is none).
func describe(resp *http.Response) (desc, slug string) {
	out := resp.Status
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt != problemContentType {
		return out, ""
	}
	var p problem
	if json.NewDecoder(io.LimitReader(resp.Body, 4<<10)).Decode(&p) != nil {
		return out, ""
	}
	if p.Type != "" {
		out += " " + strings.TrimPrefix(p.Type, problemTypeBase)
		// Only the sandbox's own types have slugs the client acts on.
		if rest, ok := strings.CutPrefix(p.Type, problemTypeBase); ok {
			slug = rest
		}
	}
	if p.Detail != "" {
		const maxDetail = 200
		d := p.Detail
		if len(d) > maxDetail {
			d = d[:maxDetail] + "…"
		}
		out += ": " + d
	}
	return out, slug
}
