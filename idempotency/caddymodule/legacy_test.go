package caddymodule

import (
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/pgstore/pgstoretest"
)

// TestLegacyLookUpEndsOnceNoBareKeyRemains: a site that found keys stored
// before namespaces (a scope without the namespace's prefix, or with it
// but no "|" that ends a namespace) asks again, every so often, whether
// any remain, and stops looking them up once the last one expired;
// stopped at Cleanup while some remain, it stops asking at once. Keys of
// namespaces alone never turn it on.
func TestLegacyLookUpEndsOnceNoBareKeyRemains(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, scope string
		expires     string // the key's lifetime, as a PostgreSQL interval
		endsSelf    bool
	}{
		{"the last bare key expires", "acct-1", "300 milliseconds", true},
		{"the last key of a caller's scope that starts as a namespace expires", "ns:acct-1", "300 milliseconds", true},
		{"stopped while bare keys remain", "acct-1", "1 hour", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			_, pool := pgstoretest.Fresh(t)
			_, err := pool.Exec(ctx, `INSERT INTO idempotency_keys (scope, idempotency_key, fingerprint, request_method, request_route, status, expires_at)
				VALUES ($1, 'k', $2, 'POST', '/transfers', 'processing', now() + $3::interval)`, []byte(tc.scope), make([]byte, 32), tc.expires)
			require.NoError(t, err)
			_, err = pool.Exec(ctx, `INSERT INTO idempotency_keys (scope, idempotency_key, fingerprint, request_method, request_route, status, expires_at)
				VALUES ($1, 'k', $2, 'POST', '/transfers', 'processing', now() + interval '1 hour')`, []byte(namespacedScope("shop", tc.scope)), make([]byte, 32))
			require.NoError(t, err, "a namespaced key, which never counts")
			// check and watch read the key table alone.
			l := &legacyScopes{any: postgresLegacyKeys(pool)}
			require.NoError(t, l.check(ctx))
			require.True(t, l.active(), "a bare key remains")

			stop := l.watch(slog.New(slog.NewTextHandler(io.Discard, nil)), 20*time.Millisecond)
			if tc.endsSelf {
				require.Eventually(t, func() bool { return !l.active() }, 10*time.Second, 10*time.Millisecond, "the look-up ends once no bare key remains")
			}
			stop()
			require.Equal(t, tc.endsSelf, !l.active())
		})
	}
}

// TestPreviousKeysOfTheNamespaceOnly: the look-up under the scopes of a
// site's earlier scope rules (before scope_secret, or under a previous
// one) stays on while an unexpired key of the namespace has a scope
// without the current secret's prefix, whatever keys other namespaces
// hold, and ends once none has. The twin of internal/gateway's
// TestPreviousScopesEndOnceNoneRemains.
func TestPreviousKeysOfTheNamespaceOnly(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, pool := pgstoretest.Fresh(t)
	const ns = "charges"
	active := func() bool {
		l := &legacyScopes{prevAny: postgresPreviousKeys(pool, ns, "hmac:1234abcd:")}
		require.NoError(t, l.check(ctx))
		return l.previousActive()
	}
	require.False(t, active(), "an empty key table")
	for _, tc := range []struct {
		scope    string
		previous bool
	}{
		{namespacedScope(ns, "hmac:1234abcd:00ff"), false},
		{namespacedScope(ns, "Bearer sk_live"), true},
		{namespacedScope(ns, "hmac:9999abcd:00ff"), true},
		{namespacedScope(ns, "hmac:1234abcd"), true},
		{namespacedScope(ns, "zzz"), true},
		{namespacedScope("refunds", "Bearer sk_live"), false},
		{namespacedScope(ns+"x", "Bearer sk_live"), false},
		{"Bearer sk_live", false}, // bare: the look-up before namespaces
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

// TestLegacyScopesPiecesUnderTheOldScope: a held record stored under a
// bare scope has the pieces of its body written and read under that
// scope, though the site names it by its namespaced one (a replay's Ref
// is the request's scope with the record's claim), and a piece of no
// record is written nowhere. The twin of internal/gateway's test of the
// same name.
func TestLegacyScopesPiecesUnderTheOldScope(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	keys := memstore.New()
	l := &legacyScopes{next: idempotency.MapUnit(keys, func(*memstore.Tx, idempotency.Ref) *pgstore.Batch { return nil })}
	require.True(t, l.active(), "bare keys may remain")

	// As a site before namespaces stored it: the caller's scope alone.
	lease, _, err := keys.Claim(ctx, idempotency.ClaimRequest{Scope: "acct-1", Key: "k", TTL: time.Hour, Wait: time.Second, AtOnce: true})
	require.NoError(t, err, "claim under the bare scope")
	require.NotNil(t, lease, "the bare key is free")
	require.NoError(t, lease.Commit(ctx, idempotency.Held{State: idempotency.HeldRunning, Until: time.Now().Add(time.Minute)}.Response()), "hold it")
	namespaced := namespacedScope("shop", "acct-1")
	ref := idempotency.Ref{Scope: namespaced, Key: "k", ClaimedAt: lease.Ref().ClaimedAt}

	for n, p := range []string{"first ", "second"} {
		written, err := l.WritePiece(ctx, ref, n, []byte(p))
		require.NoError(t, err, "write piece %d", n)
		require.True(t, written, "piece %d is written under the bare scope its record is stored under", n)
	}
	settled, err := l.Settle(ctx, ref, idempotency.Response{Status: http.StatusOK, Header: http.Header{}, Pieces: 2, Size: 12})
	require.NoError(t, err, "settle")
	require.True(t, settled, "settled under the bare scope")

	_, rec, err := l.Claim(ctx, idempotency.ClaimRequest{Scope: namespaced, Key: "k", TTL: time.Hour, Wait: time.Second})
	require.NoError(t, err, "claim under the namespaced scope")
	require.NotNil(t, rec, "the bare scope's record answers")
	require.Equal(t, 2, rec.Response.Pieces, "the record's body is in pieces")
	replay := idempotency.Ref{Scope: namespaced, Key: "k", ClaimedAt: rec.CreatedAt}
	for n, want := range []string{"first ", "second"} {
		p, err := l.ReadPiece(ctx, replay, n)
		require.NoError(t, err, "read piece %d", n)
		require.Equal(t, want, string(p), "piece %d, read under the bare scope", n)
	}
	p, err := l.ReadPiece(ctx, replay, 2)
	require.NoError(t, err, "read a piece past the last")
	require.Nil(t, p, "no third piece")

	nobody := idempotency.Ref{Scope: namespaced, Key: "other", ClaimedAt: time.Now()}
	written, err := l.WritePiece(ctx, nobody, 0, []byte("x"))
	require.NoError(t, err, "write a piece of no record")
	require.False(t, written, "a piece of no record is written nowhere")
}
