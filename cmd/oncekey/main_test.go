package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/pgstore/keyadmin"
	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(subprocessEnv); mode != "" {
		os.Exit(runSubprocess(mode))
	}
	testdb.Main(m)
}

func runCommand(t *testing.T, env map[string]string, args ...string) (string, error) {
	t.Helper()
	return runCommandWithInput(t, env, "", args...)
}

func runCommandWithInput(t *testing.T, env map[string]string, input string, args ...string) (string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), args, func(k string) string { return env[k] }, strings.NewReader(input), &stdout, &stderr)
	return stdout.String(), err
}

func TestCommandsOnPostgres(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": testdb.URL(t)}

	_, err := runCommand(t, env, "migrate")
	require.NoError(t, err, "migrate")

	out, err := runCommand(t, env, "accounts", "create", "acme")
	require.NoError(t, err, "accounts create")
	var creds struct {
		AccountID string `json:"account_id"`
		APIKey    string `json:"api_key"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &creds), "accounts create prints one JSON line: %q", out)
	require.NotEmpty(t, creds.AccountID)
	require.True(t, strings.HasPrefix(creds.APIKey, "ok_"), "api key %q", creds.APIKey)
	require.Equal(t, 1, strings.Count(out, "\n"), "exactly one line")

	out, err = runCommand(t, env, "purge")
	require.NoError(t, err, "purge")
	require.Contains(t, out, `"deleted":`)

	// serve on PostgreSQL accepts the new key end to end.
	serveEnv := map[string]string{"DATABASE_URL": env["DATABASE_URL"], "ONCEKEY_API_KEY_CACHE_TTL": "200ms"}
	addr, _ := startServe(t, serveEnv)
	resp, err := postOrder(http.DefaultClient, addr, creds.APIKey, "cmd-test-1")
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.Status, "%s", resp)

	ready, err := http.Get("http://" + addr + "/readyz")
	require.NoError(t, err)
	defer ready.Body.Close()
	require.Equal(t, http.StatusOK, ready.StatusCode)

	// Revoked, the key is refused once the replica's key cache forgets it.
	out, err = runCommandWithInput(t, env, creds.APIKey+"\n", "accounts", "revoke-key")
	require.NoError(t, err, "accounts revoke-key")
	require.JSONEq(t, `{"revoked":true}`, out)
	out, err = runCommandWithInput(t, env, creds.APIKey, "accounts", "revoke-key")
	require.NoError(t, err, "revoking again")
	require.JSONEq(t, `{"revoked":false}`, out, "an already revoked key")
	_, err = runCommandWithInput(t, env, "", "accounts", "revoke-key")
	require.Error(t, err, "no key on standard input")
	// serve trusts a looked-up key for ONCEKEY_API_KEY_CACHE_TTL (here
	// 200ms): the revocation holds once that has passed.
	require.Eventually(t, func() bool {
		revoked, err := postOrder(http.DefaultClient, addr, creds.APIKey, "cmd-test-2")
		return err == nil && revoked.Status == http.StatusUnauthorized
	}, 5*time.Second, 50*time.Millisecond, "a revoked key must be refused within the cache TTL")
}

func TestCommandErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"unknown command", nil, []string{"frobnicate"}, "unexpected argument frobnicate\n(see 'oncekey --help')"},
		{"a group without its command", nil, []string{"keys"}, `expected one of "inspect", "resolve", "release", "stats", "stuck"`},
		{"unknown flag", nil, []string{"serve", "--frobnicate"}, "unknown flag --frobnicate\n(see 'oncekey serve --help')"},
		{"extra argument", nil, []string{"serve", "--addr", "127.0.0.1:0", "extra"}, "unexpected argument extra"},
		{"accounts without name", map[string]string{"DATABASE_URL": "postgres://x"}, []string{"accounts", "create"}, "missing <name>: the command is 'oncekey accounts create <name>"},
		{"keys inspect without its key", map[string]string{"DATABASE_URL": "postgres://x"}, []string{"keys", "inspect", "some-key"}, "missing <key>: the command is 'oncekey keys inspect <account> <key> [flags]'\n(see 'oncekey keys inspect --help')"},
		{"migrate without database", nil, []string{"migrate"}, "needs PostgreSQL: set --database-url or DATABASE_URL"},
		{"keys stats without database", nil, []string{"keys", "stats"}, "needs PostgreSQL"},
		{"bad ttl", map[string]string{"IDEMPOTENCY_TTL": "two days"}, []string{"serve"}, `--ttl: IDEMPOTENCY_TTL="two days": expected duration`},
		{"bad ttl flag", nil, []string{"serve", "--ttl", "two days"}, `--ttl: expected duration`},
		{"negative wait", map[string]string{"IDEMPOTENCY_WAIT": "-1s"}, []string{"serve"}, "--wait (IDEMPOTENCY_WAIT) is -1s"},
		{"bad body limit", map[string]string{"ONCEKEY_MAX_BODY_BYTES": "lots"}, []string{"serve"}, "ONCEKEY_MAX_BODY_BYTES"},
		{"huge cleanup batch", map[string]string{"ONCEKEY_CLEANUP_BATCH": "5000000000"}, []string{"serve"}, "--cleanup-batch (ONCEKEY_CLEANUP_BATCH) is 5000000000"},
		{"wait not below the request timeout", map[string]string{"IDEMPOTENCY_WAIT": "10s"}, []string{"serve"}, "must be shorter"},
		{"bad address", nil, []string{"serve", "--addr", "8080"}, `--addr (ONCEKEY_ADDR) "8080": want host:port`},
		{"metrics on the API's address", nil, []string{"serve", "--metrics-addr", "127.0.0.1:8080"}, "give the internal listener an address of its own"},
		{"bad tracing", map[string]string{"ONCEKEY_TRACING": "jaeger"}, []string{"serve"}, `--tracing (ONCEKEY_TRACING) "jaeger": want off or stdout`},
		{"revoke without a key", map[string]string{"DATABASE_URL": "postgres://x"}, []string{"accounts", "revoke-key"}, "give the API key on standard input"},
		{"contract-test without a key", nil, []string{"contract-test", "--url", "http://127.0.0.1:1"}, "missing flags: --api-key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := runCommand(t, tt.env, tt.args...)
			require.Error(t, err)
			require.Contains(t, err.Error(), tt.want)
		})
	}
}

// parseServe parses `oncekey serve args...` with env and returns the
// configuration serve would run with.
func parseServe(t *testing.T, env map[string]string, args ...string) (config, error) {
	t.Helper()
	getenv := func(k string) string { return env[k] }
	var c cli
	k, err := parser(&c, getenv, io.Discard, io.Discard)
	require.NoError(t, err)
	_, err = k.Parse(append([]string{"serve"}, args...))
	require.NoError(t, err, "parse serve %v", args)
	return c.Serve.config(getenv)
}

func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := parseServe(t, nil)
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:8080", cfg.Addr, "loopback unless told otherwise: the demo key is public")
	require.Equal(t, DemoAPIKey, cfg.DemoAPIKey, "the README's examples work as printed")
	require.Empty(t, cfg.MetricsAddr, "metrics on the API's address by default")
	require.Equal(t, 48*time.Hour, cfg.TTL)
	require.Equal(t, time.Second, cfg.Wait)
	require.EqualValues(t, 64<<10, cfg.MaxBodyBytes, "a few times the largest valid body, not a megabyte")
	require.Empty(t, cfg.Tracing, "tracing off")

	onPostgres, err := parseServe(t, map[string]string{"DATABASE_URL": "postgres://x"})
	require.NoError(t, err)
	require.Empty(t, onPostgres.DemoAPIKey, "no demo account on PostgreSQL unless asked for")
}

// strongKey is a full-strength API key, as a demo key must be.
func strongKey(t *testing.T) string {
	t.Helper()
	key, err := auth.NewKey()
	require.NoError(t, err)
	return key
}

// A flag beats its environment variable; the variable beats the default.
func TestFlagsBeatVariables(t *testing.T) {
	t.Parallel()
	fromEnv, fromFlag := strongKey(t), strongKey(t)
	env := map[string]string{"ONCEKEY_ADDR": "127.0.0.1:9001", "IDEMPOTENCY_TTL": "2h", "ONCEKEY_DEMO_API_KEY": fromEnv}
	cfg, err := parseServe(t, env)
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:9001", cfg.Addr)
	require.Equal(t, 2*time.Hour, cfg.TTL)
	require.Equal(t, fromEnv, cfg.DemoAPIKey)

	cfg, err = parseServe(t, env, "--addr", "127.0.0.1:9002", "--ttl=3h", "--demo-api-key", fromFlag)
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:9002", cfg.Addr)
	require.Equal(t, 3*time.Hour, cfg.TTL)
	require.Equal(t, fromFlag, cfg.DemoAPIKey)
}

// A demo key that anyone could guess is refused unless the operator says
// the setup is a throwaway one; the in-memory default, the README's key,
// is such a setup by itself.
func TestWeakDemoKeysAreRefused(t *testing.T) {
	t.Parallel()
	for _, weak := range []string{DemoAPIKey, "ok_short", "sk_" + strongKey(t)[3:], strongKey(t) + "x"} {
		_, err := parseServe(t, map[string]string{"ONCEKEY_DEMO_API_KEY": weak})
		require.ErrorContains(t, err, "--demo-api-key (ONCEKEY_DEMO_API_KEY) is not a full-strength key", weak)
		require.NotContains(t, err.Error(), weak, "the key is not repeated in the error")
		cfg, err := parseServe(t, map[string]string{"ONCEKEY_DEMO_API_KEY": weak, "ONCEKEY_ALLOW_WEAK_DEMO_API_KEY": "true"})
		require.NoError(t, err, "allowed on a throwaway setup")
		require.Equal(t, weak, cfg.DemoAPIKey)
	}
	cfg, err := parseServe(t, nil)
	require.NoError(t, err)
	require.Equal(t, DemoAPIKey, cfg.DemoAPIKey, "the in-memory default needs no allowance")
}

// Every problem with the configuration is reported at once, one line each,
// before anything listens.
func TestConfigProblemsAreReportedTogether(t *testing.T) {
	t.Parallel()
	_, err := parseServe(t, map[string]string{"IDEMPOTENCY_TTL": "-1s"}, "--wait=20s", "--tracing=x", "--addr=nowhere")
	require.Error(t, err)
	lines := strings.Split(err.Error(), "\n")
	require.Equal(t, "invalid configuration:", lines[0])
	require.Len(t, lines, 5, "one line per problem:\n%s", err)
	for i, want := range []string{"--ttl (IDEMPOTENCY_TTL)", "--wait (IDEMPOTENCY_WAIT)", "--addr (ONCEKEY_ADDR)", "--tracing (ONCEKEY_TRACING)"} {
		require.Contains(t, lines[i+1], want)
	}
}

// TestShutdownDrainsInFlightRequests sends SIGTERM's equivalent while a
// request is still uploading its body: serve stops accepting new
// connections but finishes that request, which gets its 201.
func TestShutdownDrainsInFlightRequests(t *testing.T) {
	t.Parallel()
	key := strongKey(t)
	status, _ := drainInFlight(t, map[string]string{"ONCEKEY_DEMO_API_KEY": key}, key)
	require.Equal(t, http.StatusCreated, status)
}

// On PostgreSQL the drained request's response is stored: after a restart
// its retry replays it.
func TestShutdownStoresInFlightResponses(t *testing.T) {
	t.Parallel()
	dbURL, pool := testdb.Fresh(t)
	creds, err := auth.CreateAccount(context.Background(), postgres.New(pool, nil), "drain", "")
	require.NoError(t, err)
	env := map[string]string{"DATABASE_URL": dbURL}
	status, body := drainInFlight(t, env, creds.APIKey)
	require.Equal(t, http.StatusCreated, status)

	addr, _ := startServe(t, env)
	replay, err := postOrder(http.DefaultClient, addr, creds.APIKey, "drain-1")
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, replay.Status)
	require.Equal(t, "true", replay.Header.Get("Idempotent-Replayed"), "the drained request's response was stored")
	require.Equal(t, string(body), string(replay.Body))
}

// drainInFlight starts serve with env, begins an order request, shuts
// serve down while the request is in flight, and returns its answer.
func drainInFlight(t *testing.T, env map[string]string, apiKey string) (int, []byte) {
	t.Helper()
	addr, shutdown := startServe(t, env)

	body, upload := io.Pipe()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/orders", body)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Idempotency-Key", "drain-1")
	req.Header.Set("Content-Type", "application/json")
	type result struct {
		status int
		body   []byte
		err    error
	}
	answered := make(chan result, 1)
	// "Expect: 100-continue" makes the client send the body only once the
	// handler has started reading it, so the request is surely in flight
	// (accepted and being handled) when shutdown begins; a connection the
	// server has not accepted yet is, rightly, refused.
	req.Header.Set("Expect", "100-continue")
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, ExpectContinueTimeout: 30 * time.Second}}
	go func() {
		resp, err := client.Do(req)
		if err != nil {
			answered <- result{err: err}
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		answered <- result{status: resp.StatusCode, body: body, err: err}
	}()

	const order = testOrder
	_, err = upload.Write([]byte(order[:20]))
	require.NoError(t, err, "first half of the body")

	stopped := make(chan error, 1)
	go func() { stopped <- shutdown() }()
	// New connections are refused once shutdown has begun.
	require.Eventually(t, func() bool {
		conn, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err != nil {
			return true
		}
		conn.Close()
		return false
	}, 5*time.Second, 10*time.Millisecond, "serve should stop accepting connections")

	_, err = upload.Write([]byte(order[20:]))
	require.NoError(t, err, "second half of the body")
	require.NoError(t, upload.Close())

	got := <-answered
	require.NoError(t, got.err, "the in-flight request must be answered")
	require.NoError(t, <-stopped, "serve returns cleanly after draining")
	return got.status, got.body
}

// TestOperatorCommands runs the key commands on a database of each key
// scope type (ONCEKEY_KEY_SCOPE): a command given another type than the
// table's fails, naming it, before it reads or writes anything.
func TestOperatorCommands(t *testing.T) {
	t.Parallel()
	for _, scope := range []pgstore.ScopeType{pgstore.ScopeBytea, pgstore.ScopeUUID} {
		t.Run(string(scope), func(t *testing.T) {
			t.Parallel()
			operatorCommands(t, scope)
		})
	}
}

// accountScope is SQL for the account $1 as a key table of the key scope
// type (ONCEKEY_KEY_SCOPE, "" for the default) holds it: the uuid itself,
// or its 16 bytes.
func accountScope(keyScope string) string {
	if keyScope == string(pgstore.ScopeUUID) {
		return "$1"
	}
	return "uuid_send($1)"
}

func operatorCommands(t *testing.T, scope pgstore.ScopeType) {
	ctx := context.Background()
	dbURL, pool := testdb.Empty(t) // purge must see only this test's keys
	keys := pgstore.Options{Scope: scope}
	require.NoError(t, postgres.MigrateKeys(ctx, pool, keys))
	env := map[string]string{"DATABASE_URL": dbURL, "ONCEKEY_KEY_SCOPE": string(scope)}
	store := postgres.NewKeys(pool, nil, keys)
	account := accountScope(string(scope))
	creds, err := auth.CreateAccount(ctx, store, "ops", "")
	require.NoError(t, err)

	// A completed key, through the store as the middleware would.
	fp := idempotency.Fingerprint{1, 2, 3}
	lease, _, err := store.Keys().Claim(ctx, idempotency.ClaimRequest{Scope: auth.Scope(creds.AccountID), Key: "done", Fingerprint: fp,
		Method: "POST", Route: "/orders", TTL: time.Hour, Wait: time.Second})
	require.NoError(t, err)
	require.NoError(t, lease.Commit(ctx, idempotency.Response{Status: 201, Header: http.Header{}, Body: []byte(`{"id":"x"}`)}))
	// A key stuck in processing for 20 minutes and one expired an hour ago.
	for _, q := range []string{
		`INSERT INTO idempotency_keys (scope, idempotency_key, fingerprint, request_method, request_route, status, created_at, expires_at)
		 VALUES (` + account + `, 'stuck', $2, 'POST', '/orders', 'processing', now() - interval '20 minutes', now() + interval '1 hour')`,
		`INSERT INTO idempotency_keys (scope, idempotency_key, fingerprint, request_method, request_route, status, response_status, response_body, completed_at, created_at, expires_at)
		 VALUES (` + account + `, 'old', $2, 'POST', '/orders', 'completed', 201, '{}', now() - interval '2 hours', now() - interval '2 hours', now() - interval '1 hour')`,
	} {
		_, err := pool.Exec(ctx, q, creds.AccountID, fp[:])
		require.NoError(t, err)
	}
	out, err := runCommand(t, env, "keys", "inspect", creds.AccountID.String(), "done")
	require.NoError(t, err)
	var info keyadmin.KeyInfo
	require.NoError(t, json.Unmarshal([]byte(out), &info), out)
	require.Contains(t, out, `"account_id": "`+creds.AccountID.String()+`"`, "the key's account")
	require.NotContains(t, out, `"scope"`, "the scope is shown as the account")
	require.Equal(t, "completed", info.Status)
	require.Equal(t, 201, info.ResponseStatus)
	require.Equal(t, hex.EncodeToString(fp[:]), info.Fingerprint)
	require.Equal(t, "/orders", info.Route)
	require.NotContains(t, out, `{"id":"x"}`, "the stored body is not shown")

	_, err = runCommand(t, env, "keys", "inspect", creds.AccountID.String(), "nope")
	require.ErrorIs(t, err, keyadmin.ErrKeyNotFound)

	out, err = runCommand(t, env, "keys", "stats")
	require.NoError(t, err)
	var stats map[string]float64
	require.NoError(t, json.Unmarshal([]byte(out), &stats), out)
	require.GreaterOrEqual(t, stats["processing"], 1.0)
	require.GreaterOrEqual(t, stats["oldest_processing_age_seconds"], 19*60.0)
	require.Positive(t, stats["table_bytes"])
	require.Positive(t, stats["pieces_bytes"], "the pieces table's size, its indexes' first pages")

	out, err = runCommand(t, env, "keys", "stuck", "--older-than", "10m")
	require.NoError(t, err)
	require.Contains(t, out, `"idempotency_key": "stuck"`)
	require.NotContains(t, out, `"idempotency_key": "done"`)

	out, err = runCommand(t, env, "keys", "unknown")
	require.NoError(t, err)
	require.JSONEq(t, `[]`, out, "no held key: none of unknown outcome")

	out, err = runCommand(t, env, "purge", "--dry-run")
	require.NoError(t, err)
	require.Contains(t, out, `"dry_run":true`)
	var count int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_keys WHERE scope = "+account+" AND idempotency_key = 'old'", creds.AccountID).Scan(&count))
	require.Equal(t, 1, count, "a dry run deletes nothing")

	out, err = runCommand(t, env, "purge")
	require.NoError(t, err)
	require.JSONEq(t, `{"deleted":1}`, out)
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_keys WHERE scope = "+account+"", creds.AccountID).Scan(&count))
	require.Equal(t, 2, count, "only the expired key is gone")

	other := map[pgstore.ScopeType]string{pgstore.ScopeBytea: "uuid", pgstore.ScopeUUID: "bytea"}[scope]
	_, err = runCommand(t, map[string]string{"DATABASE_URL": dbURL, "ONCEKEY_KEY_SCOPE": other}, "keys", "stuck")
	require.ErrorIs(t, err, pgstore.ErrScopeType, "the key table's scope is %s, the command's %s", scope, other)
}

// `payments stuck` lists what the pending-age metric and the abandoned
// tasks' counter count: payments pending for longer than --older-than, and
// the charge jobs given up.
func TestPaymentsStuck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL, pool := testdb.Fresh(t)
	env := map[string]string{"DATABASE_URL": dbURL}
	creds, err := auth.CreateAccount(ctx, postgres.New(pool, nil), "stuck", "")
	require.NoError(t, err)
	stuck, fresh, gone := uuid.New(), uuid.New(), uuid.New()
	for payment, age := range map[uuid.UUID]string{stuck: "2 hours", fresh: "0 seconds"} {
		order := uuid.New()
		_, err := pool.Exec(ctx, `INSERT INTO orders (account_id, id, status, amount, currency, items, created_at)
			VALUES ($1, $2, 'created', 100, 'RUB', '[]', now())`, creds.AccountID, order)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `INSERT INTO payments (account_id, id, order_id, amount, currency, status, idempotency_key, key_created_at, created_at)
			VALUES ($1, $2, $3, 100, 'RUB', 'pending', $4, now(), now() - $5::interval)`, creds.AccountID, payment, order, payment.String(), age)
		require.NoError(t, err)
	}
	// A charge job given up, as the worker leaves one whose payment the
	// primary never held.
	_, err = pool.Exec(ctx, `INSERT INTO river_job (kind, queue, state, args, attempt, max_attempts, finalized_at, errors)
		VALUES ('charge_payment', 'payments', 'cancelled', $1, 8, 19, now(), ARRAY[$2::jsonb])`,
		fmt.Sprintf(`{"account_id":%q,"payment_id":%q}`, creds.AccountID, gone),
		`{"at":"2026-12-05T00:00:00Z","attempt":8,"error":"payments: the job's payment does not exist"}`)
	require.NoError(t, err)

	out, err := runCommand(t, env, "payments", "stuck", "--older-than", "1h")
	require.NoError(t, err)
	var report struct {
		Payments []struct {
			Payment    string  `json:"payment_id"`
			AgeSeconds float64 `json:"age_seconds"`
		} `json:"pending_payments"`
		Refunds []any `json:"pending_refunds"`
		GivenUp []struct {
			Kind, State, Error string
			Payment            string `json:"payment_id"`
			Attempts           int
		} `json:"jobs_given_up"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &report), out)
	require.Len(t, report.Payments, 1, "only the payment pending for over an hour: %s", out)
	require.Equal(t, stuck.String(), report.Payments[0].Payment)
	require.GreaterOrEqual(t, report.Payments[0].AgeSeconds, 7000.0)
	require.Empty(t, report.Refunds)
	require.Len(t, report.GivenUp, 1, out)
	require.Equal(t, gone.String(), report.GivenUp[0].Payment)
	require.Equal(t, "charge", report.GivenUp[0].Kind)
	require.Equal(t, "cancelled", report.GivenUp[0].State)
	require.Equal(t, 8, report.GivenUp[0].Attempts)
	require.Contains(t, report.GivenUp[0].Error, "does not exist")
}

