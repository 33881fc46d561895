package httpapi_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/store/postgres"
	"github.com/oncekey/oncekey/internal/testdb"
)

// With a streaming replica (DATABASE_REPLICA_URL), the reads that may lag
// come from it, Consistency: strong reads from the primary, and claims and
// replays never read from it. The replica's replay is paused to make it lag
// on purpose; then it is killed, and reads go around it to the primary.
func TestReadsFromAReplica(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	primary := testdb.NewCluster(t)
	standby := primary.Standby(t)
	pool, err := postgres.Open(ctx, primary.URL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, postgres.Migrate(ctx, pool))
	replica, err := postgres.OpenReplica(ctx, standby.URL())
	require.NoError(t, err)
	t.Cleanup(replica.Close)
	pg := postgres.New(pool, nil)
	pg.ReadFrom(replica)
	b := setup(t, pg, options{})

	get := func(path string, header ...string) reply {
		t.Helper()
		r, err := b.exchange(b.newRequest(t, http.MethodGet, path, nil, header...))
		require.NoError(t, err)
		return r
	}
	strong := []string{"Consistency", "strong"}
	first := requireFresh(t, b.postOrder(t, uuid.NewString(), seedBody), "an order before the replica lags")
	require.Eventually(t, func() bool { return get("/orders/"+first.Id).Status == http.StatusOK }, 10*time.Second, 10*time.Millisecond,
		"the replica shows the first order")

	standby.Exec(t, "SELECT pg_wal_replay_pause()")
	key := uuid.NewString()
	created := b.postOrder(t, key, seedBody)
	second := requireFresh(t, created, "an order while the replica lags")

	require.Equal(t, http.StatusNotFound, get("/orders/"+second.Id).Status, "a plain read comes from the lagging replica")
	require.Equal(t, http.StatusOK, get("/orders/"+second.Id, strong...).Status, "Consistency: strong reads the primary")
	require.NotContains(t, string(get("/orders").Body), second.Id, "a plain page of orders comes from the replica")
	require.Contains(t, string(get("/orders", strong...).Body), second.Id, "a strong page of orders comes from the primary")

	requireReplayOf(t, created, b.postOrder(t, key, seedBody), "a retry while the replica lags replays from the primary")
	var orders int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM orders WHERE account_id = $1", b.account).Scan(&orders))
	require.Equal(t, 2, orders, "the retry ran nothing")

	credit := b.post(t, "/bonus/credits", uuid.NewString(), `{"amount":100,"reason":"welcome"}`)
	require.Equal(t, http.StatusCreated, credit.StatusCode)
	credit.Body.Close()
	require.Contains(t, string(get("/bonus/balance").Body), `"balance":0`, "a plain balance comes from the replica")
	require.Contains(t, string(get("/bonus/balance", strong...).Body), `"balance":100`, "a strong balance comes from the primary")

	standby.Exec(t, "SELECT pg_wal_replay_resume()")
	require.Eventually(t, func() bool { return get("/orders/"+second.Id).Status == http.StatusOK }, 10*time.Second, 10*time.Millisecond,
		"the replica catches up")

	standby.Kill(t)
	began := time.Now()
	r := get("/orders/" + second.Id)
	require.Equal(t, http.StatusOK, r.Status, "with the replica down, reads go to the primary: %s", r)
	require.Less(t, time.Since(began), 2*time.Second, "the detour costs speed, not the request")
	require.True(t, strings.Contains(string(get("/orders").Body), second.Id))
}
