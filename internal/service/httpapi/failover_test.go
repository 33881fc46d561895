package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/servicetest"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// The primary crashes (kill -9 of every PostgreSQL process) while orders
// stream in, and its synchronous standby is promoted. Oncekey runs on a
// DATABASE_URL naming both hosts with target_session_attrs=read-write, so
// it finds the new primary by itself. Clients retry each key until it is
// answered 201. Nothing acknowledged is lost: every 201 a client received
// is on the new primary, with its order and its stored response; every
// key has exactly one order; meanwhile the answers are 503 with
// Retry-After, never 500.
func TestSynchronousStandbyFailover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	primary := testdb.NewCluster(t)
	standby := primary.Standby(t)
	url := "postgres://postgres@127.0.0.1:" + primary.Port() + ",127.0.0.1:" + standby.Port() +
		"/postgres?sslmode=disable&target_session_attrs=read-write&connect_timeout=1&pool_max_conns=10"
	b, pool := onThrowawayCluster(t, url)

	var (
		mu        sync.Mutex
		acked     = map[string]reply{} // key → the 201 its client received
		statuses  = map[int]int{}
		created   atomic.Int64
		stop      atomic.Bool
		wg        sync.WaitGroup
		killed    time.Time
		firstBack time.Time
	)
	for range 4 {
		wg.Go(func() {
			for !stop.Load() {
				key := uuid.NewString()
				for { // retry this key until it is answered
					began := time.Now()
					r, err := b.exchange(b.newRequest(t, http.MethodPost, "/orders", strings.NewReader(seedBody), "Idempotency-Key", key))
					if err != nil {
						r = reply{Status: -1, Body: []byte(err.Error())}
					}
					mu.Lock()
					statuses[r.Status]++
					if r.Status == http.StatusServiceUnavailable && r.Header.Get("Retry-After") == "" {
						statuses[-503]++ // a 503 without Retry-After
					}
					if r.Status == http.StatusCreated {
						acked[key] = r
						if !killed.IsZero() && began.After(killed) && firstBack.IsZero() {
							firstBack = time.Now()
						}
					}
					mu.Unlock()
					if r.Status == http.StatusCreated {
						created.Add(1)
						break
					}
					pace(20 * time.Millisecond) // a client backing off a little
				}
			}
		})
	}
	waitCreated := func(n int64, what string) { t.Helper(); waitAtLeast(t, &created, n, what) }
	waitCreated(100, "orders before the failover")

	primary.Kill(t)
	mu.Lock()
	killed = time.Now()
	mu.Unlock()
	pace(time.Second) // the operator (or the HA manager) notices
	standby.Promote(t)
	promoted := time.Now()
	before := created.Load()
	waitCreated(before+100, "orders on the new primary")
	stop.Store(true)
	servicetest.Wait(t, &wg, time.Minute, "the clients after the failover")

	mu.Lock()
	defer mu.Unlock()
	// Every acknowledged order is on the new primary, with its stored
	// response; no key has two orders.
	var orders, keys int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM orders WHERE account_id = $1", b.account).Scan(&orders))
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_keys WHERE scope = uuid_send($1)", b.account).Scan(&keys))
	lost := 0
	for key, r := range acked {
		var order struct {
			ID string `json:"id"`
		}
		require.NoError(t, json.Unmarshal(r.Body, &order), "201 body of %s", key)
		var stored []byte
		var exists bool
		err := pool.QueryRow(ctx, `SELECT k.response_body, EXISTS (SELECT 1 FROM orders o WHERE o.account_id = $1 AND o.id = $3)
			FROM idempotency_keys k WHERE k.scope = uuid_send($1) AND k.idempotency_key = $2`, b.account, key, order.ID).Scan(&stored, &exists)
		if err != nil || !exists || string(stored) != string(r.Body) {
			lost++
			t.Errorf("acknowledged key %s (order %s) on the new primary: err %v, order there %v, stored response %q", key, order.ID, err, exists, stored)
		}
	}
	t.Logf("acknowledged %d orders (%d after the kill), lost %d, duplicates %d; without service %s (from the kill to the first 201 of a request sent after it; promoted %s after the kill); answers: %v",
		len(acked), created.Load()-before, lost, orders-len(acked), firstBack.Sub(killed).Round(time.Millisecond), promoted.Sub(killed).Round(time.Millisecond), statuses)
	require.Zero(t, lost, "acknowledged answers lost")
	require.Equal(t, len(acked), orders, "one order per acknowledged key: none lost, none duplicated")
	require.Equal(t, len(acked), keys, "one key row per key")
	for status, n := range statuses {
		require.Contains(t, []int{http.StatusCreated, http.StatusServiceUnavailable}, status, "%d answers %d (only 201 and 503 with Retry-After may come back)", n, status)
	}
	require.Positive(t, statuses[http.StatusServiceUnavailable], "the failover must have been felt")
}
