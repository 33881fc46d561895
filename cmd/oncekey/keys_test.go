package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
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
	"github.com/oncekey/oncekey/internal/gateway/upstreamtest"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
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

	// pgstore's: the key table, its version table, its guard view, its
	// audit trail and the pieces of large answers.
	want := slices.Sorted(slices.Values(append(slices.Clone(app),
		"idempotency_keys (r)", "idempotency_keys_schema_version (r)", "idempotency_keys_claimed (v)", "idempotency_keys_audit (r)", "idempotency_keys_pieces (r)")))
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
		{"keys", "audit"},
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

// gatewayKeyTable makes a database of t's own with only the key table, as a
// gateway's, and returns the keys commands' environment for it.
func gatewayKeyTable(t *testing.T) (env map[string]string, pool *pgxpool.Pool, store *pgstore.Store) {
	t.Helper()
	dbURL, pool := testdb.Empty(t)
	require.NoError(t, pgstore.Migrate(context.Background(), pool, pgstore.Options{}))
	store, err := pgstore.New(pool, pgstore.Options{})
	require.NoError(t, err)
	return map[string]string{"DATABASE_URL": dbURL}, pool, store
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
	env, _, store := gatewayKeyTable(t)
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

// TestKeysAudit: `keys resolve` and `keys release` each leave one row of
// the audit trail, with the operator (--operator, or the OS user), the
// reason, the key's namespace, scope and previous state, and the body's
// SHA-256; an attempt refused (a key still running, a key in no namespace)
// leaves a refused row that says why. `keys audit` lists them newest
// first, by namespace, scope, key, time and count.
func TestKeysAudit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env, pool, store := gatewayKeyTable(t)
	const nsA, nsB = "http://a.internal:80", "http://b.internal:80"
	running := idempotency.Held{State: idempotency.HeldRunning, Until: time.Now().Add(time.Hour), Holder: "gw-1:42"}
	unknown := &idempotency.Held{State: idempotency.HeldUnknown, Reason: "the upstream did not answer", Holder: "gw-1:42"}
	holdKey(t, store, gateway.NamespacedScope(nsA, "acct-1"), "to-resolve", running, unknown)
	holdKey(t, store, gateway.NamespacedScope(nsB, "acct-1"), "to-release", running, unknown)
	holdKey(t, store, gateway.NamespacedScope(nsA, "acct-2"), "running", running, nil)
	var released []byte
	require.NoError(t, pool.QueryRow(ctx, `SELECT response_body FROM idempotency_keys WHERE idempotency_key = 'to-release'`).Scan(&released))

	file := filepath.Join(t.TempDir(), "answer.json")
	answer := []byte(`{"id":"found-by-hand"}`)
	require.NoError(t, os.WriteFile(file, answer, 0o600))
	out, err := runCommand(t, env, "keys", "resolve", "--gateway", "acct-1", "to-resolve", "--status", "201", "--body-file", file,
		"--reason", "TICKET-5: it ran", "--operator", "alice@example.com")
	require.NoError(t, err, out)
	require.JSONEq(t, `{"resolved":true}`, out)
	out, err = runCommand(t, env, "keys", "release", "--gateway", "acct-1", "to-release", "--reason", "TICKET-6: it did not run")
	require.NoError(t, err, out)
	_, err = runCommand(t, env, "keys", "release", "--gateway", "acct-2", "running", "--reason", "TICKET-7", "--operator", "bob")
	require.ErrorIs(t, err, keyadmin.ErrStillRunning)
	require.ErrorContains(t, err, "keys audit", "the refusal says where it is logged")
	_, err = runCommand(t, env, "keys", "resolve", "--gateway", "acct-3", "nowhere", "--status", "200", "--reason", "TICKET-8", "--operator", "bob")
	require.ErrorIs(t, err, keyadmin.ErrKeyNotFound)

	audit := func(args ...string) []auditRow {
		t.Helper()
		out, err := runCommand(t, env, append([]string{"keys", "audit"}, args...)...)
		require.NoError(t, err, out)
		var rows []auditRow
		require.NoError(t, json.Unmarshal([]byte(out), &rows), out)
		return rows
	}
	rows := audit()
	require.Len(t, rows, 4, "one row per attempt")
	osUser, err := user.Current()
	require.NoError(t, err)
	sum := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
	type seen struct {
		Namespace, Scope, Key, Actor, Action, Previous, Outcome, Reason, Hash string
		Status                                                                int
	}
	var got []seen
	for _, r := range rows {
		require.Equal(t, "postgres", r.DatabaseUser, "the database role: %+v", r)
		require.WithinDuration(t, time.Now(), r.At, time.Minute)
		require.Equal(t, r.Outcome == keyadmin.OutcomeRefused, r.Refusal != "", "a refusal says why: %+v", r)
		got = append(got, seen{r.Namespace, r.Scope, r.Key, r.Actor, r.Action, r.PreviousState, r.Outcome, r.Reason, r.BodySHA256, r.ResponseStatus})
	}
	require.Equal(t, []seen{
		{"", "acct-3", "nowhere", "bob", "resolve", "absent", "refused", "TICKET-8", sum(nil), 200},
		{nsA, "acct-2", "running", "bob", "release", "held", "refused", "TICKET-7", sum(running.Response().Body), 0},
		{nsB, "acct-1", "to-release", osUser.Username, "release", "unknown", "done", "TICKET-6: it did not run", sum(released), 0},
		{nsA, "acct-1", "to-resolve", "alice@example.com", "resolve", "unknown", "done", "TICKET-5: it ran", sum(answer), 201},
	}, got, "newest first")

	keysOf := func(rows []auditRow) []string {
		var out []string
		for _, r := range rows {
			out = append(out, r.Key)
		}
		return out
	}
	require.Equal(t, []string{"running", "to-resolve"}, keysOf(audit("--namespace", nsA)))
	require.Equal(t, []string{"to-resolve"}, keysOf(audit("--namespace", nsA, "--scope", "acct-1")))
	require.Equal(t, []string{"to-release", "to-resolve"}, keysOf(audit("--scope", "acct-1")), "a scope in every namespace")
	require.Equal(t, []string{"to-release"}, keysOf(audit("--key", "to-release")))
	require.Equal(t, []string{"nowhere"}, keysOf(audit("--limit", "1")))
	require.Len(t, audit("--since", "1h"), 4)
	require.Empty(t, audit("--since", time.Now().Add(time.Hour).UTC().Format(time.RFC3339)))
	_, err = runCommand(t, env, "keys", "audit", "--since", "yesterday")
	require.ErrorContains(t, err, "--since")
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
