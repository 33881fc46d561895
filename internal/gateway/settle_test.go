package gateway_test

import (
	"context"
	"crypto/rand"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/internal/gateway"
	"github.com/oncekey/oncekey/internal/gateway/keyscope"
	"github.com/oncekey/oncekey/internal/service/metrics"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// TestSettleOutlivesADatabaseRestart: PostgreSQL (a cluster of the
// test's own) stops while a request is upstream, so that its answer
// cannot be settled. The client gets the answer; the gateway that has it
// replays it to the key's retries while the database is down; once the
// database is back, the settle is retried and stored, and every gateway
// replays it. The upstream ran once, and the failure was counted.
func TestSettleOutlivesADatabaseRestart(t *testing.T) {
	t.Parallel()
	cluster := testdb.NewCluster(t)
	ctx := context.Background()
	pool := func() *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(cluster.URL())
		require.NoError(t, err)
		cfg.ConnConfig.ConnectTimeout = time.Second
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		return p
	}
	require.NoError(t, pgstore.Migrate(ctx, pool(), pgstore.Options{}))

	arrived, answer := make(chan struct{}), make(chan struct{})
	var runs atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if runs.Add(1) == 1 {
			close(arrived)
			<-answer
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"tr_1"}`))
	}))
	t.Cleanup(up.Close)
	upstream, err := url.Parse(up.URL)
	require.NoError(t, err)

	// Two replicas: pools of their own on the one database.
	replica := func() (*gateway.Gateway, *metrics.Metrics, string) {
		pg, err := pgstore.New(pool(), pgstore.Options{})
		require.NoError(t, err)
		store, err := pg.ClaimAtCommit()
		require.NoError(t, err)
		m := metrics.New()
		m.HeldOperations("POST /transfers")
		g, err := gateway.New(gateway.Config{
			Upstream: upstream, Scope: keyscope.Header("X-Account-Id"),
			Routes: []gateway.Route{{Method: http.MethodPost, Path: "/transfers"}},
			Wait:   50 * time.Millisecond, UpstreamTimeout: 5 * time.Second, Observer: m,
		}, store)
		require.NoError(t, err)
		srv := httptest.NewServer(g)
		t.Cleanup(srv.Close)
		return g, m, srv.URL
	}
	a, aMetrics, aURL := replica()
	_, _, bURL := replica()
	scope, key := "acct-"+rand.Text(), rand.Text()
	ca, cb := client{t: t, url: aURL, scope: scope}, client{t: t, url: bURL, scope: scope}

	type result struct {
		status int
		body   string
	}
	first := make(chan result, 1)
	go func() {
		resp, body := ca.post("/transfers", key, transfer)
		first <- result{resp.StatusCode, body}
	}()
	<-arrived
	cluster.Stop(t) // the hold committed; the settle will not
	close(answer)
	got := <-first
	require.Equal(t, http.StatusCreated, got.status, "the client gets its answer: %s", got.body)

	resp, body := ca.post("/transfers", key, transfer)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "the gateway that has the answer replays it, the database down: %s", body)
	require.Equal(t, "true", resp.Header.Get(idempotency.HeaderReplayed))
	require.Equal(t, got.body, body)
	require.Equal(t, 1.0, sum(t, aMetrics, "oncekey_idempotency_settles_pending"), "kept in memory")

	cluster.Start(t)
	require.Eventually(t, func() bool {
		return sum(t, aMetrics, "oncekey_idempotency_settles_pending") == 0
	}, 20*time.Second, 50*time.Millisecond, "the settle is stored once the database is back")
	for name, c := range map[string]client{"the gateway that had it": ca, "another gateway": cb} {
		resp, body := c.post("/transfers", key, transfer)
		require.Equal(t, http.StatusCreated, resp.StatusCode, "%s: %s", name, body)
		require.Equal(t, "true", resp.Header.Get(idempotency.HeaderReplayed), name)
		require.Equal(t, got.body, body, name)
	}
	require.EqualValues(t, 1, runs.Load(), "the upstream ran once")
	require.Positive(t, sum(t, aMetrics, "oncekey_idempotency_settle_failures_total"), "the failures were counted")
	require.NoError(t, a.Shutdown(ctx), "nothing is left at shutdown")
}

// sum is the sum of every series of the family name in m.
func sum(t *testing.T, m *metrics.Metrics, name string) float64 {
	t.Helper()
	families, err := m.Registry.Gather()
	require.NoError(t, err)
	var total float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, s := range f.GetMetric() {
			total += s.GetGauge().GetValue() + s.GetCounter().GetValue()
		}
	}
	return total
}
