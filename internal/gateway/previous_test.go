package gateway_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/internal/gateway"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// TestPreviousScopesEndOnceNoneRemains: the look-up under an earlier scope
// rule's scopes stays on while an unexpired key of the namespace has a
// scope without the current rule's prefix, whatever keys other namespaces
// hold, and ends once none has.
func TestPreviousScopesEndOnceNoneRemains(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, pool := testdb.Fresh(t)
	store := deferredStoreOn(t, pool)
	const ns = "http://a:80"
	anyPrevious := gateway.PostgresPreviousKeys(pool, pgstore.DefaultTable, ns, "hmac:1234abcd:")
	active := func() bool {
		l := gateway.NewPreviousScopes(store, anyPrevious)
		require.NoError(t, l.Check(ctx))
		return l.Active()
	}
	require.False(t, active(), "an empty key table")
	for _, tc := range []struct {
		scope    string
		previous bool
	}{
		{gateway.NamespacedScope(ns, "hmac:1234abcd:00ff"), false},
		{gateway.NamespacedScope(ns, "sha256:00ff"), true},
		{gateway.NamespacedScope(ns, "hmac:9999abcd:00ff"), true},
		{gateway.NamespacedScope(ns, "hmac:1234abcd"), true},
		{gateway.NamespacedScope(ns, "zzz"), true},
		{gateway.NamespacedScope(ns, ""), true},
		{gateway.NamespacedScope("http://b:80", "sha256:00ff"), false},
		{gateway.NamespacedScope("http://a:8080", "sha256:00ff"), false},
		{"sha256:00ff", false}, // bare: LegacyScopes's
	} {
		_, err := pool.Exec(ctx, `INSERT INTO idempotency_keys (scope, idempotency_key, fingerprint, request_method, request_route, status, expires_at)
			VALUES ($1, 'k', $2, 'POST', '/transfers', 'processing', now() + interval '1 hour')`, []byte(tc.scope), make([]byte, 32))
		require.NoError(t, err)
		require.Equal(t, tc.previous, active(), "a key of scope %q", tc.scope)
		_, err = pool.Exec(ctx, `UPDATE idempotency_keys SET expires_at = now() - interval '1 second'`)
		require.NoError(t, err)
		require.False(t, active(), "a key of scope %q that expired", tc.scope)
		_, err = pool.Exec(ctx, `DELETE FROM idempotency_keys`)
		require.NoError(t, err)
	}
}

// TestPreviousScopeUnknownKeyRetried: a key of unknown outcome stored under
// an earlier scope rule, retried through a gateway with
// --on-unknown=retry, is released under its own scope and runs again,
// once; the new run is stored under the current scope.
func TestPreviousScopeUnknownKeyRetried(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, pool := testdb.Fresh(t)
	var runs atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if runs.Add(1) == 1 {
			// Taken, and never answered: the outcome is unknown.
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"t1"}`)
	}))
	t.Cleanup(upstream.Close)
	up, err := url.Parse(upstream.URL)
	require.NoError(t, err)
	ns := gateway.DefaultNamespace(up)
	// The old rule scoped by the header as it came; the new one prefixes
	// it, and names the old scope as previous.
	serve := func(store idempotency.Store[*pgstore.Batch], scope func(*http.Request) (string, error), previous func(*http.Request) []string) *httptest.Server {
		h, err := gateway.New(gateway.Config{Upstream: up, RetryUnknown: true, Scope: scope, PreviousScopes: previous,
			Routes: []gateway.Route{{Method: http.MethodPost, Path: "/transfers"}}}, store)
		require.NoError(t, err)
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		return srv
	}
	oldScope := func(r *http.Request) (string, error) { return r.Header.Get("X-Account-Id"), nil }
	newScope := func(r *http.Request) (string, error) { return "v2:" + r.Header.Get("X-Account-Id"), nil }
	post := func(srv *httptest.Server) int {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/transfers", strings.NewReader(transfer))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Account-Id", "acme")
		req.Header.Set(idempotency.HeaderKey, "k-1")
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	store := deferredStoreOn(t, pool)
	require.Equal(t, http.StatusConflict, post(serve(store, oldScope, nil)), "the outcome is unknown")

	previous := gateway.NewPreviousScopes(store, gateway.PostgresPreviousKeys(pool, pgstore.DefaultTable, ns, "v2:"))
	require.NoError(t, previous.Check(ctx))
	require.True(t, previous.Active())
	require.Equal(t, http.StatusCreated, post(serve(previous, newScope, func(r *http.Request) []string {
		return []string{r.Header.Get("X-Account-Id")}
	})), "the old key is released under its own scope, and runs again")
	require.EqualValues(t, 2, runs.Load())
	var scope []byte
	require.NoError(t, pool.QueryRow(ctx, `SELECT scope FROM idempotency_keys`).Scan(&scope))
	require.Equal(t, gateway.NamespacedScope(ns, "v2:acme"), string(scope), "the key is the new rule's now")
	require.NoError(t, previous.Check(ctx))
	require.False(t, previous.Active(), "no key of the old rule remains")
}
