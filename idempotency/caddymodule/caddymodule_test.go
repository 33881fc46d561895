package caddymodule_test

import (
	"bufio"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/internal/testharness"
	"github.com/oncekey/oncekey/idempotency/pgstore/pgstoretest"
)

func TestMain(m *testing.M) { pgstoretest.Main(m, pgstoretest.Options{}) }

// upstream is the repository's test upstream (upstream.py): a transfers API
// that runs every request it gets, and counts the runs per key.
type upstream struct{ addr string }

func startUpstream(t *testing.T) upstream {
	t.Helper()
	dir := filepath.Join("..", "..", "internal", "gateway", "upstreamtest")
	cmd := exec.Command("python3", filepath.Join(dir, "upstream.py"), "--spec", filepath.Join(dir, "openapi.yaml"))
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start(), "python3 runs the test upstream")
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	return upstream{addr: strings.TrimPrefix(strings.TrimSpace(line), "listening on ")}
}

func (u upstream) runs(t *testing.T, key string) int {
	t.Helper()
	resp, err := http.Get("http://" + u.addr + "/_executions")
	require.NoError(t, err)
	defer resp.Body.Close()
	var counts struct {
		ByKey map[string]int `json:"by_key"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&counts))
	return counts.ByKey[key]
}

func freeAddr(t *testing.T) string {
	t.Helper()
	return freeAddrs(t, 1)[0]
}

// freeAddrs is n distinct free loopback addresses: every listener stays
// open until all n are taken, so that the kernel cannot hand one port out
// twice (one Caddyfile with two sites on one port is "ambiguous").
func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	addrs := make([]string, n)
	for i := range addrs {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer ln.Close()
		addrs[i] = ln.Addr().String()
	}
	return addrs
}

// buildCaddy builds cmd/caddy, Caddy with this module, as a user would.
func buildCaddy(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "caddy")
	build := exec.Command("go", "build", "-o", bin, "./cmd/caddy")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "build Caddy with the module:\n%s", out)
	return bin
}

// startCaddy runs bin on the Caddyfile, waits until every address
// answers, and returns its logs.
func startCaddy(t *testing.T, bin, caddyfile string, addrs ...string) *testharness.Logs {
	t.Helper()
	return startCaddyEnv(t, bin, caddyfile, nil, addrs...)
}

// startCaddyEnv is startCaddy, with env (NAME=value) added to Caddy's
// environment.
func startCaddyEnv(t *testing.T, bin, caddyfile string, env []string, addrs ...string) *testharness.Logs {
	t.Helper()
	_, logs := startCaddyProcess(t, bin, caddyfile, env, addrs...)
	return logs
}

// startCaddyProcess is startCaddyEnv, and returns Caddy's process too.
func startCaddyProcess(t *testing.T, bin, caddyfile string, env []string, addrs ...string) (*os.Process, *testharness.Logs) {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "Caddyfile")
	require.NoError(t, os.WriteFile(file, []byte(caddyfile), 0o600))
	cmd := exec.Command(bin, "run", "--config", file, "--adapter", "caddyfile")
	cmd.Env = append(append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir), env...)
	logs := &testharness.Logs{}
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for _, addr := range addrs {
		require.Eventually(t, func() bool {
			conn, err := net.Dial("tcp", addr)
			if err == nil {
				conn.Close()
			}
			return err == nil
		}, 60*time.Second, 50*time.Millisecond, "Caddy did not listen on %s:\n%s", addr, logs)
	}
	return cmd.Process, logs
}

// counter is the value of the series line (name{labels}) in Caddy's
// metrics at addr; -1 when there is no such series.
func counter(t *testing.T, addr, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	for line := range strings.Lines(string(body)) {
		if value, ok := strings.CutPrefix(strings.TrimSpace(line), series+" "); ok {
			v, err := strconv.ParseFloat(value, 64)
			require.NoError(t, err, line)
			return v
		}
	}
	return -1
}

// post sends a transfer to addr under key, as scope (none if empty), with
// an upstream fault if given.
func post(t *testing.T, addr, scope, key, fault string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/transfers", strings.NewReader(`{"amount":500,"currency":"EUR"}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idempotency.HeaderKey, key)
	if scope != "" {
		req.Header.Set("X-Account-Id", scope)
	}
	if fault != "" {
		req.Header.Set("X-Fault", fault)
	}
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(body)
}

