package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/servicetest"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// internalRe is the line that names the address of --metrics-addr.
var internalRe = regexp.MustCompile(`"msg":"internal endpoints on","addr":"([^"]+)"`)

// repeatedCount reads oncekey_idempotency_repeated_requests_total of the
// operation and refused from the metrics at url.
func repeatedCount(t *testing.T, url, operation string, refused bool) int {
	t.Helper()
	return counterValue(t, url, `oncekey_idempotency_repeated_requests_total{operation="`+operation+`",refused="`+strconv.FormatBool(refused)+`"}`)
}

// counterValue reads one series of the counters at url.
func counterValue(t *testing.T, url, series string) int {
	t.Helper()
	series += " "
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	for line := range strings.Lines(string(raw)) {
		if v, ok := strings.CutPrefix(line, series); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			require.NoError(t, err, line)
			return n
		}
	}
	t.Fatalf("no series %s in the metrics:\n%s", series, raw)
	return 0
}

// TestClientsThatChangeKeysAreSeen: a client that makes a new key for
// every attempt, against a slow upstream behind `oncekey proxy`, times out
// each attempt and sends the order again. Observing (the default), every
// attempt runs upstream, and the counter counts each repeat; with
// --refuse-repeats, the attempts while the first runs and after it are
// refused with 409 repeated-request, which names the first order, and the
// upstream makes one order; a client that means a second one says so.
func TestClientsThatChangeKeysAreSeen(t *testing.T) {
	t.Parallel()
	const attempts = 4
	for _, refuse := range []bool{false, true} {
		t.Run("refuse="+strconv.FormatBool(refuse), func(t *testing.T) {
			t.Parallel()
			var started, finished atomic.Int64
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := started.Add(1)
				_, _ = io.Copy(io.Discard, r.Body)
				pace(300 * time.Millisecond) // a slow order: longer than the client waits
				w.Header().Set("Location", "/orders/"+strconv.FormatInt(n, 10))
				w.WriteHeader(http.StatusCreated)
				finished.Add(1)
			}))
			t.Cleanup(up.Close)
			routes := filepath.Join(t.TempDir(), "routes.yaml")
			require.NoError(t, os.WriteFile(routes, []byte("routes:\n  - {method: POST, path: /orders}\n"), 0o600))
			url, _ := testdb.Fresh(t)
			args := []string{"proxy", "--upstream", up.URL, "--routes", routes, "--scope-header", "X-Account-Id",
				"--metrics-addr", "127.0.0.1:0"}
			if refuse {
				args = append(args, "--refuse-repeats")
			}
			p := spawn(t, map[string]string{"DATABASE_URL": url}, "cli", args...)
			m := internalRe.FindStringSubmatch(p.logs.String()) // logged before it listens
			require.NotNil(t, m, "the metrics' address in the log:\n%s", p.logs)
			metrics := "http://" + m[1] + "/metrics"
			(&serveProcess{addr: m[1], logs: p.logs}).awaitOK(t, "/readyz")

			impatient := &http.Client{Timeout: 100 * time.Millisecond}
			send := func(client *http.Client, header ...string) (int, string, error) {
				req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://"+p.addr+"/orders", strings.NewReader(`{"cart":123}`))
				require.NoError(t, err)
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-Account-Id", "acct-1")
				req.Header.Set("Idempotency-Key", uuid.NewString()) // the fault: a new key per attempt
				for i := 0; i+1 < len(header); i += 2 {
					req.Header.Set(header[i], header[i+1])
				}
				resp, err := client.Do(req)
				if err != nil {
					return 0, "", err
				}
				defer resp.Body.Close()
				body, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, string(body), nil
			}

			_, _, err := send(impatient)
			require.Error(t, err, "the first attempt times out")
			require.Eventually(t, func() bool { return started.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
			for range attempts - 1 {
				status, body, err := send(impatient)
				if refuse {
					require.NoError(t, err, "a refused repeat is answered at once")
					require.Equal(t, http.StatusConflict, status, body)
					require.Contains(t, body, "made under another Idempotency-Key", "the repeated-request problem")
					require.Contains(t, body, "still running")
				} else {
					require.Error(t, err, "each attempt runs, slowly, and times out")
				}
			}
			patient := &http.Client{Timeout: 10 * time.Second}
			if !refuse {
				require.Eventually(t, func() bool { return finished.Load() == attempts }, 10*time.Second, 5*time.Millisecond,
					"observing, every attempt makes an order: the fault this makes visible")
				require.Equal(t, attempts-1, repeatedCount(t, metrics, "POST /orders", false), "each repeat counted")
				require.Zero(t, repeatedCount(t, metrics, "POST /orders", true))
				return
			}
			// The upstream's handler returning is not the gateway's settle:
			// wait until the gateway counts the first run as executed.
			executed := `oncekey_idempotency_requests_total{operation="POST /orders",outcome="executed"}`
			require.Eventually(t, func() bool { return counterValue(t, metrics, executed) == 1 }, 10*time.Second, 5*time.Millisecond)
			status, body, err := send(patient)
			require.NoError(t, err)
			require.Equal(t, http.StatusConflict, status, body)
			require.Contains(t, body, "answered 201 with Location /orders/1", "the refusal names the first order")
			require.EqualValues(t, 1, started.Load(), "one order for %d attempts", attempts+1)
			require.Equal(t, attempts, repeatedCount(t, metrics, "POST /orders", true), "each refusal counted")

			status, body, err = send(patient, "Idempotency-Repeat", "?1")
			require.NoError(t, err)
			require.Equal(t, http.StatusCreated, status, "a second order the client means: %s", body)
			require.EqualValues(t, 2, started.Load())
		})
	}
}

// TestServeRefusesRepeatsWhenAsked: `oncekey serve` with
// IDEMPOTENCY_REFUSE_REPEATS on PostgreSQL makes one order of a client's
// attempts under new keys: the second is 409 repeated-request, nothing is
// written, and the orders table has one row; Idempotency-Repeat: ?1 makes
// the second order the client means.
func TestServeRefusesRepeatsWhenAsked(t *testing.T) {
	t.Parallel()
	url, pool := testdb.Fresh(t)
	ctx := context.Background()
	creds, err := auth.CreateAccount(ctx, postgres.New(pool, nil), "repeats", "")
	require.NoError(t, err)
	addr, _ := startServe(t, map[string]string{"DATABASE_URL": url, "IDEMPOTENCY_REFUSE_REPEATS": "true"})
	client := &http.Client{Timeout: 10 * time.Second}
	orders := func() (n int) {
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM orders").Scan(&n))
		return n
	}

	first, err := postOrder(client, addr, creds.APIKey, uuid.NewString())
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, first.Status, "%s", first)
	again, err := postOrder(client, addr, creds.APIKey, uuid.NewString())
	require.NoError(t, err)
	require.Equal(t, http.StatusConflict, again.Status, "%s", again)
	require.Contains(t, string(again.Body), "made under another Idempotency-Key", "the repeated-request problem")
	require.Equal(t, 1, orders(), "no second order")

	req, err := servicetest.NewRequest(http.MethodPost, "http://"+addr+"/orders", creds.APIKey, strings.NewReader(testOrder),
		"Idempotency-Key", uuid.NewString(), "Idempotency-Repeat", "?1")
	require.NoError(t, err)
	meant, err := servicetest.Exchange(client, req)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, meant.Status, "%s", meant)
	require.Equal(t, 2, orders())
}