// TestEveryVariableIsDocumented keeps the configuration reference true:
// every environment variable a flag reads is in docs/operations.md and
// docs/configuration.md, and every one documented there is read.
func TestEveryVariableIsDocumented(t *testing.T) {
	t.Parallel()
	var names []string
	for _, file := range []string{"cli.go", "proxy.go"} {
		src, err := os.ReadFile(file)
		require.NoError(t, err)
		for _, m := range regexp.MustCompile(`envvar:"([A-Z0-9_]+)"`).FindAllStringSubmatch(string(src), -1) {
			if !slices.Contains(names, m[1]) {
				names = append(names, m[1])
			}
		}
	}
	require.Len(t, names, 59, "the variables of cli.go and proxy.go")
	documented := regexp.MustCompile("`((?:ONCEKEY|IDEMPOTENCY)_[A-Z0-9_]+|DATABASE_URL|DATABASE_REPLICA_URL|REDIS_URL)`")
	for _, doc := range []string{"../../docs/operations.md", "../../docs/configuration.md"} {
		text, err := os.ReadFile(doc)
		require.NoError(t, err)
		for _, n := range names {
			require.True(t, strings.Contains(string(text), "`"+n+"`"), "%s does not document %s", doc, n)
		}
		if strings.HasSuffix(doc, "configuration.md") {
			for _, n := range names {
				require.Contains(t, string(text), "| `"+n+"` | `--"+flagOf(n)+"` |", "docs/configuration.md's tables name %s's flag", n)
			}
		}
		for _, m := range documented.FindAllStringSubmatch(string(text), -1) {
			require.Contains(t, names, m[1], "%s documents %s, which no flag reads", doc, m[1])
		}
	}
}

