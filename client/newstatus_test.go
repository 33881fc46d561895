package client_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/client"
	"github.com/oncekey/oncekey/gen/api"
)

// TestUnknownStatusesDecode: the statuses of orders, payments and refunds
// are open enums (x-open-enum in openapi.yaml), so a later server may
// answer one this client does not know. It is decoded as it came, for the
// caller to branch on (Valid is false, a switch takes its default), never
// a decode error.
func TestUnknownStatusesDecode(t *testing.T) {
	t.Parallel()
	const id = "0193a6f2-5c1e-7cc4-9a5e-3f2b1d7e8a90"
	answers := map[string]string{
		"/orders/" + id:   `{"id":"` + id + `","status":"disputed","amount":1200,"currency":"RUB","items":[{"sku":"SKU-1","qty":1}],"created_at":"2026-12-05T10:00:00Z"}`,
		"/payments/" + id: `{"id":"` + id + `","order_id":"` + id + `","status":"disputed","amount":1200,"currency":"RUB","created_at":"2026-12-05T10:00:00Z"}`,
		"/refunds/" + id:  `{"id":"` + id + `","payment_id":"` + id + `","status":"disputed","amount":100,"currency":"RUB","reason":"requested","created_at":"2026-12-05T10:00:00Z"}`,
	}
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, ok := answers[r.URL.Path]
		if !ok || r.Method != http.MethodGet {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(server.Close)
	c, err := client.New(client.Config{BaseURL: server.URL, APIKey: "ok_test"})
	require.NoError(t, err, "the client")

	order, err := c.GetOrder(t.Context(), id)
	require.NoError(t, err, "an order in a status this client does not know")
	require.Equal(t, api.OrderStatus("disputed"), order.Status)
	require.False(t, order.Status.Valid(), "Valid tells a status this client does not know")
	switch order.Status {
	case api.Created, api.Cancelled:
		t.Fatalf("a known status: %s", order.Status)
	default: // what a caller does with a status it does not know
	}

	payment, err := c.GetPayment(t.Context(), id)
	require.NoError(t, err, "a payment in a status this client does not know")
	require.Equal(t, api.PaymentStatus("disputed"), payment.Status)
	require.False(t, payment.Status.Valid(), "Valid tells a status this client does not know")

	refund, err := c.GetRefund(t.Context(), id)
	require.NoError(t, err, "a refund in a status this client does not know")
	require.Equal(t, api.RefundStatus("disputed"), refund.Status)
	require.False(t, refund.Status.Valid(), "Valid tells a status this client does not know")
}
