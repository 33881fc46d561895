package provider_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/provider"

	"github.com/oncekey/oncekey/idempotency"
)

// TestClientErrors puts the client in front of answers the sandbox never
// gives but a real provider (or a proxy before it) might, and checks that
// each maps onto what the caller should do next.
func TestClientErrors(t *testing.T) {
	t.Parallel()
	const secret = "card=4242424242424242"
	tests := []struct {
		name        string
		status      int
		contentType string
		body        string
		want        error
	}{
		{"500 with a body echoing the request", 500, "text/plain", secret, provider.ErrUnavailable},
		{"502 from a proxy", 502, "text/html", "<h1>Bad Gateway</h1>", provider.ErrUnavailable},
		{"429 rate limited", 429, "application/problem+json", `{"status":429,"detail":"slow down"}`, provider.ErrUnavailable},
		{"408 request timeout", 408, "", "", provider.ErrUnavailable},
		{"400 with a problem", 400, "application/problem+json", `{"type":"https://oncekey.dev/problems/fakeprovider/validation-error","status":400,"detail":"amount must be positive"}`, provider.ErrRejected},
		{"422 without a problem", 422, "text/plain", secret, provider.ErrRejected},
		{"404", 404, "application/problem+json", `{"status":404}`, provider.ErrNotFound},
		{"201 cut off mid-body", 201, "application/json", `{"id":"ch_1","sta`, provider.ErrUnavailable},
		{"202 is no answer the API gives", 202, "application/json", `{}`, provider.ErrUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tt.contentType != "" {
					w.Header().Set("Content-Type", tt.contentType)
				}
				w.WriteHeader(tt.status)
				_, _ = w.Write([]byte(tt.body))
			}))
			t.Cleanup(hs.Close)
			_, err := provider.NewClient(hs.URL, hs.Client()).Charge(t.Context(), "key", rub("pay"))
			require.ErrorIs(t, err, tt.want)
			require.NotContains(t, err.Error(), secret, "a body never reaches the error text")
		})
	}

	t.Run("a problem's detail is kept, the body is not", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil, provider.Faults{})
		_, err := b.client.Charge(t.Context(), "key", provider.ChargeRequest{Amount: -1, Currency: "RUB", Reference: "pay"})
		require.ErrorIs(t, err, provider.ErrRejected)
		require.ErrorContains(t, err, "400 Bad Request validation-error: amount must be a positive integer")
	})

	t.Run("a redirect is not followed", func(t *testing.T) {
		t.Parallel()
		var followed atomic.Int64
		elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			followed.Add(1) // with the Idempotency-Key, were it followed
		}))
		t.Cleanup(elsewhere.Close)
		for _, status := range []int{http.StatusFound, http.StatusTemporaryRedirect} {
			hs := httptest.NewServer(http.RedirectHandler(elsewhere.URL+"/steal", status))
			t.Cleanup(hs.Close)
			// The caller's own client follows redirects; the provider's does not.
			_, err := provider.NewClient(hs.URL, &http.Client{}).Charge(t.Context(), "key", rub("pay"))
			require.ErrorIs(t, err, provider.ErrUnavailable, "%d", status)
		}
		require.Zero(t, followed.Load(), "nothing reached the other host")
	})

	t.Run("a refused connection is unavailable", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := ln.Addr().String()
		require.NoError(t, ln.Close()) // nothing listens there now
		_, err = provider.NewClient("http://"+addr, nil).Lookup(t.Context(), "key")
		require.ErrorIs(t, err, provider.ErrUnavailable)
	})

	t.Run("the caller's cancellation is unavailable and still a cancellation", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil, provider.Faults{})
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := b.client.Charge(ctx, "key", rub("pay"))
		require.ErrorIs(t, err, provider.ErrUnavailable)
		require.ErrorIs(t, err, context.Canceled)
	})
}