// TestCaddy runs a real Caddy, built with the module, in front of the test
// upstream with reverse_proxy, keys in memory and in PostgreSQL: each
// outcome as the gateway's table says, and the upstream runs no key twice.
func TestCaddy(t *testing.T) {
	t.Parallel()
	bin := buildCaddy(t)
	up := startUpstream(t)
	dbURL := pgstoretest.URL(t)
	addrs := freeAddrs(t, 6)
	memory, postgres, dead, counted, metrics, private := addrs[0], addrs[1], addrs[2], addrs[3], addrs[4], addrs[5]
	gone := freeAddr(t) // nothing listens there
	site := func(addr, upstream, options string) string {
		return fmt.Sprintf("http://%s {\n\tidempotency {\n\t\tscope {http.request.header.X-Account-Id}\n\t\tproblem_type_base https://example.com/problems/\n%s\t}\n\treverse_proxy %s\n}\n", addr, options, upstream)
	}
	// One namespace on both PostgreSQL sites: they share keys, as replicas
	// of one site do.
	pg := fmt.Sprintf("\t\tdatabase_url %q\n\t\tnamespace shop\n", dbURL)
	logs := startCaddy(t, bin, "{\n\tadmin off\n\tauto_https off\n}\n"+
		site(memory, up.addr, "")+site(postgres, up.addr, pg)+site(dead, gone, pg)+
		site(counted, up.addr, "\t\toperation \"POST /transfers\"\n")+
		site(private, up.addr, fmt.Sprintf("\t\tdatabase_url %q\n\t\tnamespace records\n\t\tstore_responses off\n", dbURL))+
		fmt.Sprintf("http://%s {\n\tmetrics\n}\n", metrics), memory, postgres, dead, counted, metrics, private)

	for _, tc := range []struct{ name, addr string }{{"memory", memory}, {"postgres", postgres}} {
		t.Run(tc.name, func(t *testing.T) {
			scope := "acct-" + rand.Text()
			key := rand.Text()
			first, body := post(t, tc.addr, scope, key, "")
			require.Equal(t, http.StatusCreated, first.StatusCode, body)
			again, replayed := post(t, tc.addr, scope, key, "")
			require.Equal(t, http.StatusCreated, again.StatusCode, replayed)
			require.Equal(t, "true", again.Header.Get(idempotency.HeaderReplayed))
			require.Equal(t, body, replayed, "a replay is byte-exact")
			require.Empty(t, again.Header.Values("Set-Cookie"), "a replay never carries the upstream's cookie")
			require.Equal(t, 1, up.runs(t, key))

			key = rand.Text()
			resp, body := post(t, tc.addr, scope, key, "reset")
			require.Equal(t, http.StatusConflict, resp.StatusCode, "written, then reset: %s", body)
			require.Contains(t, body, idempotency.ProblemOf(idempotency.ErrOutcomeUnknown).Slug)
			resp, body = post(t, tc.addr, scope, key, "")
			require.Equal(t, http.StatusConflict, resp.StatusCode, "never run again: %s", body)
			require.Equal(t, 1, up.runs(t, key))

			key = rand.Text()
			resp, _ = post(t, tc.addr, scope, key, "fail")
			require.Equal(t, http.StatusInternalServerError, resp.StatusCode)
			resp, body = post(t, tc.addr, scope, key, "")
			require.Equal(t, http.StatusCreated, resp.StatusCode, "a 5xx frees the key: %s", body)
			require.Equal(t, 1, up.runs(t, key))

			resp, body = post(t, tc.addr, "", rand.Text(), "")
			require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "no scope: %s", body)
		})
	}

	// As oncekey proxy does: the outcome counted under the proxy's name
	// and labels (which OncekeyOutcomeUnknown watches), and logged.
	t.Run("an unknown outcome is counted and logged", func(t *testing.T) {
		series := func(outcome string) string {
			return `oncekey_idempotency_requests_total{operation="POST /transfers",outcome="` + outcome + `"}`
		}
		require.Zero(t, counter(t, metrics, series("outcome_unknown")), "the series exists at zero before the first")
		scope, key := "acct-"+rand.Text(), rand.Text()
		resp, body := post(t, counted, scope, key, "")
		require.Equal(t, http.StatusCreated, resp.StatusCode, body)
		require.Equal(t, 1.0, counter(t, metrics, series("executed")))
		key = rand.Text()
		resp, body = post(t, counted, scope, key, "reset")
		require.Equal(t, http.StatusConflict, resp.StatusCode, body)
		require.Equal(t, 1.0, counter(t, metrics, series("outcome_unknown")), "the request of unknown outcome")
		resp, body = post(t, counted, scope, key, "")
		require.Equal(t, http.StatusConflict, resp.StatusCode, body)
		require.Equal(t, 2.0, counter(t, metrics, series("outcome_unknown")), "and its retry")
		require.Contains(t, logs.String(), "the upstream took a request and did not answer; its outcome is unknown")
		require.Contains(t, logs.String(), `"path":"/transfers"`)
	})

	// A site whose answers must not be kept: the answer passes through
	// once, and the key says it ran and was not stored.
	t.Run("store_responses off", func(t *testing.T) {
		scope, key := "acct-"+rand.Text(), rand.Text()
		resp, body := post(t, private, scope, key, "")
		require.Equal(t, http.StatusCreated, resp.StatusCode, body)
		require.Contains(t, body, `"amount"`, "the upstream's answer, passed through")
		resp, body = post(t, private, scope, key, "")
		require.Equal(t, http.StatusConflict, resp.StatusCode, "not stored, never run again: %s", body)
		require.Contains(t, body, idempotency.ProblemOf(idempotency.ErrNotStored).Slug)
		require.Equal(t, 1, up.runs(t, key))
	})

	t.Run("upstream down", func(t *testing.T) {
		scope, key := "acct-"+rand.Text(), rand.Text()
		resp, body := post(t, dead, scope, key, "")
		require.Equal(t, http.StatusBadGateway, resp.StatusCode, body)
		require.Contains(t, body, "upstream-unreachable")
		resp, body = post(t, postgres, scope, key, "")
		require.Equal(t, http.StatusCreated, resp.StatusCode, "the key was freed: nothing was sent: %s", body)
		require.Equal(t, 1, up.runs(t, key))
	})
}

