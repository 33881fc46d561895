package main

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/gateway/upstreamtest"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// getStatus is the status of GET url, or 0 if no answer came within 5 s.
func getStatus(t *testing.T, url string) (int, time.Duration) {
	t.Helper()
	start := time.Now()
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url)
	if err != nil {
		return 0, time.Since(start)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, time.Since(start)
}

// TestProxyReadinessAndALockedKeyTable: the gateway answers /healthz and
// /readyz on its metrics address, never on its own (where they are the
// upstream's paths). With the key table locked (a LOCK TABLE … ACCESS
// EXCLUSIVE that the test holds), a covered request gets 503 within
// --wait plus the documented slack, and /readyz 503 within its deadline;
// once the lock goes, both recover.
func TestProxyReadinessAndALockedKeyTable(t *testing.T) {
	t.Parallel()
	const (
		wait = time.Second
		// slack is what docs/gateway.md promises beyond --wait: the claim
		// statement's bound on the client (pgstore's loneSlack, 2 s), which
		// is what ends a wait for a locked table (PostgreSQL takes the
		// table's lock to plan the statement, before its lock_timeout is
		// set), and the round trips.
		slack = 2500 * time.Millisecond
		// burstSlack is the same for a burst of requests, which also wait
		// for the pool's connections.
		burstSlack = 6 * time.Second
	)
	u := upstreamtest.Start(t)
	dbURL, _ := testdb.Fresh(t)
	metrics := freeAddr(t)
	p := spawnProxy(t, map[string]string{"DATABASE_URL": dbURL}, "--upstream", u.URL, "--spec", u.Spec,
		"--scope-header", "X-Account-Id", "--metrics-addr", metrics, "--wait", wait.String())
	scope := "acct-" + uuid.NewString()

	for _, path := range []string{"/healthz", "/readyz"} {
		status, _ := getStatus(t, "http://"+metrics+path)
		require.Equal(t, http.StatusOK, status, "%s on the metrics address", path)
	}
	status, _ := getStatus(t, "http://"+p.addr+"/readyz")
	require.Equal(t, http.StatusNotFound, status, "the gateway's own /readyz is the upstream's (which has none)")
	status, body := gatewayPost(t, p.addr, scope, uuid.NewString(), "")
	require.Equal(t, http.StatusCreated, status, body)

	conn, err := pgx.Connect(t.Context(), dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(t.Context()) })
	tx, err := conn.Begin(t.Context())
	require.NoError(t, err)
	_, err = tx.Exec(t.Context(), "LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)
	// Asked first, while the pool has connections to spare: the table's
	// lock, not a busy pool, is what it must see.
	status, took := getStatus(t, "http://"+metrics+"/readyz")
	t.Logf("/readyz with the key table locked: %d in %s", status, took.Round(time.Millisecond))
	require.Equal(t, http.StatusServiceUnavailable, status, "not ready while the key table does not answer")
	require.Less(t, took, 2*time.Second)

	for i := range 3 {
		start := time.Now()
		status, body = gatewayPost(t, p.addr, scope, uuid.NewString(), "")
		took := time.Since(start)
		t.Logf("a covered request with the key table locked: %d in %s", status, took.Round(time.Millisecond))
		require.Equal(t, http.StatusServiceUnavailable, status, "request %d: %s", i, body)
		require.Less(t, took, wait+slack, "request %d: within --wait plus the slack: %s", i, p.logs)
	}
	// A burst: more requests at once than the gateway has database
	// connections.
	type answer struct {
		status int
		body   string
		err    error
		took   time.Duration
	}
	answers := make(chan answer, 16)
	for range cap(answers) {
		go func() {
			start := time.Now()
			status, body, err := stormPost(p.addr, scope, uuid.NewString(), "")
			answers <- answer{status, body, err, time.Since(start)}
		}()
	}
	var longest time.Duration
	for range cap(answers) {
		a := <-answers
		require.NoError(t, a.err)
		require.Equal(t, http.StatusServiceUnavailable, a.status, a.body)
		longest = max(longest, a.took)
	}
	t.Logf("a burst of 16 with the key table locked: the slowest 503 in %s", longest.Round(time.Millisecond))
	require.Less(t, longest, wait+burstSlack, "a burst: within --wait plus the slack")

	require.NoError(t, tx.Rollback(t.Context()))
	require.Eventually(t, func() bool {
		status, _ := getStatus(t, "http://"+metrics+"/readyz")
		return status == http.StatusOK
	}, 10*time.Second, 50*time.Millisecond, "ready again once the lock is gone")
	status, body = gatewayPost(t, p.addr, scope, uuid.NewString(), "")
	require.Equal(t, http.StatusCreated, status, body)
}
