package redisstore_test

import (
	"context"
	"crypto/rand"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency/internal/testharness"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/idempotency/redisstore"
	"github.com/oncekey/oncekey/idempotency/redisstore/redistest"
	"github.com/oncekey/oncekey/idempotency/storetest"
)

// leastPrivilege is the ACL that docs/security.md gives the fast path's
// Redis user, with PREFIX standing for its key prefix: its own keys, and
// only the commands the store and go-redis send.
const leastPrivilege = "on resetkeys resetchannels ~PREFIX* -@all +get +set +del +exists +eval +evalsha +ping +hello +cluster|slots +cluster|shards +readonly"

// TestLeastPrivilegeACL: the fast path keeps the store contract as a Redis
// user that has no more than leastPrivilege, on one node and on a cluster,
// without one command refused (a refusal would be a silent fallback to the
// durable store, so the Observer's errors are counted).
func TestLeastPrivilegeACL(t *testing.T) {
	t.Parallel()
	shared := redistest.SharedURL()
	for _, tc := range []struct {
		name string
		url  func(t *testing.T) (url string, nodes []redis.UniversalClient)
	}{
		{"one node", func(t *testing.T) (string, []redis.UniversalClient) {
			return shared, []redis.UniversalClient{redistest.Shared(t)}
		}},
		{"cluster", func(t *testing.T) (string, []redis.UniversalClient) {
			cluster := redistest.StartCluster(t, 3)
			var nodes []redis.UniversalClient
			for _, n := range cluster.Nodes {
				rdb := redis.NewClient(&redis.Options{Addr: n.Addr})
				t.Cleanup(func() { rdb.Close() })
				nodes = append(nodes, rdb)
			}
			return cluster.URL, nodes
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			url, nodes := tc.url(t)
			user, password := "oncekey-acl-"+rand.Text()[:8], rand.Text()
			prefix := user + ":"
			rules := strings.Fields(strings.ReplaceAll(leastPrivilege, "PREFIX", prefix))
			for _, node := range nodes {
				args := append([]any{"ACL", "SETUSER", user, ">" + password}, toAny(rules)...)
				require.NoError(t, node.Do(ctx, args...).Err(), "create the user")
				t.Cleanup(func() { node.Do(context.Background(), "ACL", "DELUSER", user) })
			}

			scheme, rest, _ := strings.Cut(url, "://")
			rdb, err := redisstore.NewClient(scheme + "://" + user + ":" + password + "@" + rest)
			require.NoError(t, err, "the user's client")
			t.Cleanup(func() { rdb.Close() })
			require.NoError(t, rdb.Ping(ctx).Err(), "the user's ping")
			require.Error(t, rdb.Set(ctx, "elsewhere:"+user, "x", 0).Err(), "a key outside the prefix is refused")

			obs := &observed{}
			fast := redisstore.New(rdb, redisstore.Config{Prefix: prefix, Observer: obs, AlwaysLookUp: true})
			t.Run("store contract", func(t *testing.T) { // returns when its parallel cases have
				storetest.Run(t, testharness.Wrapped(testharness.Memstore(), infront[*memstore.Tx](fast)))
			})
			require.Zero(t, obs.errs.Load(), "Redis commands that failed (refused by the ACL?)")
			require.Zero(t, obs.trips.Load(), "breaker trips")
			require.Positive(t, obs.hit.Load(), "replays served by Redis")
		})
	}
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
