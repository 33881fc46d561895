package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/pgstore/keyadmin"
	"github.com/oncekey/oncekey/internal/gateway"
	"github.com/oncekey/oncekey/internal/testdb"
	"github.com/oncekey/oncekey/internal/upstreamtest"
)

// publicRelations is every table and view of the public schema, sorted.
func publicRelations(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT c.relname || ' (' || c.relkind::text || ')' FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm') ORDER BY 1`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

// TestGatewayDatabaseKeepsItsOwnTables: `oncekey proxy` and the keys
// commands on the application's own database, which has an orders table
// and goose's version table of its own migrations: the gateway starts and
// serves, and afterwards the database holds the application's tables and
// the key table's, nothing of the service's (its orders, River's, goose's
// rows); the keys commands add nothing.
func TestGatewayDatabaseKeepsItsOwnTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL, pool := testdb.Empty(t)
	for _, q := range []string{
		`CREATE TABLE orders (id bigint PRIMARY KEY, note text NOT NULL)`,
		`CREATE TABLE goose_db_version (id serial PRIMARY KEY, version_id bigint NOT NULL, is_applied boolean NOT NULL, tstamp timestamp DEFAULT now())`,
		`INSERT INTO goose_db_version (version_id, is_applied) VALUES (0, true), (20240101000000, true)`,
	} {
		_, err := pool.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	app := publicRelations(t, pool)
	u := upstreamtest.Start(t)
	env := map[string]string{"DATABASE_URL": dbURL}
	addr, _ := startCommand(t, env, "proxy", "--upstream", u.URL, "--spec", u.Spec, "--scope-header", "X-Account-Id")
	scope, key := "acct-"+uuid.NewString(), uuid.NewString()
	status, body := gatewayPost(t, addr, scope, key, "")
	require.Equal(t, http.StatusCreated, status, body)

	// pgstore's: the key table, its version table and its guard view.
	want := slices.Sorted(slices.Values(append(slices.Clone(app),
		"idempotency_keys (r)", "idempotency_keys_schema_version (r)", "idempotency_keys_claimed (v)")))
	require.Equal(t, want, publicRelations(t, pool), "the application's relations and pgstore's, no other")
	var goose []int64
	rows, err := pool.Query(ctx, `SELECT version_id FROM goose_db_version ORDER BY id`)
	require.NoError(t, err)
	goose, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Equal(t, []int64{0, 20240101000000}, goose, "the application's migrations, as they were")

	for _, args := range [][]string{
		{"keys", "stats"},
		{"keys", "unknown"},
		{"keys", "stuck"},
		{"keys", "inspect", "--gateway", scope, key},
		{"purge", "--dry-run"},
	} {
		out, err := runCommand(t, env, args...)
		require.NoError(t, err, "%v: %s", args, out)
		require.Equal(t, want, publicRelations(t, pool), "%v adds nothing", args)
	}
}

// holdKey stores a held record under scope and key, as a gateway holds
// a key, then settles it with next if given (its outcome marked unknown,
// say).
func holdKey(t *testing.T, store *pgstore.Store, scope, key string, held idempotency.Held, next *idempotency.Held) {
	t.Helper()
	ctx := context.Background()
	lease, rec, err := store.Claim(ctx, idempotency.ClaimRequest{Scope: scope, Key: key, Fingerprint: idempotency.Fingerprint{7},
		Method: "POST", Route: "/transfers/{id}", TTL: time.Hour, Wait: time.Second})
	require.NoError(t, err)
	require.Nil(t, rec, "a fresh key")
	require.NoError(t, lease.Commit(ctx, held.Response()))
	if next != nil {
		settled, err := store.Settle(ctx, lease.Ref(), next.Response())
		require.NoError(t, err)
		require.True(t, settled)
	}
}

// TestKeysUnknownAndNamespaces: `keys unknown` lists exactly the held keys
// whose outcome is unknown (marked so, or their lease ended), with their
// namespace, the caller's scope, method, route, path, since when and
// holder, as many as `keys stats` counts; --namespace keeps one
// namespace's. `keys inspect` says held or unknown in its status, and
// `keys inspect|release --gateway` find a key's namespace when one holds
// it, and ask for --namespace when several do.
func TestKeysUnknownAndNamespaces(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL, pool := testdb.Empty(t)
	require.NoError(t, pgstore.Migrate(ctx, pool, pgstore.Options{}))
	store, err := pgstore.New(pool, pgstore.Options{})
	require.NoError(t, err)
	env := map[string]string{"DATABASE_URL": dbURL}
	const nsA, nsB = "http://a.internal:80", "http://b.internal:80"
	past, future := time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
	running := func(until time.Time, path string) idempotency.Held {
		return idempotency.Held{State: idempotency.HeldRunning, Until: until, Holder: "gw-1:42", Path: path}
	}
	marked := &idempotency.Held{State: idempotency.HeldUnknown, Reason: "the upstream did not answer", Holder: "gw-2:7", Path: "/transfers/m"}

	holdKey(t, store, gateway.NamespacedScope(nsA, "acct-1"), "lapsed", running(past, "/transfers/1"), nil)
	holdKey(t, store, gateway.NamespacedScope(nsA, "acct-1"), "marked", running(future, "/transfers/m"), marked)
	holdKey(t, store, gateway.NamespacedScope(nsB, "acct-1"), "lapsed", running(past, "/transfers/2"), nil)
	holdKey(t, store, "acct-1", "legacy", idempotency.Held{State: idempotency.HeldRunning, Until: past}, nil)
	// Not unknown: running within its lease, and one whose response was not stored.
	holdKey(t, store, gateway.NamespacedScope(nsA, "acct-1"), "running", running(future, "/transfers/r"), nil)
	holdKey(t, store, gateway.NamespacedScope(nsA, "acct-1"), "big", running(future, "/transfers/b"),
		&idempotency.Held{State: idempotency.HeldNotStored, Reason: "too large"})

	list := func(args ...string) []unknownKey {
		t.Helper()
		out, err := runCommand(t, env, append([]string{"keys", "unknown"}, args...)...)
		require.NoError(t, err, out)
		var got []unknownKey
		require.NoError(t, json.Unmarshal([]byte(out), &got), out)
		return got
	}
	type seen struct{ Namespace, Scope, Key, Method, Route, Path, Holder string }
	summary := func(keys []unknownKey) []seen {
		var out []seen
		for _, k := range keys {
			require.False(t, k.UnknownSince.IsZero(), "since when: %+v", k)
			out = append(out, seen{k.Namespace, k.Scope, k.Key, k.Method, k.Route, k.Path, k.Holder})
		}
		return out
	}
	all := list()
	require.ElementsMatch(t, []seen{
		{nsA, "acct-1", "lapsed", "POST", "/transfers/{id}", "/transfers/1", "gw-1:42"},
		{nsA, "acct-1", "marked", "POST", "/transfers/{id}", "/transfers/m", "gw-2:7"},
		{nsB, "acct-1", "lapsed", "POST", "/transfers/{id}", "/transfers/2", "gw-1:42"},
		{"", "acct-1", "legacy", "POST", "/transfers/{id}", "", ""},
	}, summary(all))
	for _, k := range all {
		if k.Key == "lapsed" {
			require.WithinDuration(t, past, k.UnknownSince, time.Millisecond, "unknown since the lease ended")
		}
		if k.Key == "marked" {
			require.Equal(t, marked.Reason, k.Reason)
		}
	}
	out, err := runCommand(t, env, "keys", "stats")
	require.NoError(t, err, out)
	var stats struct{ Held, Unknown int }
	require.NoError(t, json.Unmarshal([]byte(out), &stats), out)
	require.Equal(t, len(all), stats.Unknown, "keys stats counts what keys unknown lists: %s", out)
	require.Equal(t, 1, stats.Held, out)

	require.ElementsMatch(t, []seen{
		{nsB, "acct-1", "lapsed", "POST", "/transfers/{id}", "/transfers/2", "gw-1:42"},
	}, summary(list("--namespace", nsB)))
	require.Len(t, list("--limit", "2"), 2)

	inspect := func(args ...string) (gatewayKeyInfo, error) {
		out, err := runCommand(t, env, append([]string{"keys", "inspect", "--gateway"}, args...)...)
		var info gatewayKeyInfo
		if err == nil {
			require.NoError(t, json.Unmarshal([]byte(out), &info), out)
		}
		return info, err
	}
	for _, tc := range []struct {
		key, status, ns string
	}{
		{"marked", "unknown", nsA}, // found in its one namespace
		{"running", "held", nsA},   // likewise
		{"big", "not-stored", nsA}, // likewise
		{"legacy", "unknown", ""},  // stored before namespaces
	} {
		info, err := inspect("acct-1", tc.key)
		require.NoError(t, err, tc.key)
		require.Equal(t, tc.status, info.Status, tc.key)
		require.Zero(t, info.ResponseStatus, "a held key stores no response: %s", tc.key)
		require.Equal(t, tc.ns, info.Namespace, tc.key)
		require.Equal(t, "acct-1", info.Scope, tc.key)
	}
	_, err = inspect("acct-1", "lapsed")
	require.ErrorContains(t, err, "2 namespaces", "two gateways hold acct-1's key lapsed")
	require.ErrorContains(t, err, "--namespace")
	info, err := inspect("acct-1", "lapsed", "--namespace", nsB)
	require.NoError(t, err)
	require.Equal(t, "unknown", info.Status)
	require.Equal(t, "/transfers/2", info.Held.Path)
	_, err = inspect("acct-2", "marked")
	require.ErrorIs(t, err, keyadmin.ErrKeyNotFound)
	_, err = runCommand(t, env, "keys", "inspect", "--namespace", nsA, uuid.NewString(), "marked")
	require.ErrorContains(t, err, "needs --gateway")

	out, err = runCommand(t, env, "keys", "release", "--gateway", "acct-1", "marked", "--reason", "TICKET-3")
	require.NoError(t, err, out)
	require.JSONEq(t, `{"released":true}`, out)
	out, err = runCommand(t, env, "keys", "release", "--gateway", "acct-1", "lapsed", "--namespace", nsA, "--reason", "TICKET-4")
	require.NoError(t, err, out)
	require.JSONEq(t, `{"released":true}`, out)
	require.ElementsMatch(t, []seen{
		{nsB, "acct-1", "lapsed", "POST", "/transfers/{id}", "/transfers/2", "gw-1:42"},
		{"", "acct-1", "legacy", "POST", "/transfers/{id}", "", ""},
	}, summary(list()), "released keys are no longer unknown")
}

// requireInspectStatus requires `keys inspect --gateway scope key` to say
// status.
func requireInspectStatus(t *testing.T, env map[string]string, scope, key, status string) {
	t.Helper()
	out, err := runCommand(t, env, "keys", "inspect", "--gateway", scope, key)
	require.NoError(t, err, out)
	var info gatewayKeyInfo
	require.NoError(t, json.Unmarshal([]byte(out), &info), out)
	require.Equal(t, status, info.Status, out)
}

// requireListedUnknown requires `keys unknown` to list exactly the keys
// want of scope, each with the namespace its stored scope holds, the
// covered route's method and path, and holder; and `keys stats` to count
// as many.
func requireListedUnknown(t *testing.T, env map[string]string, pool *pgxpool.Pool, scope string, want []string, holder string) {
	t.Helper()
	out, err := runCommand(t, env, "keys", "unknown")
	require.NoError(t, err, out)
	var listed []unknownKey
	require.NoError(t, json.Unmarshal([]byte(out), &listed), out)
	var keys []string
	for _, k := range listed {
		keys = append(keys, k.Key)
		var stored []byte
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT scope FROM idempotency_keys WHERE idempotency_key = $1`, k.Key).Scan(&stored))
		ns, _, _ := gateway.SplitScope(string(stored))
		require.Equal(t, ns, k.Namespace, "the namespace of %s", k.Key)
		require.Equal(t, scope, k.Scope, "the caller's scope of %s", k.Key)
		require.Equal(t, "POST", k.Method, k.Key)
		require.Equal(t, "/transfers", k.Route, k.Key)
		require.Equal(t, "/transfers", k.Path, k.Key)
		require.Equal(t, holder, k.Holder, "the gateway that held %s", k.Key)
		require.False(t, k.UnknownSince.IsZero(), k.Key)
	}
	require.ElementsMatch(t, want, keys, "keys unknown lists every key left unknown: %s", out)
	out, err = runCommand(t, env, "keys", "stats")
	require.NoError(t, err, out)
	var stats struct{ Unknown int }
	require.NoError(t, json.Unmarshal([]byte(out), &stats), out)
	require.Equal(t, len(listed), stats.Unknown, "keys stats counts what keys unknown lists: %s", out)
}

// hostname is this host's name, as a gateway names itself in the keys it
// holds (host:pid).
func hostname(t *testing.T) string {
	t.Helper()
	h, err := os.Hostname()
	require.NoError(t, err)
	return h
}
