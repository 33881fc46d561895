package httpapi_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/store"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// readCounts counts where a Replica's reads went (postgres.ReplicaObserver).
type readCounts struct {
	mu     sync.Mutex
	where  map[string]int
	opened int
}

func (c *readCounts) ReplicaRead(where string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.where == nil {
		c.where = map[string]int{}
	}
	c.where[where]++
}

func (c *readCounts) ReplicaBreaker(open bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if open {
		c.opened++
	}
}

func (c *readCounts) of(where string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.where[where]
}

// onReplica is the service on db's primary, its reads served from db's
// replica, with cfg's replica settings and an observer counting the reads.
func onReplica(t *testing.T, db testdb.Replicated, cfg postgres.ReplicaConfig) (*testBundle, *readCounts) {
	t.Helper()
	replicaPool, err := postgres.OpenReplica(context.Background(), db.ReplicaURL)
	require.NoError(t, err)
	t.Cleanup(replicaPool.Close)
	counts := &readCounts{}
	cfg.Observer = counts
	pg := postgres.New(db.Pool, nil)
	replica := postgres.NewReplica(pg, replicaPool, cfg)
	t.Cleanup(replica.Close)
	return setup(t, pg, options{cfg: httpapi.Config{Reads: replica}}), counts
}

// With a streaming replica (DATABASE_REPLICA_URL), the reads that may lag
// come from it: a row it already holds may be stale, a page and a balance
// are what it shows. A row it does not hold yet is read from the primary,
// so a client is never told that what it has just created does not exist.
// Consistency: strong reads the primary, and claims and replays never read
// the replica.
func TestReadsFromAReplica(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	primary := testdb.NewCluster(t)
	replica := primary.Replica(t, 0)
	pool, err := postgres.Open(ctx, primary.URL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, postgres.Migrate(ctx, pool))
	b, counts := onReplica(t, testdb.Replicated{Pool: pool, ReplicaURL: strings.Replace(primary.URL(), primary.Port(), replica.Port(), 1)}, postgres.ReplicaConfig{})

	get := func(path string, header ...string) reply {
		t.Helper()
		r, err := b.exchange(b.newRequest(t, http.MethodGet, path, nil, header...))
		require.NoError(t, err)
		return r
	}
	strong := []string{"Consistency", "strong"}
	first := requireFresh(t, b.postOrder(t, uuid.NewString(), seedBody), "an order before the replica lags")
	replica.CatchUp(t, primary)
	require.Contains(t, string(get("/orders").Body), first.Id, "the replica shows the first order")
	served := counts.of(postgres.ReadReplica)
	require.Positive(t, served, "the page came from the replica")

	replica.Exec(t, "SELECT pg_wal_replay_pause()")
	key := uuid.NewString()
	created := b.postOrder(t, key, seedBody)
	second := requireFresh(t, created, "an order while the replica lags")

	require.Equal(t, http.StatusOK, get("/orders/"+second.Id).Status, "a row the replica does not hold yet is read from the primary")
	require.Equal(t, 1, counts.of(postgres.ReadMissing), "and counted as read around the replica")
	require.NotContains(t, string(get("/orders").Body), second.Id, "a plain page of orders comes from the lagging replica")
	require.Contains(t, string(get("/orders", strong...).Body), second.Id, "a strong page of orders comes from the primary")
	require.Positive(t, counts.of(postgres.ReadStrong))

	changed := b.patchOrder(t, first.Id, uuid.NewString(), `{"amount":1500}`)
	require.Equal(t, http.StatusOK, changed.Status, "%s", changed)
	require.Contains(t, string(get("/orders/"+first.Id).Body), `"amount":1200`, "a row the replica holds may be stale")
	require.Contains(t, string(get("/orders/"+first.Id, strong...).Body), `"amount":1500`, "Consistency: strong reads the primary")

	requireReplayOf(t, created, b.postOrder(t, key, seedBody), "a retry while the replica lags replays from the primary")
	var orders int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM orders WHERE account_id = $1", b.account).Scan(&orders))
	require.Equal(t, 2, orders, "the retry ran nothing")

	credit := b.post(t, "/bonus/credits", uuid.NewString(), `{"amount":100,"reason":"welcome"}`)
	require.Equal(t, http.StatusCreated, credit.StatusCode)
	credit.Body.Close()
	require.Contains(t, string(get("/bonus/balance").Body), `"balance":0`, "a plain balance comes from the replica")
	require.Contains(t, string(get("/bonus/balance", strong...).Body), `"balance":100`, "a strong balance comes from the primary")

	// A primary demoted by a failover is a standby like this one: never
	// ready for writes.
	standby, err := postgres.OpenReplica(ctx, strings.Replace(primary.URL(), primary.Port(), replica.Port(), 1))
	require.NoError(t, err)
	t.Cleanup(standby.Close)
	var notReady *store.NotReadyError
	require.ErrorAs(t, postgres.New(standby, nil).Ready(ctx), &notReady, "a standby is not ready")
	require.Contains(t, notReady.Reason, "read-only")

	replica.Exec(t, "SELECT pg_wal_replay_resume()")
	replica.CatchUp(t, primary)
	require.Contains(t, string(get("/orders").Body), second.Id, "the replica caught up")

	replica.Kill(t)
	began := time.Now()
	r := get("/orders/" + second.Id)
	require.Equal(t, http.StatusOK, r.Status, "with the replica down, reads go to the primary: %s", r)
	require.Less(t, time.Since(began), 2*time.Second, "the detour costs speed, not the request")
	require.Contains(t, string(get("/orders").Body), second.Id)
	require.Positive(t, counts.of(postgres.ReadFailed), "reads that failed on the replica are counted")
}

