package redisstore_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"

	"github.com/oncekey/oncekey/idempotency/internal/testharness"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/pgstore/pgstoretest"
	"github.com/oncekey/oncekey/idempotency/redisstore"
	"github.com/oncekey/oncekey/idempotency/redisstore/redistest"
	"github.com/oncekey/oncekey/idempotency/storetest"
)

func TestClusterURLs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		url     string
		cluster bool
		err     string
	}{
		{"redis://127.0.0.1:6379/0", false, ""},
		{"redis+cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002", true, ""},
		{"redis+cluster://127.0.0.1:7000", true, ""},
		{"rediss+cluster://user:secret@10.0.0.1:7000,10.0.0.2:7000/0", true, ""},
		{"redis://127.0.0.1:7000,127.0.0.1:7001/0", false, "for a Redis Cluster, write redis+cluster://127.0.0.1:7000,127.0.0.1:7001"},
		{"redis+cluster://127.0.0.1:7000,,127.0.0.1:7001", false, "has an empty host"},
		{"redis+cluster://127.0.0.1:7000/3", false, "a Redis Cluster has only database 0"},
		{"http+cluster://127.0.0.1:7000", false, "want redis+cluster or rediss+cluster"},
		// Credentials never reach an error, which a service prints at start.
		{"redis://default:S3CRET@127.0.0.1:7000,127.0.0.1:7001/0", false, "names several hosts (REDACTED@127.0.0.1:7000,127.0.0.1:7001)"},
		{"redis://default:S3CRET@127.0.0.1:bad/0", false, "REDACTED"},
		{"redis+cluster://default:S3CRET@127.0.0.1:7000,,127.0.0.1:7001", false, "has an empty host"},
		{"redis+cluster://default:S3CRET@127.0.0.1:bad", false, "REDACTED"},
	}
	for _, tt := range tests {
		rdb, err := redisstore.NewClient(tt.url)
		if tt.err != "" {
			require.ErrorContains(t, err, tt.err, tt.url)
			require.NotContains(t, err.Error(), "S3CRET", "the password stays out of the error")
			continue
		}
		require.NoError(t, err, tt.url)
		_, isCluster := rdb.(*redis.ClusterClient)
		require.Equal(t, tt.cluster, isCluster, tt.url)
		require.NoError(t, rdb.Close())
	}
	rdb, err := redisstore.NewClient("redis+cluster://127.0.0.1:7000,127.0.0.1:7001")
	require.NoError(t, err)
	defer rdb.Close()
	require.Equal(t, []string{"127.0.0.1:7000", "127.0.0.1:7001"}, rdb.(*redis.ClusterClient).Options().Addrs)
}

// crossSlot counts the commands a Redis Cluster refused because their keys
// were in different slots.
type crossSlot struct{ n atomic.Int64 }

func (c *crossSlot) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *crossSlot) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		c.count(err)
		return err
	}
}

func (c *crossSlot) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			c.count(cmd.Err())
		}
		return err
	}
}

func (c *crossSlot) count(err error) {
	if err != nil && strings.Contains(err.Error(), "CROSSSLOT") {
		c.n.Add(1)
	}
}

