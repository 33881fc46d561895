package recordcache_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/internal/testharness"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/idempotency/recordcache"
	"github.com/oncekey/oncekey/idempotency/storetest"
)

// TestConformance: with the cache in front, memstore keeps every promise of
// the store contract. The integration module runs the same on pgstore.
func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, testharness.Wrapped(testharness.Memstore(), func(t *testing.T, next idempotency.Store[*memstore.Tx]) idempotency.Store[*memstore.Tx] {
		cache, err := recordcache.New(1000, nil)
		require.NoError(t, err)
		return recordcache.Wrap(cache, next)
	}))
}

// TestWrappersKeepTheStoresCapabilities: a store in front of another
// settles, releases, writes and reads pieces, purges and counts through
// it (a record the cache answers with keeps the count of its pieces and
// the CreatedAt they are read under), so that no caller has to reach
// behind the wrapper (storetest alone would skip the cases of a wrapper
// that reported them unsupported, and pass).
func TestWrappersKeepTheStoresCapabilities(t *testing.T) {
	t.Parallel()
	wrappers := []struct {
		name string
		wrap func(t *testing.T, next idempotency.Store[*memstore.Tx]) idempotency.Store[*memstore.Tx]
	}{
		{"recordcache.Wrap", func(t *testing.T, next idempotency.Store[*memstore.Tx]) idempotency.Store[*memstore.Tx] {
			cache, err := recordcache.New(10, nil)
			require.NoError(t, err, "new cache")
			return recordcache.Wrap(cache, next)
		}},
		{"idempotency.MapUnit", func(_ *testing.T, next idempotency.Store[*memstore.Tx]) idempotency.Store[*memstore.Tx] {
			return idempotency.MapUnit(next, func(tx *memstore.Tx, _ idempotency.Ref) *memstore.Tx { return tx })
		}},
	}
	for _, tc := range wrappers {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			store := tc.wrap(t, memstore.New())
			req := idempotency.ClaimRequest{Scope: "s", Key: "k", TTL: time.Hour, Wait: time.Second}
			lease, _, err := store.Claim(ctx, req)
			require.NoError(t, err, "claim")
			held := idempotency.Held{State: idempotency.HeldRunning, Until: time.Now().Add(time.Minute)}
			require.NoError(t, lease.Commit(ctx, held.Response()), "hold the key")

			written, err := store.WritePiece(ctx, lease.Ref(), 0, []byte("done"))
			require.NoError(t, err, "write a piece through the wrapper")
			require.True(t, written, "the held record's piece is written through the wrapper")
			settled, err := store.Settle(ctx, lease.Ref(), idempotency.Response{Status: http.StatusCreated, Header: http.Header{}, Pieces: 1, Size: 4})
			require.NoError(t, err, "settle through the wrapper")
			require.True(t, settled, "the held record is settled through the wrapper")
			for _, replay := range []string{"first replay", "second replay"} {
				_, rec, err := store.Claim(ctx, req)
				require.NoError(t, err, "%s: claim", replay)
				require.NotNil(t, rec, "%s: the settled record", replay)
				require.Equal(t, 1, rec.Response.Pieces, "%s: its body is in a piece", replay)
				p, err := store.ReadPiece(ctx, idempotency.Ref{Scope: req.Scope, Key: req.Key, ClaimedAt: rec.CreatedAt}, 0)
				require.NoError(t, err, "%s: read the piece through the wrapper", replay)
				require.Equal(t, "done", string(p), "%s: the piece, from the store behind", replay)
			}
			released, err := store.Release(ctx, idempotency.Ref{Scope: "s", Key: "other", ClaimedAt: time.Now()})
			require.NoError(t, err, "release through the wrapper")
			require.False(t, released, "no such claim")
			_, err = store.PurgeExpired(ctx, 10)
			require.NoError(t, err, "purge through the wrapper")
			stats, err := store.KeyStats(ctx)
			require.NoError(t, err, "count through the wrapper")
			require.Equal(t, int64(1), stats.Completed, "the settled key, counted by the store behind")
		})
	}
}
