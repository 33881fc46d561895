package pgstore_test

import (
	"crypto/rand"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/internal/clock"
	"github.com/oncekey/oncekey/idempotency/internal/testharness"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/pgstore/keyadmin"
	"github.com/oncekey/oncekey/idempotency/pgstore/pgstoretest"
)

// TestLeasesAreOnTheDatabasesClock: two processes (an engine and a store
// each) share one key table, and one's clock is a minute off. A
// duplicate of a request still running on the other finds it running,
// never of unknown outcome: the hold's lease ends by the database's clock,
// set and read in SQL. With RetryUnknown (--on-unknown=retry) the
// operation runs once. The operator's view (keyadmin) agrees. A lease is
// shorter than the skew, as a gateway's is with a short upstream timeout.
func TestLeasesAreOnTheDatabasesClock(t *testing.T) {
	t.Parallel()
	pool := pgstoretest.Pool(t)
	const lease, skew = 10 * time.Second, time.Minute
	for _, tc := range []struct {
		name                   string
		holderSkew, duplicates time.Duration
	}{
		{"the duplicate's clock a minute ahead", 0, skew},
		{"the holder's clock a minute behind", -skew, 0},
	} {
		for _, retry := range []bool{false, true} {
			for _, kind := range []string{"deferred", "transactional"} {
				name := tc.name + ", " + kind
				if retry {
					name += ", retry unknown"
				}
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					var mu sync.Mutex
					runs := 0
					release := make(chan struct{})
					handler := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
						mu.Lock()
						runs++
						first := runs == 1
						mu.Unlock()
						if first {
							<-release // past the other process's idea of the lease, not the database's
						}
						w.WriteHeader(http.StatusCreated)
					})
					ran := func() int {
						mu.Lock()
						defer mu.Unlock()
						return runs
					}
					// process is an engine and a store of its own, whose
					// clock is skewed by skew.
					process := func(skew time.Duration) (http.Handler, *pgstore.Store) {
						e := idempotency.New(idempotency.Config{
							Scope: func(*http.Request) (string, error) { return "clock", nil },
							Wait:  100 * time.Millisecond,
						})
						clock.Set(e, func() time.Time { return time.Now().Add(skew) })
						s, err := pgstore.New(pool, pgstore.Options{})
						require.NoError(t, err)
						held := idempotency.HeldConfig{Lease: lease, RetryUnknown: retry}
						if kind == "transactional" {
							return idempotency.NewOperation(e, s, idempotency.OperationConfig{Held: &held}).Handler(handler), s
						}
						d, err := s.ClaimAtCommit()
						require.NoError(t, err)
						return idempotency.NewOperation(e, d, idempotency.OperationConfig{Held: &held}).Handler(handler), s
					}
					holder, _ := process(tc.holderSkew)
					other, store := process(tc.duplicates)
					key := rand.Text()
					post := func(h http.Handler) *httptest.ResponseRecorder { return testharness.Post(h, key, `{"amount":5}`) }
					first := make(chan int)
					go func() { first <- post(holder).Code }()
					require.Eventually(t, func() bool { return ran() == 1 }, 10*time.Second, time.Millisecond, "the first request runs")

					dup := post(other)
					require.Equal(t, http.StatusAccepted, dup.Code, "a duplicate on the other process finds the operation running, not of unknown outcome: %s", dup.Body)
					require.Equal(t, 1, ran(), "the duplicate did not run it again")
					info, err := keyadmin.Inspect(t.Context(), store, "clock", key)
					require.NoError(t, err)
					require.Equal(t, "held", info.Status, "the operator sees it running: %+v", info.Held)
					unknown, err := keyadmin.Unknown(t.Context(), store, keyadmin.UnknownFilter{ScopePrefix: "clock"})
					require.NoError(t, err)
					for _, k := range unknown {
						require.NotEqual(t, key, k.Key, "the key is not listed of unknown outcome")
					}

					close(release)
					require.Equal(t, http.StatusCreated, <-first, "the holder answers its client")
					replay := post(other)
					require.Equal(t, http.StatusCreated, replay.Code, "%s", replay.Body)
					require.Equal(t, "true", replay.Header().Get(idempotency.HeaderReplayed), "replayed on the other process")
					require.Equal(t, 1, ran(), "the operation ran once")
				})
			}
		}
	}
}

