package caddymodule

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
