package redisstore_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/internal/testharness"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/idempotency/redisstore"
	"github.com/oncekey/oncekey/idempotency/redisstore/redistest"
	"github.com/oncekey/oncekey/idempotency/storetest"
)

// TestConformance: with the fast path on the machine's Redis in front,
// memstore keeps every promise of the store contract, whether claims are
// looked up as replays come and go or always. The integration module runs
// the same on pgstore, on a Redis Cluster and through faults.
func TestConformance(t *testing.T) {
	t.Parallel()
	for _, always := range []bool{false, true} {
		t.Run(fmt.Sprintf("always look up %t", always), func(t *testing.T) {
			t.Parallel()
			fast := redisstore.New(redistest.Shared(t), redisstore.Config{Prefix: "conformance-" + t.Name() + ":", AlwaysLookUp: always})
			storetest.Run(t, testharness.Wrapped(testharness.Memstore(), func(_ *testing.T, next idempotency.Store[*memstore.Tx]) idempotency.Store[*memstore.Tx] {
				return redisstore.Wrap(fast, next)
			}))
		})
	}
}

// results records the fast path's look-ups, for a test that must know
// where a replay came from.
type results struct {
	mu   sync.Mutex
	seen []string
}

func (r *results) Redis(result string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, result)
}

func (r *results) last() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.seen) == 0 {
		return ""
	}
	return r.seen[len(r.seen)-1]
}

func (*results) Fallback()    {}
func (*results) Breaker(bool) {}

// TestReplayFromRedisReadsPiecesFromTheDurableStore: a held record's
// pieces are written through the fast path to the durable store, and a
// replay of the settled record answered by Redis carries their count and
// size, and the CreatedAt under which they are read back through the fast
// path from the durable store. (storetest would skip its case of pieces
// for a fast path that reported them unsupported, and pass.)
func TestReplayFromRedisReadsPiecesFromTheDurableStore(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	seen := &results{}
	rdb := redistest.Shared(t)
	fast := redisstore.New(rdb, redisstore.Config{Prefix: "pieces-" + rand.Text() + ":", AlwaysLookUp: true, Observer: seen})
	store := redisstore.Wrap(fast, idempotency.Store[*memstore.Tx](memstore.New()))

	req := idempotency.ClaimRequest{Scope: "s", Key: "k", TTL: time.Minute, Wait: time.Second}
	recKey, _ := fast.KeyNames(req.Scope, req.Key)
	t.Cleanup(func() { _ = rdb.Del(context.Background(), recKey).Err() })
	lease, _, err := store.Claim(ctx, req)
	require.NoError(t, err, "claim")
	require.NotNil(t, lease, "the key is free")
	ref := lease.Ref()
	require.NoError(t, lease.Commit(ctx, idempotency.Held{State: idempotency.HeldRunning, Until: time.Now().Add(time.Minute)}.Response()), "hold the key")
	pieces := []string{"a large ", "answer"}
	for n, p := range pieces {
		written, err := store.WritePiece(ctx, ref, n, []byte(p))
		require.NoError(t, err, "write piece %d through the fast path", n)
		require.True(t, written, "piece %d is written to the durable store", n)
	}
	settled, err := store.Settle(ctx, ref, idempotency.Response{Status: http.StatusOK, Header: http.Header{}, Pieces: 2, Size: 14})
	require.NoError(t, err, "settle")
	require.True(t, settled, "settled")

	_, rec, err := store.Claim(ctx, req)
	require.NoError(t, err, "first replay")
	require.NotNil(t, rec, "first replay: a record")
	require.Equal(t, "miss", seen.last(), "the first replay is read through from the durable store")
	_, rec, err = store.Claim(ctx, req)
	require.NoError(t, err, "second replay")
	require.NotNil(t, rec, "second replay: a record")
	require.Equal(t, "hit", seen.last(), "the second replay is answered by Redis")
	require.Equal(t, 2, rec.Response.Pieces, "the cached record's pieces")
	require.Equal(t, int64(14), rec.Response.Size, "the cached record's size")
	replay := idempotency.Ref{Scope: req.Scope, Key: req.Key, ClaimedAt: rec.CreatedAt}
	for n, want := range pieces {
		p, err := store.ReadPiece(ctx, replay, n)
		require.NoError(t, err, "read piece %d through the fast path", n)
		require.Equal(t, want, string(p), "piece %d, from the durable store", n)
	}
}
