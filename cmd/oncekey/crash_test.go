package main

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/provider"
	"github.com/oncekey/oncekey/internal/service/servicetest"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// subprocessEnv makes the test binary run oncekey instead of the tests (see
// TestMain): "serve" runs `oncekey serve`, so a test can kill -9 a real
// serve process; "cli" runs the arguments after "--".
const subprocessEnv = "ONCEKEY_TEST_SUBPROCESS"

func runSubprocess(mode string) int {
	if mode == "cli" {
		return runMain(os.Args[slices.Index(os.Args, "--")+1:])
	}
	return runMain([]string{"serve"})
}

// serveProcess is `oncekey serve` in a process of its own.
type serveProcess struct {
	cmd  *exec.Cmd
	addr string
	logs *servicetest.SyncBuffer
}

// startServeProcess starts serve with env and waits until it answers.
func startServeProcess(t *testing.T, env map[string]string) *serveProcess {
	t.Helper()
	p := spawnServe(t, env)
	p.awaitReady(t)
	return p
}

// spawnServe starts serve with env on a free loopback port, without
// waiting for it.
func spawnServe(t *testing.T, env map[string]string) *serveProcess {
	t.Helper()
	return spawn(t, env, "serve")
}

// spawn starts the test binary as oncekey in mode (see runSubprocess), with
// args after "--", with env, on a loopback port of its own, and returns
// once it listens, without waiting for it to answer. Cleanup kills it.
func spawn(t *testing.T, env map[string]string, mode string, args ...string) *serveProcess {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$", "--"}, args...)...)
	// Not this process's DATABASE_URL or REDIS_URL (the tests' servers):
	// the process runs on what env gives it, in memory if nothing.
	cmd.Env = append(freshEnvironment(), subprocessEnv+"="+mode)
	return startListening(t, cmd, env)
}

// startListening starts cmd, an oncekey serve or proxy, with env on port 0
// of the loopback (ONCEKEY_ADDR), and returns once its log names the
// address it bound. A port found free beforehand and handed over can be
// taken by another test's listener in between, and then a test talks to a
// process that is not its own: once seen in CI, where a gateway's
// clients reached another test's gateway and its upstream never saw them.
func startListening(t *testing.T, cmd *exec.Cmd, env map[string]string) *serveProcess {
	t.Helper()
	cmd.Env = append(cmd.Env, "ONCEKEY_ADDR=127.0.0.1:0")
	for k, v := range servePool(env) {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	logs := &servicetest.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start(), "start %s", cmd.Path)
	p := &serveProcess{cmd: cmd, logs: logs}
	t.Cleanup(p.kill)
	p.addr = listeningAddr(t, logs)
	return p
}

// listeningRe is the line serve ("listening") and proxy ("gateway
// listening") log once their listener is bound, with its address.
var listeningRe = regexp.MustCompile(`"msg":"(?:gateway )?listening","addr":"([^"]+)"`)

// listeningAddr waits until logs name the address the process listens on.
func listeningAddr(t *testing.T, logs fmt.Stringer) string {
	t.Helper()
	var addr string
	require.Eventually(t, func() bool {
		if m := listeningRe.FindStringSubmatch(logs.String()); m != nil {
			addr = m[1]
		}
		return addr != ""
	}, 60*time.Second, 10*time.Millisecond, "the process did not log the address it listens on; its output:\n%s", logs)
	return addr
}

// awaitReady waits until serve answers /readyz.
func (p *serveProcess) awaitReady(t *testing.T) {
	t.Helper()
	p.awaitOK(t, "/readyz")
}

// awaitOK waits until the process answers GET path with 200.
func (p *serveProcess) awaitOK(t *testing.T, path string) {
	t.Helper()
	require.Eventually(t, func() bool { return p.answersOK(path) }, 60*time.Second, 20*time.Millisecond,
		"GET %s did not answer 200; the process's output:\n%s", path, p.logs)
}

// answersOK reports whether the process answers GET path with 200.
func (p *serveProcess) answersOK(path string) bool {
	resp, err := http.Get("http://" + p.addr + path)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// kill is kill -9: no shutdown, no deferred work, connections cut.
func (p *serveProcess) kill() {
	if p.cmd.ProcessState == nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	}
}

// answerLoser stands between the worker and the provider. While losing, it
// lets the provider make the charge (or refund) and then withholds the
// answer until the caller gives up or dies: the dangerous moment for
// exactly-once, when the money moved but nobody on our side knows.
type answerLoser struct {
	next   http.Handler
	losing atomic.Bool
	mu     sync.Mutex
	held   map[string]bool // the keys whose answers were withheld
}

