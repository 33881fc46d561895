package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/redisstore/redistest"
	"github.com/oncekey/oncekey/internal/gateway/upstreamtest"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// gatewayPost sends a transfer through the gateway at addr under key, as
// the caller scope, with an upstream fault if given.
func gatewayPost(t *testing.T, addr, scope, key, fault string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/transfers", strings.NewReader(`{"amount":700,"currency":"EUR"}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Account-Id", scope)
	req.Header.Set(idempotency.HeaderKey, key)
	if fault != "" {
		req.Header.Set(upstreamtest.Header, fault)
	}
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// TestOperatorSettlesUnknownKeys: a key whose request the upstream took and
// never answered shows as unknown in `keys inspect`, answers 409
// outcome-unknown, and runs again only when an operator releases it; one
// resolved by an operator replays what the operator gave. Each change is
// logged for audit.
func TestOperatorSettlesUnknownKeys(t *testing.T) {
	t.Parallel()
	u := upstreamtest.Start(t)
	url, pool := testdb.Fresh(t)
	env := map[string]string{"DATABASE_URL": url}
	metricsAddr := freeAddr(t)
	addr, _ := startCommand(t, env, "proxy", "--upstream", u.URL, "--spec", u.Spec, "--scope-header", "X-Account-Id", "--metrics-addr", metricsAddr)
	scope := "acct-" + uuid.NewString()
	operator := func(args ...string) (stdout, stderr string, err error) {
		var out, log bytes.Buffer
		err = run(context.Background(), args, func(k string) string { return env[k] }, strings.NewReader(""), &out, &log)
		return out.String(), log.String(), err
	}

	released, resolved := uuid.NewString(), uuid.NewString()
	for _, key := range []string{released, resolved} {
		status, body := gatewayPost(t, addr, scope, key, upstreamtest.Reset)
		require.Equal(t, http.StatusConflict, status, body)
		require.Contains(t, body, idempotency.ProblemOf(idempotency.ErrOutcomeUnknown).Slug)
	}
	// The metrics say so on the internal address, labelled by the route.
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	require.NoError(t, err)
	metrics, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Contains(t, string(metrics), `oncekey_idempotency_requests_total{operation="POST /transfers",outcome="outcome_unknown"} 2`)
	require.Contains(t, string(metrics), `oncekey_http_requests_total{code="409",method="POST",route="/transfers"} 2`)
	require.Contains(t, string(metrics), `oncekey_idempotency_keys{status="unknown"} 2`)
	// Every settle was stored at once: none retried, none kept in memory.
	require.Contains(t, string(metrics), `oncekey_idempotency_settle_failures_total{operation="POST /transfers"} 0`)
	require.Contains(t, string(metrics), "oncekey_idempotency_settles_pending 0")
	out, _, err := operator("keys", "stats")
	require.NoError(t, err, out)
	var stats struct{ Held, Unknown int }
	require.NoError(t, json.Unmarshal([]byte(out), &stats), out)
	require.Equal(t, 2, stats.Unknown, "keys of unknown outcome: %s", out)
	requireListedUnknown(t, env, pool, scope, []string{released, resolved}, fmt.Sprintf("%s:%d", hostname(t), os.Getpid()))
	out, _, err = operator("keys", "inspect", "--gateway", scope, released)
	require.NoError(t, err, out)
	var info struct {
		Held *idempotency.Held `json:"held"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &info), out)
	require.NotNil(t, info.Held, "inspect shows the held state: %s", out)
	require.Equal(t, idempotency.HeldUnknown, info.Held.State, out)
	require.Contains(t, info.Held.Reason, "did not answer", out)
	requireInspectStatus(t, env, scope, released, "unknown")

	_, _, err = operator("keys", "release", "--gateway", scope, released)
	require.ErrorContains(t, err, "--reason", "a release says why")
	out, log, err := operator("keys", "release", "--gateway", scope, released, "--reason", "TICKET-1: no transfer upstream")
	require.NoError(t, err, out)
	require.JSONEq(t, `{"released":true}`, out)
	require.Contains(t, log, "idempotency key released by an operator")
	require.Contains(t, log, "TICKET-1")
	status, body := gatewayPost(t, addr, scope, released, "")
	require.Equal(t, http.StatusCreated, status, "a released key runs again: %s", body)

	file := filepath.Join(t.TempDir(), "answer.json")
	require.NoError(t, os.WriteFile(file, []byte(`{"id":"found-by-hand"}`), 0o600))
	out, log, err = operator("keys", "resolve", "--gateway", scope, resolved, "--status", "201", "--body-file", file, "--reason", "TICKET-2: it ran")
	require.NoError(t, err, out)
	require.JSONEq(t, `{"resolved":true}`, out)
	require.Contains(t, log, "idempotency key resolved by an operator")
	status, body = gatewayPost(t, addr, scope, resolved, "")
	require.Equal(t, http.StatusCreated, status, body)
	require.Equal(t, `{"id":"found-by-hand"}`, body, "a resolved key replays what the operator gave")

	_, _, err = operator("keys", "release", "--gateway", scope, resolved, "--reason", "again")
	require.ErrorContains(t, err, "holds an outcome", "a settled key is not released")
	_, byKey := u.Executions(t)
	require.Equal(t, 2, byKey[released], "the released key ran twice: once unanswered, once after the release")
	require.Equal(t, 1, byKey[resolved], "the resolved key never ran again")
}

// spawnProxy starts `oncekey proxy` with args in a process of its own on a
// free loopback port, and waits until it passes a GET through to the
// upstream.
func spawnProxy(t *testing.T, env map[string]string, args ...string) *serveProcess {
	t.Helper()
	p := spawn(t, env, "cli", append([]string{"proxy"}, args...)...)
	p.awaitOK(t, "/_executions")
	return p
}

// TestGatewayStormAcrossProcesses: three gateway processes share the keys,
// on PostgreSQL and then on PostgreSQL with a Redis Cluster in front. Each
// key gets a storm of 32 identical requests spread over the three, and each
// client retries a 202 or 503 until it gets the answer: the upstream, which runs
// every request it gets, ran each key exactly once, and every client got
// that one answer.
func TestGatewayStormAcrossProcesses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  func(t *testing.T) map[string]string
	}{
		{"postgres", func(t *testing.T) map[string]string {
			url, _ := testdb.Fresh(t)
			return map[string]string{"DATABASE_URL": url}
		}},
		{"postgres and a redis cluster", func(t *testing.T) map[string]string {
			url, _ := testdb.Fresh(t)
			return map[string]string{"DATABASE_URL": url, "REDIS_URL": redistest.StartCluster(t, 3).URL,
				"ONCEKEY_REDIS_SECRET": strings.Repeat("s", 32)}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u := upstreamtest.Start(t)
			env := tc.env(t)
			var gateways []string
			for range 3 {
				// The oncekey profile: the document declares the 202
				// that the clients here retry.
				gateways = append(gateways, spawnProxy(t, env, "--upstream", u.URL, "--spec", u.Spec, "--scope-header", "X-Account-Id", "--wait", "200ms", "--profile", "oncekey").addr)
			}
			const keys, storm = 20, 32
			scope := "acct-" + uuid.NewString()
			start := time.Now()
			var wg sync.WaitGroup
			var mu sync.Mutex
			answers := map[string]map[string]int{} // key → body → clients
			var requests, retries atomic.Int64     // retries: after a 202 or a 503
			for k := range keys {
				key := uuid.NewString()
				mu.Lock() // the clients of earlier keys are reading answers already
				answers[key] = map[string]int{}
				mu.Unlock()
				for c := range storm {
					wg.Add(1)
					go func() {
						defer wg.Done()
						addr := gateways[(k+c)%len(gateways)]
						for attempt := 0; ; attempt++ {
							requests.Add(1)
							status, body, err := stormPost(addr, scope, key, upstreamtest.Slow(100*time.Millisecond))
							if err == nil && status == http.StatusCreated {
								mu.Lock()
								answers[key][body]++
								mu.Unlock()
								return
							}
							// A 202 (in flight) and a 503 (the gateway or its
							// store busy) carry Retry-After: a client retries
							// both with the key.
							if attempt == 100 || (err == nil && status != http.StatusAccepted && status != http.StatusServiceUnavailable) {
								t.Errorf("key %s: %d %s %v", key, status, body, err)
								return
							}
							retries.Add(1)
							pace(50 * time.Millisecond) // the client's backoff
						}
					}()
				}
			}
			wg.Wait()
			took := time.Since(start)
			total, byKey := u.Executions(t)
			for key, bodies := range answers {
				require.Equal(t, 1, byKey[key], "upstream executions of key %s", key)
				require.Len(t, bodies, 1, "every client of key %s got the one answer: %v", key, bodies)
			}
			require.Equal(t, keys, total, "upstream executions in all")
			t.Logf("%s: %d keys × %d clients over 3 gateways: %d requests (%d retries after a 202 or 503) in %s; upstream executions: %d",
				tc.name, keys, storm, requests.Load(), retries.Load(), took.Round(time.Millisecond), total)
		})
	}
}

// stormPost is gatewayPost for many goroutines: errors are returned.
func stormPost(addr, scope, key, fault string) (int, string, error) {
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/transfers", strings.NewReader(`{"amount":700,"currency":"EUR"}`))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Account-Id", scope)
	req.Header.Set(idempotency.HeaderKey, key)
	req.Header.Set(upstreamtest.Header, fault)
	resp, err := stormClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

var stormClient = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

// TestGatewayKilledMidFlight: a gateway process is killed with -9 while
// some of its requests are upstream. No key runs twice upstream: retries
// through the other gateways get the first answer of every key that was
// settled, and, once the dead gateway's lease has run out, 409
// outcome-unknown for every key that was upstream when it died.
func TestGatewayKilledMidFlight(t *testing.T) {
	t.Parallel()
	u := upstreamtest.Start(t)
	url, pool := testdb.Fresh(t)
	env := map[string]string{"DATABASE_URL": url}
	args := []string{"--upstream", u.URL, "--spec", u.Spec, "--scope-header", "X-Account-Id", "--upstream-timeout", "3s", "--profile", "oncekey"}
	victim, survivor := spawnProxy(t, env, args...), spawnProxy(t, env, args...)
	scope := "acct-" + uuid.NewString()

	const done, inFlight = 10, 10
	var settled, cut []string
	for range done {
		key := uuid.NewString()
		status, body := gatewayPost(t, victim.addr, scope, key, "")
		require.Equal(t, http.StatusCreated, status, body)
		settled = append(settled, key)
	}
	for range inFlight {
		key := uuid.NewString()
		cut = append(cut, key)
		go func() { _, _, _ = stormPost(victim.addr, scope, key, upstreamtest.Slow(2*time.Second)) }()
	}
	// Every cut key is held in PostgreSQL, and upstream, when the gateway dies.
	require.Eventually(t, func() bool {
		out, err := runCommand(t, env, "keys", "stats")
		if err != nil {
			return false
		}
		var stats struct{ Held int }
		return json.Unmarshal([]byte(out), &stats) == nil && stats.Held == inFlight
	}, 30*time.Second, 20*time.Millisecond, "the in-flight keys should be held")
	victim.kill()
	killedAt := time.Now()
	requireInspectStatus(t, env, scope, cut[0], "held")

	for _, key := range settled {
		status, body := gatewayPost(t, survivor.addr, scope, key, "")
		require.Equal(t, http.StatusCreated, status, "a key settled before the kill replays: %s", body)
	}
	status, body := gatewayPost(t, survivor.addr, scope, cut[0], "")
	require.Equal(t, http.StatusAccepted, status, "within the dead gateway's lease, its key is in flight: %s", body)
	unknown := 0
	for _, key := range cut {
		require.Eventually(t, func() bool {
			status, body = gatewayPost(t, survivor.addr, scope, key, "")
			return status != http.StatusAccepted
		}, 30*time.Second, 100*time.Millisecond)
		require.Equal(t, http.StatusConflict, status, "past the lease: %s", body)
		require.Contains(t, body, idempotency.ProblemOf(idempotency.ErrOutcomeUnknown).Slug)
		unknown++
	}
	waited := time.Since(killedAt)
	requireListedUnknown(t, env, pool, scope, cut, fmt.Sprintf("%s:%d", hostname(t), victim.cmd.Process.Pid))
	requireInspectStatus(t, env, scope, cut[0], "unknown")
	total, byKey := u.Executions(t)
	for _, key := range append(settled, cut...) {
		require.LessOrEqual(t, byKey[key], 1, "upstream executions of key %s", key)
	}
	t.Logf("kill -9 with %d keys upstream: %d settled keys replayed, %d keys outcome-unknown after %s; upstream executions %d for %d keys",
		inFlight, len(settled), unknown, waited.Round(100*time.Millisecond), total, done+inFlight)
}

// TestProxyConfiguration: proxy checks its whole configuration before it
// listens, and says every problem at once, one line each.
func TestProxyConfiguration(t *testing.T) {
	t.Parallel()
	_, err := runCommand(t, map[string]string{}, "proxy", "--upstream", "ftp://example", "--ttl", "0s",
		"--max-stored-bytes", "0", "--redis-secret", "short", "--scope-header", "X-Account-Id", "--scope-authorization", "--namespace", "a|b")
	require.Error(t, err)
	for _, want := range []string{
		`--upstream (ONCEKEY_UPSTREAM) "ftp://example": want an absolute http or https URL`,
		"--ttl (IDEMPOTENCY_TTL) is 0s: want a positive duration",
		"--max-stored-bytes (ONCEKEY_MAX_STORED_BYTES) is 0: want at least 1",
		"give --spec (ONCEKEY_SPEC)",
		"give exactly one scope source",
		"--redis-secret (ONCEKEY_REDIS_SECRET) has 5 characters",
		`--namespace (ONCEKEY_NAMESPACE): the namespace "a|b" holds a "|"`,
	} {
		require.Contains(t, err.Error(), want)
	}
	require.Equal(t, 7, strings.Count(err.Error(), "\n"), "a line for each of the seven: %v", err)
}

// TestProxyRefusesABadErrorTemplate: an error template that is not JSON,
// or names a placeholder that does not exist, and a key in two places
// stop the gateway before it listens, each with one line that says so.
func TestProxyRefusesABadErrorTemplate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	routes := filepath.Join(dir, "routes.yaml")
	require.NoError(t, os.WriteFile(routes, []byte("routes:\n  - method: POST\n    path: /charges\n"), 0o600))
	for _, tc := range []struct {
		name, template string
		args           []string
		want           string
	}{
		{"not json", `{"error": {"message": "{detail}"}`, nil, "--error-template (ONCEKEY_ERROR_TEMPLATE): " + filepath.Join(dir, "not json.json") + ": error template: not a JSON document"},
		{"unknown placeholder", `{"error": {"message": "{foo}"}}`, nil, "error template: unknown placeholder {foo}; the placeholders are {type}, {title}, {detail}, {code}, {status}"},
		{"key in two places", `{}`, []string{"--key-header", "X-Idempotency-Key", "--key-body-field", "/idempotency_key"}, "the key is in a header (X-Idempotency-Key) or in a body field (/idempotency_key), not both"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			file := filepath.Join(dir, tc.name+".json")
			require.NoError(t, os.WriteFile(file, []byte(tc.template), 0o600))
			// --ttl 0s is a second problem, so that a gateway that took
			// the template would still stop, not listen.
			_, err := runCommand(t, map[string]string{}, append([]string{"proxy", "--upstream", "http://127.0.0.1:1", "--routes", routes,
				"--scope-authorization", "--scope-secret", testScopeSecret, "--error-template", file, "--ttl", "0s"}, tc.args...)...)
			require.ErrorContains(t, err, tc.want)
			require.Equal(t, 2, strings.Count(err.Error(), "\n  - "), "one line for the template, one for --ttl: %v", err)
		})
	}
}

// testScopeSecret is --scope-secret for the tests' gateways scoped by
// --scope-authorization.
const testScopeSecret = "the tests' scope secret, 32 bytes"

// TestProxyRefusesABadStoredSize: a route of the routes file whose
// max_stored_bytes is not a positive size, or that gives it beside
// store_responses: false, stops the gateway before it listens, with one
// line that names the route.
func TestProxyRefusesABadStoredSize(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for name, tc := range map[string]struct{ route, want string }{
		"a size of zero": {"max_stored_bytes: 0",
			"--routes (ONCEKEY_ROUTES) " + filepath.Join(dir, "a size of zero.yaml") + ": gateway: routes file: route 1: max_stored_bytes 0 is not a positive number of bytes (store_responses: false stores no response)"},
		"none and a size": {"store_responses: false, max_stored_bytes: 4096",
			"route 1: store_responses: false stores no response, and max_stored_bytes bounds those stored: give one of them"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			routes := filepath.Join(dir, name+".yaml")
			require.NoError(t, os.WriteFile(routes, []byte("routes:\n  - {method: POST, path: /patients, "+tc.route+"}\n"), 0o600))
			_, err := runCommand(t, map[string]string{}, "proxy", "--upstream", "http://127.0.0.1:1", "--routes", routes,
				"--scope-authorization", "--scope-secret", testScopeSecret)
			require.ErrorContains(t, err, tc.want)
			require.Equal(t, 1, strings.Count(err.Error(), "\n  - "), "one line: %v", err)
		})
	}
}