// ONCEKEY_PPROF_ADDR serves the profiling endpoints on their own listener;
// the API's address never has them.
func TestPprofOnItsOwnAddress(t *testing.T) {
	t.Parallel()
	pprofAddr := freeAddr(t)
	addr, _ := startServe(t, map[string]string{"ONCEKEY_PPROF_ADDR": pprofAddr})

	resp, err := http.Get("http://" + pprofAddr + "/debug/pprof/goroutine?debug=1")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, string(body), "goroutine profile:")

	api, err := http.Get("http://" + addr + "/debug/pprof/")
	require.NoError(t, err)
	api.Body.Close()
	require.Equal(t, http.StatusNotFound, api.StatusCode, "no profiling on the API's address")
}

// TestShutdownDoesNotWaitForStalledClients: a connection that sent headers
// and half a body and then stalled, and an idle keep-alive one, do not hold
// serve's shutdown (they held it for all of ONCEKEY_SHUTDOWN_TIMEOUT, and
// serve then exited with an error).
func TestShutdownDoesNotWaitForStalledClients(t *testing.T) {
	t.Parallel()
	env := map[string]string{"ONCEKEY_SHUTDOWN_TIMEOUT": "20s"}
	addr, shutdown := startServe(t, env)

	idle, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { idle.Close() })
	_, err = fmt.Fprint(idle, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(idle), nil)
	require.NoError(t, err, "the idle connection's one request")
	resp.Body.Close()
	// The stalled client sends half a body with its headers and asks for
	// 100 Continue, which the server sends when it begins to read the
	// body: it then takes in the half and waits for the rest, on a
	// connection reading a body; the idle one, answered a round trip
	// earlier, is idle.
	stalled, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { stalled.Close() })
	_, err = fmt.Fprintf(stalled, "POST /orders HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+DemoAPIKey+"\r\nIdempotency-Key: stalled\r\n"+
		"Content-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n%s", len(testOrder), testOrder[:10])
	require.NoError(t, err, "headers and half a body")
	require.NoError(t, stalled.SetReadDeadline(time.Now().Add(10*time.Second)))
	status, err := bufio.NewReader(stalled).ReadString('\n')
	require.NoError(t, err, "the server's answer to Expect: 100-continue")
	require.Equal(t, "HTTP/1.1 100 Continue\r\n", status, "the server reads the stalled client's body")

	start := time.Now()
	require.NoError(t, shutdown(), "serve exits cleanly")
	took := time.Since(start)
	t.Logf("shutdown with a stalled and an idle connection took %s", took.Round(time.Millisecond))
	require.Less(t, took, 3*time.Second, "shutdown waited for stalled clients")
}

