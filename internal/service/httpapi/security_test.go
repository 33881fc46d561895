package httpapi_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/servicetest"
)

// TestEveryAnswerCarriesTheSecurityHeaders: first answers, replays (whose
// stored headers do not include them), problems from every layer and the
// non-API pages all carry the same security headers. A replayed 422 lost
// X-Content-Type-Options once.
func TestEveryAnswerCarriesTheSecurityHeaders(t *testing.T) {
	t.Parallel()
	const debit = `{"amount":500,"reason":"more than the balance"}`
	tests := []struct {
		name, method, path, key, body string
		header                        []string
		status                        int
		replayed                      bool
	}{
		{name: "created", method: "POST", path: "/orders", key: "sec-1", body: seedBody, status: 201},
		{name: "created, replayed", method: "POST", path: "/orders", key: "sec-1", body: seedBody, status: 201, replayed: true},
		{name: "business outcome", method: "POST", path: "/bonus/debits", key: "sec-2", body: debit, status: 422},
		{name: "business outcome, replayed", method: "POST", path: "/bonus/debits", key: "sec-2", body: debit, status: 422, replayed: true},
		{name: "key reused", method: "POST", path: "/orders", key: "sec-1", body: `{"items":[{"sku":"X","qty":1}],"amount":1,"currency":"RUB"}`, status: 409},
		{name: "no key", method: "POST", path: "/orders", body: seedBody, status: 400},
		{name: "invalid body", method: "POST", path: "/orders", key: "sec-3", body: `{"items":[]}`, status: 400},
		{name: "unknown API key", method: "POST", path: "/orders", key: "sec-4", body: seedBody, header: []string{"Authorization", "Bearer ok_nobody"}, status: 401},
		{name: "unknown order", method: "GET", path: "/orders/01a236fb-6340-7767-a7b8-fd2b954bc880", status: 404},
		{name: "list", method: "GET", path: "/orders", status: 200},
		{name: "no endpoint", method: "GET", path: "/nowhere", status: 404},
		{name: "method not allowed", method: "PUT", path: "/orders", status: 405},
		{name: "health", method: "GET", path: "/healthz", status: 200},
		{name: "contract", method: "GET", path: "/openapi.yaml", status: 200},
		{name: "docs page", method: "GET", path: "/docs", status: 200},
		{name: "metrics", method: "GET", path: "/metrics", status: 200},
	}
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{})
		for _, tt := range tests { // in order: the replays follow their first answers
			var body io.Reader
			if tt.body != "" {
				body = strings.NewReader(tt.body)
			}
			header := tt.header
			if tt.key != "" {
				header = append(header, idempotency.HeaderKey, tt.key)
			}
			resp, err := servicetest.Exchange(http.DefaultClient, b.newRequest(t, tt.method, tt.path, body, header...))
			require.NoError(t, err, tt.name)
			require.Equal(t, tt.status, resp.Status, "%s: %s", tt.name, resp)
			require.Equal(t, tt.replayed, resp.Header.Get(idempotency.HeaderReplayed) == "true", "%s: replayed", tt.name)
			for name, value := range httpapi.SecurityHeaders {
				require.Equal(t, []string{value}, resp.Header.Values(name), "%s: %s", tt.name, name)
			}
		}
	})
}
