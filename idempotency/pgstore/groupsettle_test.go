package pgstore_test

import (
	"crypto/rand"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/pgstore/pgstoretest"
)

// TestGroupSettle: settles and releases that arrive while others are on
// their way go to PostgreSQL as one pipeline, each with its own answer
// (settled, released, or false for a record that is not there), and a
// merged pipeline that fails (a trigger refuses one member's row) sends
// every member again alone: the others settle, the failing one fails.
// The key table is one of its own, for the trigger.
func TestGroupSettle(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgstoretest.Pool(t)
	opts := pgstore.Options{Table: "settle_group_keys"}
	require.NoError(t, pgstore.Migrate(ctx, pool, opts))
	_, err := pool.Exec(ctx, `CREATE OR REPLACE FUNCTION settle_group_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.idempotency_key LIKE 'poison-%' AND OLD.status = 'completed' THEN RAISE EXCEPTION 'refused %', NEW.idempotency_key; END IF;
	RETURN NEW;
END $$;
CREATE OR REPLACE TRIGGER settle_group_refuse BEFORE UPDATE ON settle_group_keys FOR EACH ROW EXECUTE FUNCTION settle_group_refuse()`)
	require.NoError(t, err, "the trigger that refuses the settle of poison-* rows")
	store, err := pgstore.New(pool, opts)
	require.NoError(t, err)
	scope := "settle-" + rand.Text()

	var armed atomic.Bool
	sizes, release := make(chan int, 100), make(chan struct{})
	var calls atomic.Int32
	pgstore.WatchSettles(store, func(members int) {
		if !armed.Load() {
			return
		}
		sizes <- members
		if calls.Add(1) <= pgstore.MaxMergedCommits {
			<-release
		}
	})
	hold := func(key string) idempotency.Ref {
		return holdKey(t, store, idempotency.ClaimRequest{
			Scope: scope, Key: key, Fingerprint: [32]byte{1}, Method: http.MethodPost, Route: "/orders", TTL: time.Hour, Wait: 5 * time.Second,
		})
	}
	created := func(key string) idempotency.Response {
		return idempotency.Response{Status: http.StatusCreated, Header: http.Header{"Location": {"/orders/" + key}}, Body: []byte(key)}
	}

	// run holds the first pipelines back with a settle each, queues
	// members behind them, releases them all, and returns each member's
	// answer and the sizes of the pipelines sent after the held ones.
	type outcome struct {
		ok  bool
		err error
	}
	run := func(t *testing.T, members map[string]func() (bool, error)) (map[string]outcome, []int) {
		t.Helper()
		armed.Store(true)
		var wg sync.WaitGroup
		for i := range pgstore.MaxMergedCommits {
			ref := hold("holder-" + rand.Text())
			wg.Add(1)
			go func() {
				defer wg.Done()
				ok, err := store.Settle(ctx, ref, created(ref.Key))
				require.NoError(t, err, "holder %d", i)
				require.True(t, ok, "holder %d", i)
			}()
			select {
			case n := <-sizes:
				require.Equal(t, 1, n, "members of held pipeline %d", i)
			case <-time.After(10 * time.Second):
				require.FailNow(t, "no settle pipeline sent", "held pipeline %d", i)
			}
		}
		var mu sync.Mutex
		out := map[string]outcome{}
		for name, f := range members {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ok, err := f()
				mu.Lock()
				out[name] = outcome{ok, err}
				mu.Unlock()
			}()
		}
		require.Eventually(t, func() bool { return pgstore.QueuedSettles(store) == len(members) },
			10*time.Second, time.Millisecond, "members queued behind the held pipelines")
		close(release)
		wg.Wait()
		armed.Store(false)
		var sent []int
		for len(sizes) > 0 {
			sent = append(sent, <-sizes)
		}
		return out, sent
	}
	replayed := func(key string) *idempotency.Record {
		lease, rec, err := store.Claim(ctx, idempotency.ClaimRequest{Scope: scope, Key: key, Fingerprint: [32]byte{1}, TTL: time.Hour, Wait: time.Second, AtOnce: true})
		require.NoError(t, err)
		if lease != nil {
			require.NoError(t, lease.Rollback(ctx))
		}
		return rec
	}

	t.Run("merged", func(t *testing.T) {
		members := map[string]func() (bool, error){}
		var settled, released []string
		for range 6 {
			ref := hold("settled-" + rand.Text())
			settled = append(settled, ref.Key)
			members[ref.Key] = func() (bool, error) { return store.Settle(ctx, ref, created(ref.Key)) }
		}
		for range 2 {
			ref := hold("released-" + rand.Text())
			released = append(released, ref.Key)
			members[ref.Key] = func() (bool, error) { return store.Release(ctx, ref) }
		}
		gone := idempotency.Ref{Scope: scope, Key: "gone-" + rand.Text(), ClaimedAt: time.Now()}
		members[gone.Key] = func() (bool, error) { return store.Settle(ctx, gone, created(gone.Key)) }

		out, sent := run(t, members)
		require.Equal(t, []int{len(members)}, sent, "one pipeline for every member queued")
		for _, key := range settled {
			require.Equal(t, outcome{ok: true}, out[key], "settle of %s", key)
			rec := replayed(key)
			require.NotNil(t, rec, "%s settled", key)
			require.Equal(t, http.StatusCreated, rec.Response.Status)
			require.Equal(t, key, string(rec.Response.Body), "each member's own response")
		}
		for _, key := range released {
			require.Equal(t, outcome{ok: true}, out[key], "release of %s", key)
			require.Nil(t, replayed(key), "%s released: the key is free", key)
		}
		require.Equal(t, outcome{}, out[gone.Key], "a record that is not there: false, no error")
	})

	t.Run("a member's failure sends each alone", func(t *testing.T) {
		release = make(chan struct{})
		calls.Store(0)
		members := map[string]func() (bool, error){}
		var good []string
		for range 3 {
			ref := hold("good-" + rand.Text())
			good = append(good, ref.Key)
			members[ref.Key] = func() (bool, error) { return store.Settle(ctx, ref, created(ref.Key)) }
		}
		poison := hold("poison-" + rand.Text())
		members[poison.Key] = func() (bool, error) { return store.Settle(ctx, poison, created(poison.Key)) }

		out, sent := run(t, members)
		require.Equal(t, []int{len(members)}, sent, "one merged pipeline, then each alone")
		for _, key := range good {
			require.Equal(t, outcome{ok: true}, out[key], "%s settles alone", key)
			require.Equal(t, key, string(replayed(key).Response.Body))
		}
		require.ErrorContains(t, out[poison.Key].err, "refused "+poison.Key, "the failing member gets its own failure")
		held, ok := idempotency.ParseHeld(replayed(poison.Key).Response, time.Time{})
		require.True(t, ok && held.State == idempotency.HeldRunning, "the poisoned record is still held")
	})
}
