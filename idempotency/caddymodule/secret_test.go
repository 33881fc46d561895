package caddymodule_test

import (
	"crypto/rand"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore/pgstoretest"
)

// TestCaddyScopeSecret: with scope {http.request.header.Authorization}
// and scope_secret (from the environment, as {env.…}), against a real
// Caddy and PostgreSQL. No stored scope holds a caller's credential, nor
// does Caddy's log; two callers that send one key and body under two
// credentials each run once; a retry whose first attempt a Caddy without
// the secret stored replays through a Caddy with it, and one stored under
// a secret since rotated replays through a Caddy given it as
// scope_secret_previous: the upstream ran each key once.
func TestCaddyScopeSecret(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	bin := buildCaddy(t)
	up := startCountingUpstream(t)
	dbURL, pool := pgstoretest.Fresh(t)
	first, second := rand.Text()+rand.Text(), rand.Text()+rand.Text()
	caddyfile := func(addr, options string) string {
		return fmt.Sprintf("{\n\tadmin off\n\tauto_https off\n}\nhttp://%s {\n\tidempotency {\n\t\tscope {http.request.header.Authorization}\n\t\tdatabase_url %q\n\t\tnamespace charges\n%s\t}\n\treverse_proxy %s\n}\n",
			addr, dbURL, options, strings.TrimPrefix(up.URL, "http://"))
	}
	start := func(options string, env ...string) (string, func() string) {
		addr := freeAddr(t)
		logs := startCaddyEnv(t, bin, caddyfile(addr, options), env, addr)
		return addr, logs.String
	}
	alice, bob := "Bearer sk_alice_"+rand.Text(), "Bearer sk_bob_"+rand.Text()
	charge := func(addr, credential, key string) (*http.Response, string) {
		t.Helper()
		resp, body := send(t, addr, "/v1/charges", http.Header{"Authorization": {credential}, idempotency.HeaderKey: {key}})
		return resp, string(body)
	}
	// The scopes stored, but those of key.
	storedScopes := func(but string) string {
		t.Helper()
		rows, err := pool.Query(ctx, `SELECT convert_from(scope, 'UTF8') FROM idempotency_keys WHERE idempotency_key <> $1`, but)
		require.NoError(t, err)
		var all []string
		for rows.Next() {
			var s string
			require.NoError(t, rows.Scan(&s))
			all = append(all, s)
		}
		require.NoError(t, rows.Err())
		return strings.Join(all, "\n")
	}

	// Before the secret: a Caddy that stores the scope as it resolves.
	before, _ := start("")
	crossing := "crossing-" + rand.Text()
	resp, stored := charge(before, alice, crossing)
	require.Equal(t, http.StatusCreated, resp.StatusCode, stored)
	require.Contains(t, storedScopes(""), alice, "without scope_secret the credential is the stored scope")

	// With the secret (stop the old Caddies first, docs/gateway.md).
	withSecret, logs := start("\t\tscope_secret {env.IDEMPOTENCY_SCOPE_SECRET}\n", "IDEMPOTENCY_SCOPE_SECRET="+first)
	require.Eventually(t, func() bool { return strings.Contains(logs(), "keys stored before scope_secret") }, 10*time.Second, 10*time.Millisecond,
		"Caddy says that the look-up is on:\n%s", logs())
	resp, body := charge(withSecret, alice, crossing)
	require.Equal(t, http.StatusCreated, resp.StatusCode, body)
	require.Equal(t, "true", resp.Header.Get(idempotency.HeaderReplayed), "the retry across adding the secret replays: %s", body)
	require.Equal(t, stored, body)
	require.EqualValues(t, 1, up.runs.Load(), "the upstream ran the crossing key once")

	shared := "shared-" + rand.Text()
	resp, aliceBody := charge(withSecret, alice, shared)
	require.Equal(t, http.StatusCreated, resp.StatusCode, aliceBody)
	resp, bobBody := charge(withSecret, bob, shared)
	require.Equal(t, http.StatusCreated, resp.StatusCode, bobBody)
	require.Empty(t, resp.Header.Get(idempotency.HeaderReplayed), "bob's key is his own")
	require.NotEqual(t, aliceBody, bobBody, "bob never gets alice's answer")
	require.EqualValues(t, 3, up.runs.Load(), "each caller's key ran once")

	rotated := "rotated-" + rand.Text()
	resp, rotatedBody := charge(withSecret, bob, rotated)
	require.Equal(t, http.StatusCreated, resp.StatusCode, rotatedBody)
	require.EqualValues(t, 4, up.runs.Load())

	scopes := storedScopes(crossing) // stored before the secret
	require.NotContains(t, scopes, "sk_", "no scope stored under the secret holds a credential")
	require.Equal(t, 3, strings.Count(scopes, "ns:charges|hmac:"), "the keys stored under the secret: %s", scopes)
	require.NotContains(t, logs(), "sk_", "Caddy's log names no credential")

	// Rotated: the new secret, the old one as scope_secret_previous.
	afterRotation, _ := start(fmt.Sprintf("\t\tscope_secret %s\n\t\tscope_secret_previous {env.IDEMPOTENCY_SCOPE_SECRET}\n", second), "IDEMPOTENCY_SCOPE_SECRET="+first)
	resp, body = charge(afterRotation, bob, rotated)
	require.Equal(t, "true", resp.Header.Get(idempotency.HeaderReplayed), "the retry across the rotation replays: %s", body)
	require.Equal(t, rotatedBody, body)
	resp, body = charge(afterRotation, alice, crossing)
	require.Equal(t, "true", resp.Header.Get(idempotency.HeaderReplayed), "the key stored before any secret still replays: %s", body)
	require.Equal(t, stored, body)
	require.EqualValues(t, 4, up.runs.Load(), "the upstream ran each key once")
}