func (a *answerLoser) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || !a.losing.Load() {
		a.next.ServeHTTP(w, r)
		return
	}
	a.next.ServeHTTP(httptest.NewRecorder(), r) // charged
	a.mu.Lock()
	a.held[r.Header.Get("Idempotency-Key")] = true
	a.mu.Unlock()
	<-r.Context().Done()
}

// withheld counts the distinct calls (by key prefix: the worker's charge
// or refund keys) made with their answers withheld.
func (a *answerLoser) withheld(prefix string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for key := range a.held {
		if strings.HasPrefix(key, prefix) {
			n++
		}
	}
	return n
}

// The whole serve process is killed while its worker waits for the
// provider's answer to charges the provider has made. After a restart every
// payment ends succeeded, each charged exactly once (counted by the
// provider), and every client retry with its key gets the final payment.
// Then the same for refunds of those payments: killed while the provider has
// refunded but not answered, restarted, each refunded exactly once. On
// PostgreSQL alone; sharded by account as docs/scaling.md recommends (the
// key table's scope a uuid, every per-account table partitioned by
// account, group commit by account); and with the API's reads on a replica
// that lags (DATABASE_REPLICA_URL): 500 ms behind, or with its replay
// paused.
func TestPaymentsSurviveKilledServe(t *testing.T) {
	t.Parallel()
	onPrimaryAndSharded(t, paymentsSurviveKilledServe)
	for _, lag := range testdb.Lags {
		t.Run(string(lag)+" replica", func(t *testing.T) {
			t.Parallel()
			db := testdb.FreshReplicated(t, lag)
			paymentsSurviveKilledServe(t, db.Pool, map[string]string{"DATABASE_URL": db.URL, "DATABASE_REPLICA_URL": db.ReplicaURL})
		})
	}
}

// onPrimaryAndSharded runs fn in parallel subtests, each on a database of
// its own with serve's configuration for it (env): one PostgreSQL, and one
// sharded (here: partitioned) by account as docs/scaling.md recommends,
// with the key table's scope a uuid and group commit by account.
func onPrimaryAndSharded(t *testing.T, fn func(t *testing.T, pool *pgxpool.Pool, env map[string]string)) {
	t.Run("primary", func(t *testing.T) {
		t.Parallel()
		dbURL, pool := testdb.Fresh(t)
		fn(t, pool, map[string]string{"DATABASE_URL": dbURL})
	})
	t.Run("sharded by account", func(t *testing.T) {
		t.Parallel()
		dbURL, pool := testdb.FreshPartitioned(t, pgstore.ScopeUUID)
		fn(t, pool, map[string]string{"DATABASE_URL": dbURL, "ONCEKEY_KEY_SCOPE": "uuid", "ONCEKEY_GROUP_COMMIT_BY_ACCOUNT": "true"})
	})
}

