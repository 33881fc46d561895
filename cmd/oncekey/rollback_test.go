package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/servicetest"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// previousReleaseFile names the commit of the last release (see
// docs/operations.md, "Upgrades and rollbacks").
const previousReleaseFile = "../../api/previous-release"

// previousRelease is the commit that api/previous-release names: its last
// line that is neither blank nor a comment.
func previousRelease(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile(previousReleaseFile)
	require.NoError(t, err)
	var rev string
	for line := range strings.Lines(string(raw)) {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			rev = line
		}
	}
	require.Regexp(t, `^[0-9a-f]{40}$`, rev, "%s names a commit by its full hash", previousReleaseFile)
	return rev
}

// startBinary runs the oncekey binary bin with args on a loopback port of
// its own and env, and waits until it answers GET ready with 200. Cleanup
// kills it.
func startBinary(t *testing.T, bin string, env map[string]string, ready string, args ...string) *serveProcess {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = freshEnvironment()
	p := startListening(t, cmd, env)
	p.awaitOK(t, ready)
	return p
}

// TestPreviousReleaseRunsOnTheNewSchema: every migration is additive, so
// the previous release (api/previous-release), built from this
// repository's history, runs on a database that this release migrated: an
// operator can roll back after the upgrade's migrations ran. Its serve
// replays what this release stored, refuses a key reused for another
// request, and takes orders and payments to completion; its proxy does
// the same with a gateway's keys. The way up (this release on the
// previous one's database) is checked on the way.
func TestPreviousReleaseRunsOnTheNewSchema(t *testing.T) {
	t.Parallel()
	// One build for the subtests, which end before the parent's TempDir
	// goes.
	previous := buildOldOncekey(t, previousRelease(t))
	t.Logf("the previous release: %s", previousRelease(t))

	t.Run("serve on a database this release created", func(t *testing.T) {
		t.Parallel()
		dbURL, _ := testdb.Fresh(t)
		env := map[string]string{"DATABASE_URL": dbURL, "ONCEKEY_DEMO_API_KEY": strongKey(t)}
		current := startServeProcess(t, env)
		made := createOrder(t, current.addr, env["ONCEKEY_DEMO_API_KEY"])
		current.kill()

		old := startBinary(t, previous, env, "/readyz", "serve")
		made.requireReplayed(t, old)
		exerciseOrders(t, old, env["ONCEKEY_DEMO_API_KEY"])
	})

	t.Run("serve after an upgrade, rolled back", func(t *testing.T) {
		t.Parallel()
		// The previous release migrates an empty database, as in
		// production before the upgrade.
		dbURL, _ := testdb.Empty(t)
		env := map[string]string{"DATABASE_URL": dbURL, "ONCEKEY_DEMO_API_KEY": strongKey(t)}
		before := startBinary(t, previous, env, "/readyz", "serve")
		madeBefore := createOrder(t, before.addr, env["ONCEKEY_DEMO_API_KEY"])
		before.kill()

		upgraded := startServeProcess(t, env)
		madeBefore.requireReplayed(t, upgraded)
		madeAfter := createOrder(t, upgraded.addr, env["ONCEKEY_DEMO_API_KEY"])
		upgraded.kill()

		rolledBack := startBinary(t, previous, env, "/readyz", "serve")
		madeBefore.requireReplayed(t, rolledBack)
		madeAfter.requireReplayed(t, rolledBack)
		exerciseOrders(t, rolledBack, env["ONCEKEY_DEMO_API_KEY"])
	})

	t.Run("proxy on a key table this release created", func(t *testing.T) {
		t.Parallel()
		up := &runRecorder{runs: map[string]int{}}
		upstream := httptest.NewServer(up)
		t.Cleanup(upstream.Close)
		dbURL, _ := testdb.Empty(t)
		env := map[string]string{"DATABASE_URL": dbURL}
		routes := filepath.Join(t.TempDir(), "routes.yaml")
		require.NoError(t, os.WriteFile(routes, []byte("routes:\n  - method: POST\n    path: /transfers\n"), 0o600))
		args := []string{"proxy", "--upstream", upstream.URL, "--routes", routes, "--scope-header", "X-Account-Id"}

		// This release's gateway migrates the key table and stores a key.
		current := spawn(t, env, "cli", args...)
		current.awaitOK(t, "/health")
		stored := sendTransfer(t, current.addr, "before-rollback", `{"amount":500}`)
		require.Equal(t, http.StatusCreated, stored.Status, "%s", stored)
		current.kill()

		old := startBinary(t, previous, env, "/health", args...)
		for _, tc := range []struct {
			key, body string
			replayed  bool
		}{
			{"before-rollback", `{"amount":500}`, true},
			{"after-rollback", `{"amount":700}`, false},
			{"after-rollback", `{"amount":700}`, true},
		} {
			reply := sendTransfer(t, old.addr, tc.key, tc.body)
			require.Equal(t, http.StatusCreated, reply.Status, "%s %s on the previous release: %s\n%s", tc.key, tc.body, reply, old.logs)
			if tc.replayed {
				require.Equal(t, "true", reply.Header.Get(idempotency.HeaderReplayed), "%s is replayed", tc.key)
			}
		}
		require.Equal(t, string(stored.Body), string(sendTransfer(t, old.addr, "before-rollback", `{"amount":500}`).Body),
			"the previous release replays this release's answer byte for byte")
		mismatch := sendTransfer(t, old.addr, "after-rollback", `{"amount":900}`)
		// 422: the gateway's default profile follows the IETF draft.
		require.Equal(t, http.StatusUnprocessableEntity, mismatch.Status, "a key reused for another body: %s", mismatch)
		require.Contains(t, string(mismatch.Body), idempotency.ProblemOf(idempotency.ErrKeyMismatch).Slug)
		require.Equal(t, 1, up.ran("before-rollback"), "the key this release stored ran once")
		require.Equal(t, 1, up.ran("after-rollback"), "the key the previous release stored ran once")
	})
}