// A replica that hangs (every process stopped: connections open, nothing
// answers) costs the first few reads their replica timeout, then none:
// its breaker opens and reads go to the primary until the probe in the
// background finds the replica answering again.
func TestHungReplicaIsSkipped(t *testing.T) {
	t.Parallel()
	db := testdb.FreshReplicated(t, testdb.Delayed)
	// A replica of this test's own to freeze: the Delayed one is shared.
	replica := db.Primary.Replica(t, 0)
	db.ReplicaURL = strings.Replace(db.URL, db.Primary.Port(), replica.Port(), 1)
	const timeout, cooldown = 200 * time.Millisecond, 300 * time.Millisecond
	b, counts := onReplica(t, db, postgres.ReplicaConfig{Timeout: timeout, TripAfter: 3, Cooldown: cooldown})
	order := requireFresh(t, b.postOrder(t, uuid.NewString(), seedBody), "an order")
	replica.CatchUp(t, db.Primary)
	// The first read opens the replica's first connection, which on a
	// loaded machine can outlast the 200ms timeout: the replica rightly
	// counts that as failed and the primary answers. Fewer failures than
	// TripAfter leave the breaker closed, so a bounded retry waits for the
	// replica to serve one.
	for range 2 {
		require.Equal(t, http.StatusOK, b.get(t, "/orders/"+order.Id).Status)
		if counts.of(postgres.ReadReplica) > 0 {
			break
		}
	}
	require.Equal(t, 1, counts.of(postgres.ReadReplica), "served by the replica while it answers")
	warmFailures := counts.of(postgres.ReadFailed)

	replica.Freeze(t)
	thawed := false
	t.Cleanup(func() {
		if !thawed {
			replica.Thaw(t)
		}
	})
	const reads = 30
	began := time.Now()
	for range reads {
		r := b.get(t, "/orders/"+order.Id)
		require.Equal(t, http.StatusOK, r.Status, "a hung replica costs no answer: %s", r)
	}
	elapsed := time.Since(began)
	require.Equal(t, 3, counts.of(postgres.ReadFailed)-warmFailures, "only the reads until the breaker opened waited on the replica")
	require.Equal(t, reads-3, counts.of(postgres.ReadSkipped), "the rest went straight to the primary")
	require.Less(t, elapsed, reads*timeout/2, "%d reads took %s: a hung replica must not cost every read its timeout", reads, elapsed)

	replica.Thaw(t)
	thawed = true
	require.Eventually(t, func() bool {
		before := counts.of(postgres.ReadReplica)
		r, err := b.exchange(b.newRequest(t, http.MethodGet, "/orders/"+order.Id, nil))
		return err == nil && r.Status == http.StatusOK && counts.of(postgres.ReadReplica) > before
	}, 10*time.Second, 20*time.Millisecond, "once the replica answers again, the probe closes the breaker and reads return to it")
	counts.mu.Lock()
	defer counts.mu.Unlock()
	require.Equal(t, 1, counts.opened, "the breaker opened once")
}
