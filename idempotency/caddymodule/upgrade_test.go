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
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/pgstore/pgstoretest"
)

// TestCaddyUpgradeKeepsStoredKeys: keys that a Caddy stored before
// namespaces, under the caller's scope alone, are answered by a Caddy
// upgraded to a namespace on the same database as before the upgrade: a
// completed one replays its stored answer, a held one still running gets
// 202 while its lease runs (profile oncekey), and neither reaches the upstream; a key free
// under the bare scope is the namespace's, and runs once.
func TestCaddyUpgradeKeepsStoredKeys(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	bin := buildCaddy(t)
	up := startUpstream(t)
	// A key table of the test's own: the look-up stays on only while keys
	// of bare scopes remain in it.
	dbURL, pool := pgstoretest.Fresh(t)

	// As a Caddy before namespaces stored them: the caller's scope alone,
	// and the fingerprint the engine gives post's request.
	scope := "acct-" + rand.Text()
	done, running, free := "done-"+rand.Text(), "running-"+rand.Text(), "free-"+rand.Text()
	fp, err := idempotency.Request{Method: http.MethodPost, Route: "/transfers", Path: "/transfers", ContentType: "application/json", Body: []byte(`{"amount":500,"currency":"EUR"}`)}.Fingerprint()
	require.NoError(t, err)
	old, err := pgstore.New(pool, pgstore.Options{})
	require.NoError(t, err)
	const stored = `{"id":"tr-before-upgrade","amount":500}`
	for key, resp := range map[string]idempotency.Response{
		done:    {Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(stored)},
		running: idempotency.Held{State: idempotency.HeldRunning, Until: time.Now().Add(time.Hour), Holder: "caddy-before-upgrade", Path: "/transfers"}.Response(),
	} {
		lease, rec, err := old.Claim(ctx, idempotency.ClaimRequest{Scope: scope, Key: key, Fingerprint: fp, Method: http.MethodPost, Route: "/transfers", TTL: time.Hour, Wait: time.Second})
		require.NoError(t, err, key)
		require.Nil(t, rec, key)
		require.NoError(t, lease.Commit(ctx, resp), key)
	}

	addr := freeAddr(t)
	logs := startCaddy(t, bin, fmt.Sprintf("{\n\tadmin off\n\tauto_https off\n}\nhttp://%s {\n\tidempotency {\n\t\tscope {http.request.header.X-Account-Id}\n\t\tdatabase_url %q\n\t\tnamespace shop\n\t\twait 200ms\n\t\tprofile oncekey\n\t}\n\treverse_proxy %s\n}\n",
		addr, dbURL, up.addr), addr)
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "keys stored before namespaces remain") }, 10*time.Second, 10*time.Millisecond,
		"Caddy says that the look-up is on:\n%s", logs)

	resp, body := post(t, addr, scope, done, "")
	require.Equal(t, http.StatusCreated, resp.StatusCode, body)
	require.Equal(t, "true", resp.Header.Get(idempotency.HeaderReplayed), "the answer stored before the upgrade replays")
	require.Equal(t, stored, body)

	resp, body = post(t, addr, scope, running, "")
	require.Equal(t, http.StatusAccepted, resp.StatusCode, "the key held before the upgrade is still in flight: %s", body)
	require.Contains(t, body, idempotency.ProblemOf(idempotency.ErrInFlight).Title)

	require.Zero(t, up.runs(t, done), "the stored answer was replayed, not run again")
	require.Zero(t, up.runs(t, running), "the key in flight was not run again")

	resp, body = post(t, addr, scope, free, "")
	require.Equal(t, http.StatusCreated, resp.StatusCode, body)
	require.Empty(t, resp.Header.Get(idempotency.HeaderReplayed))
	again, replayed := post(t, addr, scope, free, "")
	require.Equal(t, "true", again.Header.Get(idempotency.HeaderReplayed), replayed)
	require.Equal(t, body, replayed)
	require.Equal(t, 1, up.runs(t, free))
	var scopes []string
	rows, err := pool.Query(ctx, `SELECT convert_from(scope, 'UTF8') FROM idempotency_keys WHERE idempotency_key = $1`, free)
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		scopes = append(scopes, s)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"ns:shop|" + scope}, scopes, "a key free under the bare scope is the namespace's")
}
