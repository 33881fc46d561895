package recordcache_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/idempotency"
	"github.com/oncekey/oncekey/internal/store/postgres"
	"github.com/oncekey/oncekey/internal/store/recordcache"
	"github.com/oncekey/oncekey/internal/store/storetest"
	"github.com/oncekey/oncekey/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// TestConformance: with the cache in front, both stores keep every promise
// of the store contract.
func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.RunInFront(t, func(t *testing.T, inner storetest.Store) idempotency.Store {
		cache, err := recordcache.New(inner, 1000, nil)
		require.NoError(t, err)
		return cache
	})
}

// counting counts the claims that reach the store behind the cache.
type counting struct {
	idempotency.Store
	claims atomic.Int64
}

func (c *counting) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Lease, *idempotency.Record, error) {
	c.claims.Add(1)
	return c.Store.Claim(ctx, req)
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
			inner := &counting{Store: postgres.New(testdb.Pool(t))}
			var seen results
			cache, err := recordcache.New(inner, 100, &seen)
			require.NoError(t, err)
			req := idempotency.ClaimRequest{Account: uuid.New(), Key: "k", Fingerprint: idempotency.Fingerprint{1},
				Method: "POST", Route: "/orders", TTL: tt.ttl, Wait: time.Second, Deferred: tt.deferred}

			lease, rec, err := cache.Claim(ctx, req)
			require.NoError(t, err)
			require.Nil(t, rec)
			require.NoError(t, lease.Commit(ctx, idempotency.Response{Status: tt.status, Header: http.Header{}, Body: tt.body}))
			time.Sleep(5 * time.Millisecond) // past the short TTL

			req.Deferred = false
			lease, rec, err = cache.Claim(ctx, req)
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
	pg := postgres.New(testdb.Pool(t))
	req := idempotency.ClaimRequest{Account: uuid.New(), Key: "k", Fingerprint: idempotency.Fingerprint{2},
		Method: "POST", Route: "/orders", TTL: time.Hour, Wait: time.Second}
	lease, _, err := pg.Claim(ctx, req)
	require.NoError(t, err)
	require.NoError(t, lease.Commit(ctx, idempotency.Response{Status: 201, Header: http.Header{}, Body: []byte("x")}))

	inner := &counting{Store: pg}
	cache, err := recordcache.New(inner, 100, nil)
	require.NoError(t, err)
	for i := range 3 {
		_, rec, err := cache.Claim(ctx, req)
		require.NoError(t, err, "claim %d", i)
		require.NotNil(t, rec, "claim %d", i)
	}
	require.Equal(t, int64(1), inner.claims.Load(), "claims that reached the store")
}