// A demo key given on PostgreSQL works as long as it is given: its account
// is created on the first start, found by the key on the next, and at a
// start without the setting (or with another key) its key stops working,
// until it is given again. The README's ok_local_demo, left unflagged in a
// database by an earlier version, is disabled the same way.
func TestDemoKeyOnPostgresLastsAsLongAsItsSetting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL, pool := testdb.Fresh(t)
	// The README's key, given to this database before demo keys were told
	// apart: an account named demo with a plain key.
	_, err := auth.CreateAccount(ctx, postgres.New(pool, nil), "demo", DemoAPIKey)
	require.NoError(t, err)
	key, other := strongKey(t), strongKey(t)
	order := func(addr, apiKey string) int {
		t.Helper()
		r, err := postOrder(http.DefaultClient, addr, apiKey, uuid.NewString())
		require.NoError(t, err)
		return r.Status
	}
	for i, step := range []struct {
		demo       string
		key, other int // statuses of an order with each key
		readme     int
	}{
		{demo: key, key: http.StatusCreated, other: http.StatusUnauthorized, readme: http.StatusUnauthorized},
		{demo: key, key: http.StatusCreated, other: http.StatusUnauthorized, readme: http.StatusUnauthorized},
		{demo: "", key: http.StatusUnauthorized, other: http.StatusUnauthorized, readme: http.StatusUnauthorized},
		{demo: other, key: http.StatusUnauthorized, other: http.StatusCreated, readme: http.StatusUnauthorized},
		{demo: key, key: http.StatusCreated, other: http.StatusUnauthorized, readme: http.StatusUnauthorized},
	} {
		env := map[string]string{"DATABASE_URL": dbURL}
		if step.demo != "" {
			env["ONCEKEY_DEMO_API_KEY"] = step.demo
		}
		addr, shutdown := startServe(t, env)
		require.Equal(t, step.key, order(addr, key), "start %d: the first demo key", i+1)
		require.Equal(t, step.other, order(addr, other), "start %d: the second demo key", i+1)
		require.Equal(t, step.readme, order(addr, DemoAPIKey), "start %d: the README's key, given long ago", i+1)
		require.NoError(t, shutdown())
	}
	var accounts int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM accounts WHERE name = 'demo'").Scan(&accounts))
	require.Equal(t, 3, accounts, "one demo account per key, each created once (and the old one)")
}

