package memstore_test

import (
	"cmp"
	"crypto/rand"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
)

// TestKeyStatsCountPieces: KeyStats.PiecesBytes is the length of every
// piece the store keeps, and falls as a settle with fewer pieces, a
// release or the purge of an expired record drops them: the memory that
// large answers hold, which the key count alone does not show.
func TestKeyStatsCountPieces(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// end ends the held record whose pieces are "0123456789" and
		// "abcde".
		end  func(t *testing.T, store *memstore.Store, ref idempotency.Ref)
		want int64         // PiecesBytes after end
		ttl  time.Duration // the key's TTL; an hour when 0
	}{
		{name: "held", end: func(*testing.T, *memstore.Store, idempotency.Ref) {}, want: 15},
		{name: "settled with its pieces", end: settle(2), want: 15},
		{name: "settled with fewer", end: settle(1), want: 10},
		{name: "settled in its record", end: settle(0)},
		{name: "released", end: func(t *testing.T, store *memstore.Store, ref idempotency.Ref) {
			released, err := store.Release(t.Context(), ref)
			require.NoError(t, err, "release")
			require.True(t, released, "the held record is released")
		}},
		{name: "purged once expired", ttl: time.Millisecond, end: func(t *testing.T, store *memstore.Store, ref idempotency.Ref) {
			settle(2)(t, store, ref)
			require.Eventually(t, func() bool {
				n, err := store.PurgeExpired(t.Context(), 10)
				return err == nil && n == 1
			}, 5*time.Second, time.Millisecond, "the record expires and is purged")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			store := memstore.New()
			ttl := cmp.Or(tc.ttl, time.Hour)
			lease, rec, err := store.Claim(t.Context(), idempotency.ClaimRequest{
				Scope: "stats", Key: rand.Text(), Method: http.MethodGet, Route: "/large", TTL: ttl, Wait: time.Second,
			})
			require.NoError(t, err, "claim")
			require.Nil(t, rec, "a new key")
			require.NoError(t, lease.Commit(t.Context(), idempotency.Held{State: idempotency.HeldRunning, Until: time.Now().Add(time.Minute)}.Response()), "hold")
			ref := lease.Ref()
			st, err := store.KeyStats(t.Context())
			require.NoError(t, err)
			require.Zero(t, st.PiecesBytes, "no piece written yet")
			for n, p := range []string{"0123456789", "abcde"} {
				ok, err := store.WritePiece(t.Context(), ref, n, []byte(p))
				require.NoError(t, err, "write piece %d", n)
				require.True(t, ok, "piece %d of a held record is kept", n)
			}
			st, err = store.KeyStats(t.Context())
			require.NoError(t, err)
			require.Equal(t, int64(15), st.PiecesBytes, "the pieces' lengths, once written")

			tc.end(t, store, ref)
			st, err = store.KeyStats(t.Context())
			require.NoError(t, err)
			require.Equal(t, tc.want, st.PiecesBytes, "the pieces kept after the record is %s", tc.name)
			require.Zero(t, st.TableBytes, "memory has no table")
		})
	}
}

// settle returns an end that settles the held record with a 200 whose
// body is its first n pieces (none: a body in the record).
func settle(n int) func(t *testing.T, store *memstore.Store, ref idempotency.Ref) {
	return func(t *testing.T, store *memstore.Store, ref idempotency.Ref) {
		t.Helper()
		resp := idempotency.Response{Status: http.StatusOK, Header: http.Header{}, Pieces: n, Size: int64([]int{0, 10, 15}[n])}
		if n == 0 {
			resp.Body = []byte("small")
		}
		settled, err := store.Settle(t.Context(), ref, resp)
		require.NoError(t, err, "settle")
		require.True(t, settled, "the held record is settled")
	}
}