// TestClientRefundErrors puts Refund and LookupRefund in front of canned
// answers: a refusal is known by its problem type, so a refund's 404 for
// its charge is ErrChargeNotFound while a lookup's 404 is ErrNotFound, and
// a 5xx is transient whatever its body says.
func TestClientRefundErrors(t *testing.T) {
	t.Parallel()
	problemOf := func(slug string, status int) string {
		return fmt.Sprintf(`{"type":"https://oncekey.dev/problems/fakeprovider/%s","title":"t","status":%d,"detail":"about ch_1"}`, slug, status)
	}
	tests := []struct {
		name    string
		status  int
		body    string
		want    []error
		notWant []error
	}{
		{"charge not found", 404, problemOf("charge-not-found", 404),
			[]error{provider.ErrRejected, provider.ErrChargeNotFound}, []error{provider.ErrNotFound, provider.ErrUnavailable}},
		{"charge not refundable", 409, problemOf("charge-not-refundable", 409),
			[]error{provider.ErrRejected, provider.ErrChargeNotRefundable}, []error{provider.ErrChargeNotFound, provider.ErrRefundExceedsCharge}},
		{"refund exceeds charge", 422, problemOf("refund-exceeds-charge", 422),
			[]error{provider.ErrRejected, provider.ErrRefundExceedsCharge}, []error{provider.ErrChargeNotRefundable}},
		{"key mismatch is rejected and nothing more", 409, problemOf(idempotency.ProblemOf(idempotency.ErrKeyMismatch).Slug, 409),
			[]error{provider.ErrRejected}, []error{provider.ErrChargeNotRefundable, provider.ErrChargeNotFound, provider.ErrRefundExceedsCharge}},
		{"a plain 404 is not found", 404, problemOf("not-found", 404),
			[]error{provider.ErrNotFound}, []error{provider.ErrRejected, provider.ErrChargeNotFound}},
		{"a 5xx is transient whatever its type", 503, problemOf("refund-exceeds-charge", 503),
			[]error{provider.ErrUnavailable}, []error{provider.ErrRejected, provider.ErrRefundExceedsCharge}},
		{"another provider's type of the same name", 404, `{"type":"https://elsewhere.example/charge-not-found","status":404}`,
			[]error{provider.ErrNotFound}, []error{provider.ErrChargeNotFound}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/problem+json")
				w.WriteHeader(tt.status)
				_, _ = w.Write([]byte(tt.body))
			}))
			t.Cleanup(hs.Close)
			_, err := provider.NewClient(hs.URL, hs.Client()).Refund(t.Context(), "key", provider.RefundRequest{ChargeID: "ch_1", Amount: 1, Reference: "r"})
			for _, want := range tt.want {
				require.ErrorIs(t, err, want)
			}
			for _, notWant := range tt.notWant {
				require.NotErrorIs(t, err, notWant)
			}
		})
	}

	t.Run("a refusal reads as one line with its type and detail", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil, provider.Faults{})
		_, err := b.client.Refund(t.Context(), "key", provider.RefundRequest{ChargeID: "ch_nothing", Amount: 1, Reference: "r"})
		require.EqualError(t, err, "provider rejected the request: POST /v1/refunds: 404 Not Found charge-not-found: no such charge: ch_nothing")
	})
}

func TestClientTrimsBaseURL(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, provider.Faults{})
	c := provider.NewClient(b.url+"/", nil)
	ch, err := c.Charge(t.Context(), "key", rub("pay"))
	require.NoError(t, err, "a trailing slash in the base URL is harmless")
	st, err := c.Stats(t.Context())
	require.NoError(t, err)
	require.Equal(t, int64(1), st.Charges)
	got, err := c.ChargesByReference(t.Context(), "pay")
	require.NoError(t, err)
	require.Equal(t, []provider.Charge{ch}, got)

	re, err := c.Refund(t.Context(), "refund-key", provider.RefundRequest{ChargeID: ch.ID, Amount: ch.Amount, Reference: "pay"})
	require.NoError(t, err)
	refunds, err := c.RefundsByReference(t.Context(), "pay")
	require.NoError(t, err)
	require.Equal(t, []provider.Refund{re}, refunds)
	looked, err := c.LookupRefund(t.Context(), "refund-key")
	require.NoError(t, err)
	require.Equal(t, re, looked)
}
