package gateway_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/internal/gateway"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// TestLegacyScopesEndOnceNoBareKeyRemains: the look-up of keys stored
// before namespaces stays on while an unexpired key of a bare scope is in
// the key table, whatever namespaced keys there are, and ends for good
// once none is.
func TestLegacyScopesEndOnceNoBareKeyRemains(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, pool := testdb.Fresh(t)
	store := deferredStoreOn(t, pool)
	anyLegacy := gateway.PostgresLegacyKeys(pool, pgstore.DefaultTable)
	legacy := func() *gateway.LegacyScopes[*pgstore.Batch] {
		l := gateway.NewLegacyScopes(store, anyLegacy)
		require.NoError(t, l.Check(ctx))
		return l
	}
	require.False(t, legacy().Active(), "an empty key table")

	for _, scope := range []string{gateway.NamespacedScope("http://a:80", "acme"), "ns:", "acme", "zeta", "\x00", "ns;", "ns:without-end"} {
		_, err := pool.Exec(ctx, `INSERT INTO idempotency_keys (scope, idempotency_key, fingerprint, request_method, request_route, status, expires_at)
			VALUES ($1, 'k', $2, 'POST', '/transfers', 'processing', now() + interval '1 hour')`, []byte(scope), make([]byte, 32))
		require.NoError(t, err)
		_, _, namespaced := gateway.SplitScope(scope)
		require.Equal(t, !namespaced, legacy().Active(), "a key of scope %q", scope)
		_, err = pool.Exec(ctx, `UPDATE idempotency_keys SET expires_at = now() - interval '1 second'`)
		require.NoError(t, err)
		require.False(t, legacy().Active(), "a key of scope %q that expired", scope)
		_, err = pool.Exec(ctx, `DELETE FROM idempotency_keys`)
		require.NoError(t, err)
	}

	l := gateway.NewLegacyScopes(store, anyLegacy)
	require.NoError(t, l.Check(ctx))
	require.False(t, l.Active())
	_, err := pool.Exec(ctx, `INSERT INTO idempotency_keys (scope, idempotency_key, fingerprint, request_method, request_route, status, expires_at)
		VALUES ('acme', 'k', $1, 'POST', '/transfers', 'processing', now() + interval '1 hour')`, make([]byte, 32))
	require.NoError(t, err)
	require.NoError(t, l.Check(ctx))
	require.False(t, l.Active(), "once ended, for good: nothing stores bare scopes after the upgrade")
}

// deferredStoreOn is pgstore's deferred store on the database of pool.
func deferredStoreOn(t *testing.T, pool *pgxpool.Pool) idempotency.Store[*pgstore.Batch] {
	t.Helper()
	pg, err := pgstore.New(pool, pgstore.Options{})
	require.NoError(t, err)
	s, err := pg.ClaimAtCommit()
	require.NoError(t, err)
	return s
}

// TestLegacyUnknownKeyRetried: a key of unknown outcome stored before
// namespaces, retried through a gateway with --on-unknown=retry, is
// released under its own scope and runs again, once.
func TestLegacyUnknownKeyRetried(t *testing.T) {
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
	serve := func(store idempotency.Store[*pgstore.Batch]) *httptest.Server {
		return transfersGateway(t, gateway.Config{Upstream: up, RetryUnknown: true}, store)
	}
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
	require.Equal(t, http.StatusConflict, post(serve(store)), "the outcome is unknown")
	// As a gateway before namespaces stored it: the caller's scope alone.
	tag, err := pool.Exec(ctx, `UPDATE idempotency_keys SET scope = $1`, []byte("acme"))
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())

	legacy := gateway.NewLegacyScopes(store, gateway.PostgresLegacyKeys(pool, pgstore.DefaultTable))
	require.NoError(t, legacy.Check(ctx))
	require.True(t, legacy.Active())
	require.Equal(t, http.StatusCreated, post(serve(legacy)), "the old key is released under its own scope, and runs again")
	require.EqualValues(t, 2, runs.Load())
	var scope []byte
	require.NoError(t, pool.QueryRow(ctx, `SELECT scope FROM idempotency_keys`).Scan(&scope))
	require.Equal(t, gateway.NamespacedScope(gateway.DefaultNamespace(up), "acme"), string(scope), "the key is the namespace's now")
}

// TestLegacyScopesPiecesUnderTheOldScope: a held record stored under a
// bare scope has the pieces of its body written and read under that
// scope, though the gateway names it by its namespaced one (a replay's
// Ref is the request's scope with the record's claim), and a piece of no
// record is written nowhere.
func TestLegacyScopesPiecesUnderTheOldScope(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	keys := memstore.New()
	legacy := gateway.NewLegacyScopes[*memstore.Tx](keys, func(context.Context) (bool, error) { return true, nil })
	require.NoError(t, legacy.Check(ctx))
	require.True(t, legacy.Active(), "a bare key remains")

	// As a gateway before namespaces stored it: the caller's scope alone.
	lease, _, err := keys.Claim(ctx, idempotency.ClaimRequest{Scope: "acme", Key: "k", TTL: time.Hour, Wait: time.Second, AtOnce: true})
	require.NoError(t, err, "claim under the bare scope")
	require.NotNil(t, lease, "the bare key is free")
	require.NoError(t, lease.Commit(ctx, idempotency.Held{State: idempotency.HeldRunning, Until: time.Now().Add(time.Minute)}.Response()), "hold it")
	namespaced := gateway.NamespacedScope("http://a:80", "acme")
	ref := idempotency.Ref{Scope: namespaced, Key: "k", ClaimedAt: lease.Ref().ClaimedAt}

	for n, p := range []string{"first ", "second"} {
		written, err := legacy.WritePiece(ctx, ref, n, []byte(p))
		require.NoError(t, err, "write piece %d", n)
		require.True(t, written, "piece %d is written under the bare scope its record is stored under", n)
	}
	settled, err := legacy.Settle(ctx, ref, idempotency.Response{Status: http.StatusOK, Header: http.Header{}, Pieces: 2, Size: 12})
	require.NoError(t, err, "settle")
	require.True(t, settled, "settled under the bare scope")

	_, rec, err := legacy.Claim(ctx, idempotency.ClaimRequest{Scope: namespaced, Key: "k", TTL: time.Hour, Wait: time.Second})
	require.NoError(t, err, "claim under the namespaced scope")
	require.NotNil(t, rec, "the bare scope's record answers")
	require.Equal(t, 2, rec.Response.Pieces, "the record's body is in pieces")
	replay := idempotency.Ref{Scope: namespaced, Key: "k", ClaimedAt: rec.CreatedAt}
	for n, want := range []string{"first ", "second"} {
		p, err := legacy.ReadPiece(ctx, replay, n)
		require.NoError(t, err, "read piece %d", n)
		require.Equal(t, want, string(p), "piece %d, read under the bare scope", n)
	}
	p, err := legacy.ReadPiece(ctx, replay, 2)
	require.NoError(t, err, "read a piece past the last")
	require.Nil(t, p, "no third piece")

	nobody := idempotency.Ref{Scope: namespaced, Key: "other", ClaimedAt: time.Now()}
	written, err := legacy.WritePiece(ctx, nobody, 0, []byte("x"))
	require.NoError(t, err, "write a piece of no record")
	require.False(t, written, "a piece of no record is written nowhere")
}
