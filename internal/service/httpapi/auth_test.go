package httpapi_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/wire/problem"
)

func TestUnauthenticatedRequestsAreIndistinguishable(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{})
		unknown, err := auth.NewKey()
		require.NoError(t, err)
		gone, err := auth.CreateAccount(t.Context(), b.store, "revoked", "")
		require.NoError(t, err)
		revoked, err := b.store.RevokeKey(t.Context(), auth.HashKey(gone.APIKey))
		require.NoError(t, err)
		require.True(t, revoked, "the key was active")
		again, err := b.store.RevokeKey(t.Context(), auth.HashKey(gone.APIKey))
		require.NoError(t, err)
		require.False(t, again, "a revoked key is not active")

		cases := []struct {
			name, method, path, authorization string
		}{
			{"no header", http.MethodPost, "/orders", ""},
			{"Basic scheme", http.MethodPost, "/orders", "Basic abc"},
			{"unknown well-formed key", http.MethodPost, "/orders", "Bearer " + unknown},
			{"Bearer without a key", http.MethodPost, "/orders", "Bearer"},
			{"unknown key on a read", http.MethodGet, "/orders", "Bearer " + unknown},
			{"revoked key", http.MethodPost, "/orders", "Bearer " + gone.APIKey},
			{"revoked key on a read", http.MethodGet, "/orders", "Bearer " + gone.APIKey},
		}
		var first reply
		for i, c := range cases {
			var body *strings.Reader
			header := []string{"Authorization", ""}
			if c.authorization != "" {
				header = append(header, "Authorization", c.authorization)
			}
			if c.method == http.MethodPost {
				body = strings.NewReader(seedBody)
				header = append(header, "Idempotency-Key", "auth-"+c.name)
			}
			var req *http.Request
			if body != nil {
				req = b.newRequest(t, c.method, c.path, body, header...)
			} else {
				req = b.newRequest(t, c.method, c.path, nil, header...)
			}
			r := b.do(t, req)
			requireProblem(t, r, problem.Unauthorized, c.name)
			require.NotEmpty(t, r.Header.Get("WWW-Authenticate"), "%s: 401 without WWW-Authenticate", c.name)
			if i == 0 {
				// The detail reads as written, not JSON-escaped HTML
				// (it was "Bearer \u003ckey\u003e").
				require.Contains(t, string(r.Body), `'Authorization: Bearer <key>'`, "%s: raw body", c.name)
				first = r
				continue
			}
			require.Equal(t, string(first.Body), string(r.Body), "%s: every authentication failure must look the same", c.name)
		}
		require.Zero(t, b.orderCount(t))
	})
}

// TestTwoAuthorizationHeadersAreRefused: two Authorization headers are a
// 400 problem, whichever comes first, never the account of either.
func TestTwoAuthorizationHeadersAreRefused(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{})
		other, err := auth.CreateAccount(t.Context(), b.store, "other", "")
		require.NoError(t, err)
		for name, pair := range map[string][2]string{
			"valid then bogus": {"Bearer " + b.apiKey, "Bearer ok_bogus"},
			"bogus then valid": {"Bearer ok_bogus", "Bearer " + b.apiKey},
			"two accounts":     {"Bearer " + other.APIKey, "Bearer " + b.apiKey},
		} {
			for _, send := range []func() reply{
				func() reply {
					return b.do(t, b.newRequest(t, http.MethodPost, "/orders", strings.NewReader(seedBody),
						"Idempotency-Key", "two-authorizations", "Authorization", pair[0], "Authorization", pair[1]))
				},
				func() reply {
					return b.do(t, b.newRequest(t, http.MethodGet, "/orders", nil, "Authorization", pair[0], "Authorization", pair[1]))
				},
			} {
				d := requireProblem(t, send(), problem.Validation, name)
				require.Contains(t, d.Detail, "exactly one Authorization header", name)
			}
		}
		require.Zero(t, b.orderCount(t), "no order under either account")
		requireFresh(t, b.postOrder(t, "two-authorizations", seedBody), "the key is free: nothing was claimed")
	})
}

func TestOperationsEndpointsNeedNoAuth(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{})
		for _, path := range []string{"/healthz", "/readyz", "/openapi.yaml"} {
			r := b.do(t, b.newRequest(t, http.MethodGet, path, nil, "Authorization", ""))
			require.Equal(t, http.StatusOK, r.Status, "GET %s without Authorization: %s", path, r)
		}
	})
}