func paymentsSurviveKilledServe(t *testing.T, pool *pgxpool.Pool, database map[string]string) {
	ctx := context.Background()
	creds, err := auth.CreateAccount(ctx, postgres.New(pool, nil), "crash", "")
	require.NoError(t, err)

	loser := &answerLoser{held: map[string]bool{}, next: provider.NewServer(provider.NewMemoryStore(), provider.Faults{}, slog.New(slog.DiscardHandler))}
	loser.losing.Store(true)
	psrv := httptest.NewServer(loser)
	t.Cleanup(psrv.Close)
	providerClient := provider.NewClient(psrv.URL, nil)

	env := map[string]string{
		"ONCEKEY_PROVIDER_URL": psrv.URL,
		// An attempt waits long for the lost answer (the kill comes first);
		// River rescues a dead worker's job 2×3s+1s after it started.
		"ONCEKEY_PROVIDER_TIMEOUT":        "2s",
		"ONCEKEY_PAYMENT_ATTEMPT_TIMEOUT": "3s",
		"ONCEKEY_PAYMENT_RETRY_BASE":      "50ms",
	}
	maps.Copy(env, database)
	first := startServeProcess(t, env)
	client := &http.Client{Timeout: 10 * time.Second}
	post := func(addr, path, key, body string) servicetest.Reply {
		t.Helper()
		req, err := servicetest.NewRequest(http.MethodPost, "http://"+addr+path, creds.APIKey, strings.NewReader(body), "Idempotency-Key", key)
		require.NoError(t, err)
		reply, err := servicetest.Exchange(client, req)
		require.NoError(t, err)
		return reply
	}

	const n = 5
	keys, bodies, ids := make([]string, n), make([]string, n), make([]string, n)
	for i := range n {
		order := post(first.addr, "/orders", uuid.NewString(), `{"items":[{"sku":"SKU-1","qty":1}],"amount":500,"currency":"RUB"}`)
		require.Equal(t, http.StatusCreated, order.Status, "%s", order)
		orderID := strings.TrimPrefix(order.Header.Get("Location"), "/orders/")
		keys[i], bodies[i] = uuid.NewString(), fmt.Sprintf(`{"order_id":%q,"amount":500,"currency":"RUB"}`, orderID)
		r := post(first.addr, "/payments", keys[i], bodies[i])
		require.Equal(t, http.StatusAccepted, r.Status, "%s", r)
		ids[i] = strings.TrimPrefix(r.Header.Get("Location"), "/payments/")
	}
	require.Eventually(t, func() bool { return loser.withheld("oncekey-payment-") == n }, 20*time.Second, 5*time.Millisecond,
		"the worker should have charged every payment; serve's output:\n%s", first.logs)
	first.kill()
	loser.losing.Store(false)

	second := startServeProcess(t, env)
	// settle retries each client's POST on p until it answers 200 with the
	// final, succeeded operation.
	settle := func(p *serveProcess, what string, path func(i int) string, keys, bodies, ids []string) {
		t.Helper()
		for i := range n {
			var last servicetest.Reply
			require.Eventually(t, func() bool {
				last = post(p.addr, path(i), keys[i], bodies[i])
				return last.Status == http.StatusOK
			}, 60*time.Second, 50*time.Millisecond, "%s %s never settled after the restart; last reply %s; serve's output:\n%s", what, ids[i], last, p.logs)
			require.Contains(t, string(last.Body), `"status":"succeeded"`, "%s %s", what, ids[i])
			require.Contains(t, string(last.Body), `"id":"`+ids[i]+`"`, "the retry names the same %s", what)
		}
	}
	settle(second, "payment", func(int) string { return "/payments" }, keys, bodies, ids)
	for i := range n {
		charges, err := providerClient.ChargesByReference(ctx, ids[i])
		require.NoError(t, err)
		require.Len(t, charges, 1, "payment %s must be charged exactly once", ids[i])
	}
	var rows int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM payments WHERE account_id = $1", creds.AccountID).Scan(&rows))
	require.Equal(t, n, rows, "one payment per key")
	stats, err := providerClient.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, n, stats.Charges, "charges made in all")
	require.GreaterOrEqual(t, stats.Replays, int64(n), "after the restart each charge was asked for again and replayed")

	// Refunds: the second serve is killed while the provider has refunded
	// and its answers are withheld.
	loser.losing.Store(true)
	refundKeys, refundBodies, refundIDs := make([]string, n), make([]string, n), make([]string, n)
	for i := range n {
		refundKeys[i], refundBodies[i] = uuid.NewString(), `{"amount":200,"reason":"returned"}`
		r := post(second.addr, "/payments/"+ids[i]+"/refunds", refundKeys[i], refundBodies[i])
		require.Equal(t, http.StatusAccepted, r.Status, "%s", r)
		refundIDs[i] = strings.TrimPrefix(r.Header.Get("Location"), "/refunds/")
	}
	require.Eventually(t, func() bool { return loser.withheld("oncekey-refund-") == n }, 20*time.Second, 5*time.Millisecond,
		"the worker should have asked for every refund; serve's output:\n%s", second.logs)
	second.kill()
	loser.losing.Store(false)

	third := startServeProcess(t, env)
	settle(third, "refund", func(i int) string { return "/payments/" + ids[i] + "/refunds" }, refundKeys, refundBodies, refundIDs)
	for i := range n {
		refunds, err := providerClient.RefundsByReference(ctx, refundIDs[i])
		require.NoError(t, err)
		require.Len(t, refunds, 1, "refund %s must be made exactly once", refundIDs[i])
	}
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM refunds WHERE account_id = $1", creds.AccountID).Scan(&rows))
	require.Equal(t, n, rows, "one refund per key")
}

// servePoolSize is the pool of a serve (or proxy) that a test starts on
// PostgreSQL (pool_max_conns in its DATABASE_URL), unless the test sets its
// own: serve's default of 20, for each of the serves a test runs at once
// (three gateways, say), would take more of PostgreSQL's connections than
// the whole suite may hold (TEST_PG_CONNECTIONS in the Makefile). A busy
// serve answers 503 sooner, which the tests' clients retry.
const servePoolSize = 4

// servePool is env with its DATABASE_URL's pool capped at servePoolSize.
func servePool(env map[string]string) map[string]string {
	dbURL := env["DATABASE_URL"]
	if dbURL == "" || strings.Contains(dbURL, "pool_max_conns") {
		return env
	}
	capped := maps.Clone(env)
	capped["DATABASE_URL"] = testdb.PoolURL(dbURL, servePoolSize)
	return capped
}
