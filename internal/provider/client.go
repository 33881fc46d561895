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
// client returns wraps exactly one of them (or is a local mistake such as a
// malformed base URL).
var (
	// ErrUnavailable is transient: a 5xx, 408 or 429, a timeout, a refused
	// or dropped connection, an answer cut off mid-body. The charge may or
	// may not have been made, so the caller retries with the SAME key (or
	// reconciles with Lookup); a new key could charge twice.
	ErrUnavailable = errors.New("provider unavailable")
	// ErrRejected is a permanent refusal: a 4xx other than 404, 408 and 429,
	// such as 400 (invalid request) or 409 (the key was used with another
	// body). Retrying the same request cannot help.
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
func NewClient(baseURL string, hc *http.Client) *Client {
	if hc == nil {
		hc = &http.Client{Timeout: DefaultClientTimeout}
	}
	return &Client{base: strings.TrimRight(baseURL, "/"), hc: hc}
}

// Charge charges req under idempotencyKey. A new charge and a replay both
// return the charge; a declined charge is not an error either: read its
// Status.
func (c *Client) Charge(ctx context.Context, idempotencyKey string, req ChargeRequest) (Charge, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return Charge{}, fmt.Errorf("provider: encode charge request: %w", err)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v1/charges", bytes.NewReader(body))
	if err != nil {
		return Charge{}, fmt.Errorf("provider: %w", err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Idempotency-Key", idempotencyKey)
	var ch Charge
	if err := c.do(hreq, &ch); err != nil {
		return Charge{}, err
	}
	return ch, nil
}

// Lookup returns the charge stored under idempotencyKey, or ErrNotFound if
// none is: after an ErrUnavailable it tells the caller whether the lost
// request charged.
func (c *Client) Lookup(ctx context.Context, idempotencyKey string) (Charge, error) {
	var ch Charge
	if err := c.get(ctx, "/v1/charges", url.Values{"idempotency_key": {idempotencyKey}}, &ch); err != nil {
		return Charge{}, err
	}
	return ch, nil
}

// ChargesByReference returns every charge made with that reference, under
// any key, oldest first. Tests count charges per payment with it.
func (c *Client) ChargesByReference(ctx context.Context, reference string) ([]Charge, error) {
	var list chargeList
	if err := c.get(ctx, "/v1/charges", url.Values{"reference": {reference}}, &list); err != nil {
		return nil, err
	}
	if list.Charges == nil {
		list.Charges = []Charge{}
	}
	return list.Charges, nil
}

// Stats returns the server's counters.
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	var st Stats
	if err := c.get(ctx, "/v1/stats", nil, &st); err != nil {
		return Stats{}, err
	}
	return st, nil
}

func (c *Client) get(ctx context.Context, path string, query url.Values, dst any) error {
	u := c.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("provider: %w", err)
	}
	return c.do(hreq, dst)
}

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

	switch s := resp.StatusCode; {
	case s == http.StatusOK || s == http.StatusCreated:
		if err := json.NewDecoder(io.LimitReader(resp.Body, maxAnswerBytes)).Decode(dst); err != nil {
			// The status arrived but the body did not: as good as no answer.
			return fmt.Errorf("%w: %s: read answer: %w", ErrUnavailable, op, err)
		}
		return nil
	case s == http.StatusNotFound:
		return fmt.Errorf("%w (%s: %s)", ErrNotFound, op, describe(resp))
	case s == http.StatusRequestTimeout || s == http.StatusTooManyRequests || s >= 500:
		return fmt.Errorf("%w: %s: %s", ErrUnavailable, op, describe(resp))
	case s >= 400:
		return fmt.Errorf("%w: %s: %s", ErrRejected, op, describe(resp))
	default:
		// Anything else (a redirect not followed, 202, 204) is not an answer
		// the API gives. Retrying with the same key is always safe, so it
		// counts as unavailable rather than as a verdict.
		return fmt.Errorf("%w: %s: unexpected %s", ErrUnavailable, op, resp.Status)
	}
}

// describe summarises an error answer: its status and, if the body is a
// problem document, the problem's type and detail (shortened).
func describe(resp *http.Response) string {
	out := resp.Status
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt != problemContentType {
		return out
	}
	var p problem
	if json.NewDecoder(io.LimitReader(resp.Body, 4<<10)).Decode(&p) != nil {
		return out
	}
	if p.Type != "" {
		out += " " + strings.TrimPrefix(p.Type, problemTypeBase)
	}
	if p.Detail != "" {
		const maxDetail = 200
		d := p.Detail
		if len(d) > maxDetail {
			d = d[:maxDetail] + "…"
		}
		out += ": " + d
	}
	return out
}
