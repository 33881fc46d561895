package redisstore_test

import (
	"crypto/rand"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/internal/clock"
	"github.com/oncekey/oncekey/idempotency/internal/testharness"
	"github.com/oncekey/oncekey/idempotency/redisstore"
	"github.com/oncekey/oncekey/idempotency/redisstore/redistest"
)

// TestLeasesAreOnTheDatabasesClockBehindRedis: Redis holds no lease (a
// held record is never cached, and the in-flight marker's expiry is
// Redis's own), so with the fast path in front of PostgreSQL the lease is
// still the database's: two processes a minute apart, a duplicate of a
// request still running finds it running, and the operation runs once,
// with RetryUnknown too. pgstore's TestLeasesAreOnTheDatabasesClock is
// the same without Redis.
func TestLeasesAreOnTheDatabasesClockBehindRedis(t *testing.T) {
	t.Parallel()
	const lease, skew = 10 * time.Second, time.Minute
	for _, tc := range []struct {
		name                   string
		holderSkew, duplicates time.Duration
		retry                  bool
	}{
		{"the duplicate's clock a minute ahead", 0, skew, false},
		{"the holder's clock a minute behind, retry unknown", -skew, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var runs atomic.Int64
			release := make(chan struct{})
			handler := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				if runs.Add(1) == 1 {
					<-release
				}
				w.WriteHeader(http.StatusCreated)
			})
			prefix := "clock:" + rand.Text() + ":"
			process := func(skew time.Duration) http.Handler {
				e := idempotency.New(idempotency.Config{
					Scope: func(*http.Request) (string, error) { return "clock", nil },
					Wait:  100 * time.Millisecond,
				})
				clock.Set(e, func() time.Time { return time.Now().Add(skew) })
				fast := redisstore.New(redistest.Shared(t), redisstore.Config{Prefix: prefix, ShedDuplicates: true})
				store := redisstore.Wrap(fast, idempotency.Store[pgx.Tx](pgStore(t)))
				return idempotency.NewOperation(e, store, idempotency.OperationConfig{Held: &idempotency.HeldConfig{Lease: lease, RetryUnknown: tc.retry}}).Handler(handler)
			}
			holder, other := process(tc.holderSkew), process(tc.duplicates)
			key := rand.Text()
			post := func(h http.Handler) *httptest.ResponseRecorder { return testharness.Post(h, key, `{"amount":5}`) }
			first := make(chan int)
			go func() { first <- post(holder).Code }()
			require.Eventually(t, func() bool { return runs.Load() == 1 }, 10*time.Second, time.Millisecond)
			dup := post(other)
			require.Equal(t, http.StatusAccepted, dup.Code, "the duplicate finds the operation running: %s", dup.Body)
			close(release)
			require.Equal(t, http.StatusCreated, <-first)
			replay := post(other)
			require.Equal(t, http.StatusCreated, replay.Code, "%s", replay.Body)
			require.EqualValues(t, 1, runs.Load(), "the operation ran once")
		})
	}
}
