package main

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/servicetest"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// testOrder is the order the command tests create.
const testOrder = `{"items":[{"sku":"SKU-1","qty":2}],"amount":1200,"currency":"RUB"}`

// postOrder sends testOrder under key.
func postOrder(client *http.Client, addr, apiKey, key string) (servicetest.Reply, error) {
	req, err := servicetest.NewRequest(http.MethodPost, "http://"+addr+"/orders", apiKey, strings.NewReader(testOrder), "Idempotency-Key", key)
	if err != nil {
		return servicetest.Reply{}, err
	}
	return servicetest.Exchange(client, req)
}

// serve is killed with SIGKILL while order requests stream in; after a
// restart, every key retried gets its order, and each key has exactly one
// order row however its first attempt ended. On one PostgreSQL, and
// sharded by account as docs/scaling.md recommends.
func TestOrdersSurviveKilledServe(t *testing.T) {
	t.Parallel()
	onPrimaryAndSharded(t, ordersSurviveKilledServe)
}

func ordersSurviveKilledServe(t *testing.T, pool *pgxpool.Pool, env map[string]string) {
	ctx := context.Background()
	creds, err := auth.CreateAccount(ctx, postgres.New(pool, nil), "kill", "")
	require.NoError(t, err)
	first := startServeProcess(t, env)
	client := &http.Client{Timeout: 10 * time.Second}

	// Eight clients send orders with fresh keys until the kill.
	var (
		mu        sync.Mutex
		keys      []string
		answered  atomic.Int64
		wg        sync.WaitGroup
		stop      atomic.Bool
		confirmed = map[string]string{} // key → body of a 201 the client saw
	)
	for range 8 {
		wg.Go(func() {
			for !stop.Load() {
				key := uuid.NewString()
				mu.Lock()
				keys = append(keys, key)
				mu.Unlock()
				if r, err := postOrder(client, first.addr, creds.APIKey, key); err == nil && r.Status == http.StatusCreated {
					mu.Lock()
					confirmed[key] = string(r.Body)
					mu.Unlock()
					answered.Add(1)
				}
			}
		})
	}
	require.Eventually(t, func() bool { return answered.Load() >= 200 }, 30*time.Second, time.Millisecond, "orders should flow before the kill")
	first.kill()
	stop.Store(true)
	servicetest.Wait(t, &wg, 30*time.Second, "the clients after the kill")

	second := startServeProcess(t, env)
	deadline := time.Now().Add(10 * time.Second) // no lease to wait out: a dead holder's transaction is gone at once
	for _, key := range keys {
		r, err := postOrder(client, second.addr, creds.APIKey, key)
		require.NoError(t, err, "retry %s", key)
		require.Equal(t, http.StatusCreated, r.Status, "retry of %s: %s", key, r)
		if body, ok := confirmed[key]; ok {
			require.Equal(t, body, string(r.Body), "a confirmed order must be replayed as it was confirmed")
		}
	}
	require.True(t, time.Now().Before(deadline), "every retry should succeed promptly")
	var rows, distinctKeys int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM orders WHERE account_id = $1", creds.AccountID).Scan(&rows))
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_keys WHERE scope = "+accountScope(env["ONCEKEY_KEY_SCOPE"]),
		creds.AccountID).Scan(&distinctKeys))
	require.Equal(t, len(keys), rows, "exactly one order per key: %d keys sent", len(keys))
	require.Equal(t, len(keys), distinctKeys, "one completed key record per key")
	t.Logf("%d keys, %d confirmed before the kill, %d unconfirmed", len(keys), len(confirmed), len(keys)-len(confirmed))
}

// Three replicas start together on an empty database: the migrations are
// applied once, and a storm of one key spread across them yields one order.
func TestReplicasBehaveAsOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL, pool := testdb.Empty(t)
	env := map[string]string{"DATABASE_URL": dbURL}
	replicas := []*serveProcess{spawnServe(t, env), spawnServe(t, env), spawnServe(t, env)}
	for _, r := range replicas {
		r.awaitReady(t)
	}
	var dup int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT version_id FROM goose_db_version GROUP BY version_id HAVING count(*) > 1) d`).Scan(&dup))
	require.Zero(t, dup, "a goose migration was recorded twice")
	var river int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM river_migration`).Scan(&river))
	require.Positive(t, river, "River's migrations were applied")

	creds, err := auth.CreateAccount(ctx, postgres.New(pool, nil), "replicas", "")
	require.NoError(t, err)
	const n = 150
	key := uuid.NewString()
	replies := make([]servicetest.Reply, n)
	errs := make([]error, n)
	client := &http.Client{Timeout: 10 * time.Second}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			replies[i], errs[i] = postOrder(client, replicas[i%len(replicas)].addr, creds.APIKey, key)
		})
	}
	close(start)
	servicetest.Wait(t, &wg, time.Minute, "the storm across three replicas")
	var created string
	statuses := map[int]int{}
	for i, r := range replies {
		require.NoError(t, errs[i], "request %d", i)
		statuses[r.Status]++
		switch r.Status {
		case http.StatusCreated:
			if created == "" {
				created = string(r.Body)
			}
			require.Equal(t, created, string(r.Body), "request %d (replica %d): every 201 is the one order", i, i%len(replicas))
		case http.StatusAccepted:
			require.NotEmpty(t, r.Header.Get("Retry-After"), "request %d: 202 without Retry-After", i)
		default:
			require.Failf(t, "unexpected reply", "request %d: %s", i, r)
		}
	}
	var rows int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM orders WHERE account_id = $1", creds.AccountID).Scan(&rows))
	require.Equal(t, 1, rows, "one order for one key across three replicas (replies %v)", statuses)
	require.Positive(t, statuses[http.StatusCreated], "someone got the order")
	t.Logf("replies: %v", statuses)
}
