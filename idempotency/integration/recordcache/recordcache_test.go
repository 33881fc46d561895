package recordcache_test

import (
	"context"
	"crypto/rand"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/internal/testharness"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/pgstore/pgstoretest"
	"github.com/oncekey/oncekey/idempotency/recordcache"
	"github.com/oncekey/oncekey/idempotency/storetest"
)

func TestMain(m *testing.M) {
	pgstoretest.Main(m, pgstoretest.Options{})
}

// cached puts a fresh cache in front of a store.
func cached[U any](t *testing.T, next idempotency.Store[U]) idempotency.Store[U] {
	cache, err := recordcache.New(1000, nil)
	require.NoError(t, err)
	return recordcache.Wrap(cache, next)
}

// TestConformance: with the cache in front, pgstore keeps every promise of
// the store contract (recordcache's own tests run it on memstore).
func TestConformance(t *testing.T) {
	t.Parallel()
	t.Run("pgstore", func(t *testing.T) {
		t.Parallel()
		storetest.Run(t, testharness.Wrapped(pgstoretest.TxHarness(pgstoretest.Pool(t), pgstore.Options{}), cached))
	})
	t.Run("pgstore deferred", func(t *testing.T) {
		t.Parallel()
		storetest.Run(t, testharness.Wrapped(pgstoretest.DeferredHarness(pgstoretest.Pool(t), pgstore.Options{}), cached))
	})
}

// counting counts the claims that reach the store behind the cache.
type counting[U any] struct {
	idempotency.Store[U]
	claims atomic.Int64
}

func (c *counting[U]) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Lease[U], *idempotency.Record, error) {
	c.claims.Add(1)
	return c.Store.Claim(ctx, req)
}

// pgStore is pgstore on the test database.
func pgStore(t *testing.T) *pgstore.Store {
	t.Helper()
	s, err := pgstore.New(pgstoretest.Pool(t), pgstore.Options{})
	require.NoError(t, err)
	return s
}

type results struct{ hit, miss atomic.Int64 }

func (r *results) RecordCache(result string) {
	if result == "hit" {
		r.hit.Add(1)
	} else {
		r.miss.Add(1)
	}
}

func TestKeepsWhatIsFinal(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		deferred bool
		status   int
		body     []byte
		ttl      time.Duration
		kept     bool
	}{
		{name: "committed", status: http.StatusCreated, body: []byte(`{"id":"x"}`), ttl: time.Hour, kept: true},
		{name: "committed deferred", deferred: true, status: http.StatusCreated, body: []byte(`{"id":"x"}`), ttl: time.Hour, kept: true},
		{name: "provisional 202 is not final", status: http.StatusAccepted, body: []byte(`{}`), ttl: time.Hour},
		{name: "body over MaxBody", status: http.StatusCreated, body: make([]byte, recordcache.MaxBody+1), ttl: time.Hour},
		{name: "expired", status: http.StatusCreated, body: []byte(`{}`), ttl: time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pg := pgStore(t)
			var store idempotency.Store[pgx.Tx] = pg
			if tt.deferred {
				deferred, err := pg.ClaimAtCommit()
				require.NoError(t, err)
				store = idempotency.MapUnit(deferred, func(*pgstore.Batch, idempotency.Ref) pgx.Tx { return nil })
			}
			inner := &counting[pgx.Tx]{Store: store}
			var seen results
			cache, err := recordcache.New(100, &seen)
			require.NoError(t, err)
			front := recordcache.Wrap(cache, idempotency.Store[pgx.Tx](inner))
			req := idempotency.ClaimRequest{Scope: rand.Text(), Key: "k", Fingerprint: idempotency.Fingerprint{1},
				Method: "POST", Route: "/orders", TTL: tt.ttl, Wait: time.Second}

			lease, rec, err := front.Claim(ctx, req)
			require.NoError(t, err)
			require.Nil(t, rec)
			require.NoError(t, lease.Commit(ctx, idempotency.Response{Status: tt.status, Header: http.Header{}, Body: tt.body}))
			if tt.ttl < time.Second {
				// Past the short TTL, as PostgreSQL sees it, asked of pg
				// itself so that neither the cache nor the counts see it: a
				// claim that gets a lease found the record expired, and its
				// rollback leaves it as it was.
				require.Eventually(t, func() bool {
					lease, _, err := pg.Claim(ctx, req)
					return err == nil && lease != nil && lease.Rollback(ctx) == nil
				}, 10*time.Second, 5*time.Millisecond, "the record did not expire")
			}

			req.AtOnce = true
			lease, rec, err = front.Claim(ctx, req)
			require.NoError(t, err)
			if lease != nil {
				require.NoError(t, lease.Rollback(ctx))
			}
			if tt.kept {
				require.NotNil(t, rec, "the replay")
				require.Equal(t, tt.body, rec.Response.Body)
				require.Equal(t, int64(1), inner.claims.Load(), "a kept record is replayed without asking the store")
				require.Equal(t, int64(1), seen.hit.Load(), "hits")
			} else {
				require.Equal(t, int64(2), inner.claims.Load(), "a record not kept is asked of the store")
				require.Zero(t, seen.hit.Load(), "hits")
			}
		})
	}
}

// A record the store returns (a replay on a replica that did not run the
// operation) is kept too: the next replay here is free.
func TestReadThrough(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pg := pgStore(t)
	req := idempotency.ClaimRequest{Scope: rand.Text(), Key: "k", Fingerprint: idempotency.Fingerprint{2},
		Method: "POST", Route: "/orders", TTL: time.Hour, Wait: time.Second}
	lease, _, err := pg.Claim(ctx, req)
	require.NoError(t, err)
	require.NoError(t, lease.Commit(ctx, idempotency.Response{Status: 201, Header: http.Header{}, Body: []byte("x")}))

	inner := &counting[pgx.Tx]{Store: pg}
	cache, err := recordcache.New(100, nil)
	require.NoError(t, err)
	front := recordcache.Wrap(cache, idempotency.Store[pgx.Tx](inner))
	for i := range 3 {
		_, rec, err := front.Claim(ctx, req)
		require.NoError(t, err, "claim %d", i)
		require.NotNil(t, rec, "claim %d", i)
	}
	require.Equal(t, int64(1), inner.claims.Load(), "claims that reached the store")
}
