package pgstore_test

import (
	"crypto/rand"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/internal/clock"
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
							return idempotency.NewHeldOperation(e, idempotency.HeldStore[pgx.Tx](s), idempotency.OperationConfig{}, held).Handler(handler), s
						}
						d, err := s.Deferred()
						require.NoError(t, err)
						return idempotency.NewHeldOperation(e, d.(idempotency.HeldStore[*pgstore.Batch]), idempotency.OperationConfig{}, held).Handler(handler), s
					}
					holder, _ := process(tc.holderSkew)
					other, store := process(tc.duplicates)
					key := rand.Text()
					post := func(h http.Handler) *httptest.ResponseRecorder {
						req := httptest.NewRequest(http.MethodPost, "/transfers", strings.NewReader(`{"amount":5}`))
						req.Header.Set(idempotency.HeaderKey, key)
						rec := httptest.NewRecorder()
						h.ServeHTTP(rec, req)
						return rec
					}
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