// `accounts create NAME` refuses a name in use unless told otherwise.
func TestAccountNamesAreUniqueUnlessAllowed(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": testdb.URL(t)}
	name := "acme-" + uuid.NewString()
	out, err := runCommand(t, env, "accounts", "create", name)
	require.NoError(t, err)
	var first auth.Credentials
	require.NoError(t, json.Unmarshal([]byte(out), &first))

	_, err = runCommand(t, env, "accounts", "create", name)
	require.ErrorContains(t, err, fmt.Sprintf("an account named %q exists already (account_id %s); pass --allow-duplicate-name", name, first.AccountID))

	out, err = runCommand(t, env, "accounts", "create", "--allow-duplicate-name", name)
	require.NoError(t, err)
	var second auth.Credentials
	require.NoError(t, json.Unmarshal([]byte(out), &second))
	require.NotEqual(t, first.AccountID, second.AccountID)
}

// --metrics-addr moves /metrics to an internal listener, and nothing else:
// the profiling endpoints (which show the command line and burn CPU) are
// only ever where --pprof-addr puts them. The API's address has neither.
func TestMetricsOnAnInternalAddress(t *testing.T) {
	t.Parallel()
	internal := freeAddr(t)
	addr, _ := startServe(t, map[string]string{"ONCEKEY_METRICS_ADDR": internal})
	get := func(url string) (int, string) {
		t.Helper()
		resp, err := http.Get(url)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body)
	}

	status, body := get("http://" + internal + "/metrics")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, "oncekey_http_requests_total")
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/goroutine?debug=1"} {
		status, _ := get("http://" + internal + path)
		require.Equal(t, http.StatusNotFound, status, "%s on the metrics address", path)
	}
	for _, path := range []string{"/metrics", "/debug/pprof/"} {
		status, _ := get("http://" + addr + path)
		require.Equal(t, http.StatusNotFound, status, "%s on the API's address", path)
	}
}