// TestOnRedisCluster runs the fast path on a real Redis Cluster of three
// masters and three replicas: the store contract and a storm hold through
// it, every key of an account is in one slot and no command crosses slots,
// and a failover (a replica taking over, then a master killed) costs
// speed for a few seconds but never an answer or an extra execution.
func TestOnRedisCluster(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t, 3)
	rdb, err := redisstore.NewClient(cluster.URL)
	require.NoError(t, err)
	t.Cleanup(func() { rdb.Close() })
	hook := &crossSlot{}
	rdb.AddHook(hook)
	fast := redisstore.New(rdb, redisstore.Config{Prefix: "cluster:", AlwaysLookUp: true})

	t.Run("store contract", func(t *testing.T) {
		storetest.Run(t, testharness.Wrapped(testharness.Memstore(), infront[*memstore.Tx](fast)))
		storetest.Run(t, testharness.Wrapped(pgstoretest.DeferredHarness(pgstoretest.Pool(t), pgstore.Options{}), infront[*pgstore.Batch](fast)))
	})

	t.Run("storm", func(t *testing.T) {
		obs := &observed{}
		store := fastPath(rdb, redisstore.Config{Prefix: "cluster:", Observer: obs}, pgStore(t))
		executed, failures, _ := load(t, store, []string{rand.Text(), rand.Text()}, 10, 0, 10, 0, nil)
		require.Empty(t, failures)
		require.EqualValues(t, 20, executed.Load(), "each key's operation ran exactly once")
		require.Positive(t, obs.hit.Load(), "replays were served by the cluster")
		require.Zero(t, obs.errs.Load(), "no look-up failed")
	})

	t.Run("one slot per account", func(t *testing.T) {
		ctx := context.Background()
		scope := rand.Text()
		slots := map[int64]bool{}
		for i := range 200 {
			record, marker := fast.KeyNames(scope, fmt.Sprintf("key-%d", i))
			for _, name := range []string{record, marker} {
				slot, err := rdb.ClusterKeySlot(ctx, name).Result()
				require.NoError(t, err)
				slots[slot] = true
			}
		}
		require.Len(t, slots, 1, "the record and marker keys of one account's idempotency keys")
		// And the keys the contract and the storm left, wherever they are:
		// each is in the slot of its account's hash tag.
		cc := rdb.(*redis.ClusterClient)
		var found atomic.Int64
		require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			iter := node.Scan(ctx, 0, "cluster:*", 1000).Iterator()
			for iter.Next(ctx) {
				key := iter.Val()
				tag := key[strings.Index(key, "{") : strings.Index(key, "}")+1]
				keySlot, err := node.ClusterKeySlot(ctx, key).Result()
				if err != nil {
					return err
				}
				tagSlot, err := node.ClusterKeySlot(ctx, tag).Result()
				if err != nil {
					return err
				}
				if keySlot != tagSlot {
					return fmt.Errorf("%s is in slot %d, its account's tag %s in %d", key, keySlot, tag, tagSlot)
				}
				found.Add(1)
			}
			return iter.Err()
		}))
		require.Positive(t, found.Load(), "keys left by the contract and the storm")
		require.Zero(t, hook.n.Load(), "commands refused for crossing slots")
	})

	t.Run("failover", func(t *testing.T) {
		obs := &timedObserver{}
		store := fastPath(rdb, redisstore.Config{Prefix: "cluster:", Observer: obs}, pgStore(t))
		ctx := context.Background()
		// Accounts enough to have keys on every master.
		var scopes []string
		for range 12 {
			scopes = append(scopes, rand.Text())
		}
		record, _ := fast.KeyNames(scopes[0], "k")
		var failedOver, killed time.Time
		events := func(round int) {
			switch round {
			case 20: // the replica of the first account's master takes over, cleanly
				slot := slotOf(t, rdb, record)
				replica := nodeAt(t, cluster, slot.Nodes[1].Addr)
				require.NoError(t, replica.Client(t).Do(ctx, "CLUSTER", "FAILOVER").Err())
				failedOver = time.Now()
			case 60: // the master of the first account's keys (the former replica) crashes
				slot := slotOf(t, rdb, record)
				nodeAt(t, cluster, slot.Nodes[0].Addr).Kill()
				killed = time.Now()
			}
		}
		const keys, fresh, rounds = 4, 2, 140
		executed, failures, took := load(t, store, scopes, keys, fresh, rounds, 50*time.Millisecond, events)
		for key, err := range failures {
			t.Errorf("%s: %v", key, err)
		}
		// The first claims of every round's new keys met both failovers.
		require.EqualValues(t, len(scopes)*(keys+fresh*rounds), executed.Load(),
			"each key's operation ran exactly once through both failovers, the keys first claimed during them included")
		cluster.WaitOK(t, 10*time.Second)

		lastErr := obs.last(&obs.lastErr)
		before, after := median(took[:20]), median(took[len(took)-20:])
		t.Logf("CLUSTER FAILOVER at +0s, kill -9 of a master at +%s; the last Redis error %s after the kill; %d hits, %d errors, %d fallbacks to PostgreSQL, the breaker opened %d times; a round of %d requests took %s (median) before, at most %s during, %s in the last second",
			killed.Sub(failedOver).Round(time.Millisecond), lastErr.Sub(killed).Round(time.Millisecond), obs.hits.Load(), obs.errs.Load(), obs.fallbacks.Load(), obs.trips.Load(),
			len(scopes)*(keys+2*fresh), before.Round(time.Microsecond), slices.Max(took).Round(time.Microsecond), after.Round(time.Microsecond))
		require.Less(t, after, 3*before+20*time.Millisecond, "latency back to normal")
		require.Positive(t, obs.trips.Load(), "the breaker left the cluster alone while a master was down")
		require.Less(t, lastErr.Sub(killed), 10*time.Second, "Redis errors stop within seconds of the kill")
		require.True(t, obs.last(&obs.lastHit).After(lastErr), "the fast path serves hits again after the last error")
		require.Zero(t, hook.n.Load(), "commands refused for crossing slots")
	})
}