// sendTransfer posts body to a gateway's /transfers with key, as account
// acct-1.
func sendTransfer(t *testing.T, addr, key, body string) servicetest.Reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/transfers", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Account-Id", "acct-1")
	req.Header.Set(idempotency.HeaderKey, key)
	reply, err := servicetest.Exchange(&http.Client{Timeout: 30 * time.Second}, req)
	require.NoError(t, err)
	return reply
}

// madeOrder is an order created with a key, and the answer it got.
type madeOrder struct {
	apiKey, key, body string
	reply             servicetest.Reply
}

// createOrder creates an order on the serve at addr with a key of its own.
func createOrder(t *testing.T, addr, apiKey string) madeOrder {
	t.Helper()
	o := madeOrder{apiKey: apiKey, key: uuid.NewString(), body: `{"items":[{"sku":"SKU-1","qty":2}],"amount":500,"currency":"RUB"}`}
	o.reply = postWithKey(t, addr, apiKey, "/orders", o.key, o.body)
	require.Equal(t, http.StatusCreated, o.reply.Status, "%s", o.reply)
	return o
}

// requireReplayed sends the order's request again to p, which must replay
// its answer byte for byte.
func (o madeOrder) requireReplayed(t *testing.T, p *serveProcess) {
	t.Helper()
	again := postWithKey(t, p.addr, o.apiKey, "/orders", o.key, o.body)
	require.Equal(t, o.reply.Status, again.Status, "%s; serve's output:\n%s", again, p.logs)
	require.Equal(t, "true", again.Header.Get(idempotency.HeaderReplayed), "%s is replayed", o.key)
	require.Equal(t, string(o.reply.Body), string(again.Body), "%s replays its answer byte for byte", o.key)
	require.Equal(t, o.reply.Header.Get("Location"), again.Header.Get("Location"))
}

// exerciseOrders drives the serve p: an order created with a key and
// replayed, the key reused for another order (409), and a payment of the
// order taken to completion.
func exerciseOrders(t *testing.T, p *serveProcess, apiKey string) {
	t.Helper()
	order := createOrder(t, p.addr, apiKey)
	order.requireReplayed(t, p)
	reused := postWithKey(t, p.addr, apiKey, "/orders", order.key, `{"items":[{"sku":"SKU-2","qty":1}],"amount":900,"currency":"RUB"}`)
	require.Equal(t, http.StatusConflict, reused.Status, "a key reused for another order: %s", reused)
	require.Contains(t, string(reused.Body), idempotency.ProblemOf(idempotency.ErrKeyMismatch).Slug)

	orderID := strings.TrimPrefix(order.reply.Header.Get("Location"), "/orders/")
	paymentKey, payment := uuid.NewString(), fmt.Sprintf(`{"order_id":%q,"amount":500,"currency":"RUB"}`, orderID)
	accepted := postWithKey(t, p.addr, apiKey, "/payments", paymentKey, payment)
	require.Equal(t, http.StatusAccepted, accepted.Status, "%s", accepted)
	id := strings.TrimPrefix(accepted.Header.Get("Location"), "/payments/")
	// The payment's worker charges the in-process sandbox provider; its
	// retries answer 200 once the payment has settled.
	var last servicetest.Reply
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		req, err := servicetest.NewRequest(http.MethodPost, "http://"+p.addr+"/payments", apiKey, strings.NewReader(payment), idempotency.HeaderKey, paymentKey)
		require.NoError(c, err)
		reply, err := servicetest.Exchange(http.DefaultClient, req)
		require.NoError(c, err)
		require.Equal(c, http.StatusOK, reply.Status, "payment %s: %s", id, reply)
		last = reply
	}, 30*time.Second, 50*time.Millisecond, "payment %s never settled; serve's output:\n%s", id, p.logs)
	require.Contains(t, string(last.Body), `"status":"succeeded"`)
	require.Contains(t, string(last.Body), `"id":"`+id+`"`, "the retry names the same payment")
}

// postWithKey posts body to path on the serve at addr with an
// Idempotency-Key.
func postWithKey(t *testing.T, addr, apiKey, path, key, body string) servicetest.Reply {
	t.Helper()
	req, err := servicetest.NewRequest(http.MethodPost, "http://"+addr+path, apiKey, strings.NewReader(body), idempotency.HeaderKey, key)
	require.NoError(t, err)
	reply, err := servicetest.Exchange(&http.Client{Timeout: 30 * time.Second}, req)
	require.NoError(t, err)
	return reply
}