// TestCaddyForwardsTheBytesSent: behind the module, reverse_proxy sends
// the upstream the client's bytes, whatever the fingerprint makes of them
// (decimals beyond a double, -0, a form whose order Rack reads, a JSON
// body labelled a form as curl -d sends it); a retry respelled replays; a
// query that does not parse, which Caddy forwards as it is, is refused.
func TestCaddyForwardsTheBytesSent(t *testing.T) {
	t.Parallel()
	bin := buildCaddy(t)
	var mu sync.Mutex
	var got []string // Content-Type, Content-Length and raw body of each request upstream
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		mu.Lock()
		got = append(got, fmt.Sprintf("%s|%d|%s", r.Header.Get("Content-Type"), r.ContentLength, b))
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(up.Close)
	addr := freeAddr(t)
	startCaddy(t, bin, fmt.Sprintf("{\n\tadmin off\n\tauto_https off\n}\nhttp://%s {\n\tidempotency {\n\t\tscope {http.request.header.X-Account-Id}\n\t}\n\treverse_proxy %s\n}\n",
		addr, strings.TrimPrefix(up.URL, "http://")), addr)
	upstreamSaw := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}
	send := func(target, key, contentType, body string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, "http://"+addr+target, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", contentType)
		req.Header.Set(idempotency.HeaderKey, key)
		req.Header.Set("X-Account-Id", "acct-1")
		resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}).Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}

	const form = "application/x-www-form-urlencoded"
	for _, tc := range []struct{ name, contentType, body, retry string }{
		{"decimals", "application/json", `{"amount":123456789.123456789123,"rate":1.00000000000000000001}`, ` {"rate":1.00000000000000000001,"amount":123456789.1234567891230}`},
		{"negative zero", "application/json", `-0`, `0`},
		{"Rack's arrays of hashes", form, "order[items][][sku]=A&order[items][][qty]=1&order[items][][sku]=B&order[items][][qty]=5", "order%5Bitems%5D%5B%5D%5Bsku%5D=A&order[items][][qty]=1&&order[items][][sku]=B&order[items][][qty]=5"},
		{"JSON sent as a form, as curl -d does", form, `{"amount":123456789.123456789123}`, ""},
	} {
		key := rand.Text()
		resp := send("/orders", key, tc.contentType, tc.body)
		require.Equal(t, http.StatusCreated, resp.StatusCode, tc.name)
		saw := upstreamSaw()
		require.Equal(t, fmt.Sprintf("%s|%d|%s", tc.contentType, len(tc.body), tc.body), saw[len(saw)-1], "%s: the upstream receives the bytes sent", tc.name)
		if tc.retry != "" {
			resp = send("/orders", key, tc.contentType, tc.retry)
			require.Equal(t, "true", resp.Header.Get(idempotency.HeaderReplayed), "%s: the same request respelled replays", tc.name)
			require.Len(t, upstreamSaw(), len(saw), "%s: the retry did not reach the upstream", tc.name)
		}
	}

	n := len(upstreamSaw())
	key := rand.Text()
	for _, target := range []string{"/orders?to=alice;", "/orders?to=bob;", "/orders?to=%zz"} {
		resp := send(target, key, "application/json", `{}`)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s is refused", target)
	}
	require.Len(t, upstreamSaw(), n, "no query that does not parse went upstream")
	require.Equal(t, http.StatusCreated, send("/orders?to=alice%3B", key, "application/json", `{}`).StatusCode, "the key was not consumed")
}