// load claims keys keys of every scope, rounds times, and in every round
// fresh new keys of every scope besides, each twice at once (a first claim
// and its duplicate), so that first claims meet whatever the round meets:
// within a round every claim concurrently, each round at least pace long.
// The first claim of a key runs and commits; every later one must replay
// it. events, if set, is called before each round. It returns how many
// operations ran, what failed by key, and how long each round's requests
// took.
func load(t testing.TB, store idempotency.Store[pgx.Tx], scopes []string, keys, fresh, rounds int, pace time.Duration, events func(round int)) (*atomic.Int64, map[string]error, []time.Duration) {
	ctx := context.Background()
	var executed atomic.Int64
	var mu sync.Mutex
	failures := map[string]error{}
	var took []time.Duration
	fail := func(key string, err error) {
		mu.Lock()
		defer mu.Unlock()
		failures[key] = err
	}
	for round := range rounds {
		if events != nil {
			events(round)
		}
		start := time.Now()
		var wg sync.WaitGroup
		names := make([]string, 0, keys+2*fresh)
		for k := range keys {
			names = append(names, fmt.Sprintf("k-%d", k))
		}
		for k := range fresh {
			name := fmt.Sprintf("new-%d-%d", round, k)
			names = append(names, name, name) // a first claim and its duplicate, at once
		}
		for _, scope := range scopes {
			for _, key := range names {
				wg.Add(1)
				go func() {
					defer wg.Done()
					req := claimReq(scope, key)
					req.Wait = 5 * time.Second
					lease, rec, err := store.Claim(ctx, req)
					switch {
					case err != nil:
						fail(scope+"/"+key, err)
					case lease != nil:
						executed.Add(1)
						if err := lease.Commit(ctx, resp201(`{"key":"`+scope+key+`"}`)); err != nil {
							fail(scope+"/"+key, err)
						}
					case !strings.Contains(string(rec.Response.Body), scope+key):
						fail(scope+"/"+key, fmt.Errorf("replayed %s", rec.Response.Body))
					}
				}()
			}
		}
		waitFor(t, &wg, time.Minute, "a round of claims")
		took = append(took, time.Since(start))
		time.Sleep(time.Until(start.Add(pace))) // pacing: a round starts every pace, a steady load
	}
	return &executed, failures, took
}

// median is the median of ds.
func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// slotOf is the slot range that holds key, as the cluster says now: its
// master first, then its replicas.
func slotOf(t *testing.T, rdb redis.UniversalClient, key string) redis.ClusterSlot {
	t.Helper()
	ctx := context.Background()
	slot, err := rdb.ClusterKeySlot(ctx, key).Result()
	require.NoError(t, err)
	var got redis.ClusterSlot
	require.Eventually(t, func() bool {
		slots, err := rdb.ClusterSlots(ctx).Result()
		if err != nil {
			return false
		}
		for _, s := range slots {
			if int64(s.Start) <= slot && slot <= int64(s.End) && len(s.Nodes) >= 2 {
				got = s
				return true
			}
		}
		return false
	}, 10*time.Second, 50*time.Millisecond, "slot %d with a master and a replica", slot)
	return got
}

// nodeAt is the node of cluster listening at addr.
func nodeAt(t *testing.T, cluster *redistest.Cluster, addr string) *redistest.Node {
	t.Helper()
	i := slices.IndexFunc(cluster.Nodes, func(n *redistest.Node) bool { return n.Addr == addr })
	require.GreaterOrEqual(t, i, 0, "no node at %s", addr)
	return cluster.Nodes[i]
}

// timedObserver counts what the fast path reports, and when it last saw a
// hit and an error.
type timedObserver struct {
	hits, errs, fallbacks, trips atomic.Int64
	mu                           sync.Mutex
	lastHit, lastErr             time.Time
}

func (o *timedObserver) Redis(result string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch result {
	case "hit":
		o.hits.Add(1)
		o.lastHit = time.Now()
	case "error":
		o.errs.Add(1)
		o.lastErr = time.Now()
	}
}

func (o *timedObserver) Fallback() { o.fallbacks.Add(1) }

func (o *timedObserver) Breaker(open bool) {
	if open {
		o.trips.Add(1)
	}
}

func (o *timedObserver) last(at *time.Time) time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	return *at
}