// TestEveryHoldIsOnTheDatabasesClock: a running hold stored by each of
// the store's paths (a lone deferred commit, a merged pipeline, the
// transactional claim) leaves with an Until that the database set, its
// time plus the lease, whatever the holder wrote (here a time long past),
// and expires at the database's time plus the TTL, though the process's
// clock is an hour behind (a key stored expired would run again). A
// record of status 102 without a lease is stored as it was sent.
func TestEveryHoldIsOnTheDatabasesClock(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgstoretest.Pool(t)
	store, err := pgstore.New(pool, pgstore.Options{})
	require.NoError(t, err)
	pgstore.SetClock(store, func() time.Time { return time.Now().Add(-time.Hour) })
	deferred, err := store.ClaimAtCommit()
	require.NoError(t, err)
	const lease = 10 * time.Second
	past := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	hold := idempotency.Held{State: idempotency.HeldRunning, Until: past, Lease: lease, Holder: "h:1"}.Response()
	request := func(key string) idempotency.ClaimRequest {
		return idempotency.ClaimRequest{Scope: "clock-paths", Key: key, Method: http.MethodPost, Route: "/x", TTL: time.Hour, Wait: time.Second}
	}
	// commit holds key through the deferred store, or the transactional
	// one.
	commit := func(key string, transactional bool) error {
		if transactional {
			lease, _, err := store.Claim(ctx, request(key))
			if err != nil {
				return err
			}
			return lease.Commit(ctx, hold)
		}
		lease, _, err := deferred.Claim(ctx, request(key))
		if err != nil {
			return err
		}
		return lease.Commit(ctx, hold)
	}

	var keys []string
	key := func() string { k := rand.Text(); keys = append(keys, k); return k }
	require.NoError(t, commit(key(), false), "a lone deferred commit")
	require.NoError(t, commit(key(), true), "a transactional claim")

	// The first MaxMergedCommits pipelines are held back until more
	// commits queue than go as lone statements: those are merged into one
	// pipeline (IdempotencyKeyInsertCompletedMany).
	var calls atomic.Int32
	release := make(chan struct{})
	var largest atomic.Int32
	pgstore.WatchCommits(store, func(members int) {
		if int32(members) > largest.Load() {
			largest.Store(int32(members))
		}
		if calls.Add(1) <= pgstore.MaxMergedCommits {
			<-release
		}
	})
	merged := pgstore.MaxMergedCommits + pgstore.MaxLoneMembers + 2
	errs := make(chan error, merged)
	for range merged {
		k := key()
		go func() { errs <- commit(k, false) }()
	}
	require.Eventually(t, func() bool { return pgstore.QueuedCommits(store) > pgstore.MaxLoneMembers }, 10*time.Second, time.Millisecond)
	close(release)
	for range merged {
		require.NoError(t, <-errs)
	}
	require.Greater(t, int(largest.Load()), pgstore.MaxLoneMembers, "a merged pipeline was sent")

	var dbNow time.Time
	require.NoError(t, pool.QueryRow(ctx, "SELECT now()").Scan(&dbNow))
	for _, k := range keys {
		info, err := keyadmin.Inspect(ctx, store, "clock-paths", k)
		require.NoError(t, err)
		require.NotNil(t, info.Held, k)
		require.Equal(t, "held", info.Status, "%s runs: %+v", k, info.Held)
		require.WithinDuration(t, dbNow.Add(lease), info.Held.Until, 5*time.Second, "%s: until is the database's time plus the lease", k)
		require.WithinDuration(t, dbNow.Add(time.Hour), info.ExpiresAt, 5*time.Second, "%s: expires at the database's time plus the TTL", k)
		require.Equal(t, "h:1", info.Held.Holder, "the rest of the record is kept")
	}

	// A record of status 102 without a lease (one written before leases
	// were kept) is stored as it was sent.
	old := idempotency.Held{State: idempotency.HeldRunning, Until: past}.Response()
	k := rand.Text()
	l, _, err := deferred.Claim(ctx, request(k))
	require.NoError(t, err)
	require.NoError(t, l.Commit(ctx, old))
	info, err := keyadmin.Inspect(ctx, store, "clock-paths", k)
	require.NoError(t, err)
	require.True(t, info.Held.Until.Equal(past), "until kept: %v", info.Held.Until)
	require.Equal(t, "unknown", info.Status, "past its until by the database's clock")
}
