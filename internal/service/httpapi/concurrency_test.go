package httpapi_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/gen/apiclient"
	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/orders"
	"github.com/oncekey/oncekey/internal/service/servicetest"
	"github.com/oncekey/oncekey/internal/wire/problem"
)

// blockingRepo holds the first CreateOrder until released, before it writes
// anything (so the in-memory store's data lock is not taken while a test
// looks on); it then fails it if failFirst is set. Later calls pass through.
type blockingRepo struct {
	failFirst bool

	calls   atomic.Int32
	entered chan struct{} // closed when the first call is inside CreateOrder
	release chan struct{} // close to let the first call go on
	once    sync.Once
}

var errFirstFails = errors.New("injected failure of the first attempt")

func newBlockingRepo(failFirst bool) *blockingRepo {
	return &blockingRepo{failFirst: failFirst, entered: make(chan struct{}), release: make(chan struct{})}
}

func (r *blockingRepo) unblock() { r.once.Do(func() { close(r.release) }) }

// wrap makes the writes of one request go through r.
func (r *blockingRepo) wrap(inner orders.Writer) orders.Writer {
	return writerFunc(func(ctx context.Context, o orders.Order) error { return r.create(ctx, inner, o) })
}

func (r *blockingRepo) create(ctx context.Context, inner orders.Writer, o orders.Order) error {
	if r.calls.Add(1) == 1 {
		close(r.entered)
		select {
		case <-r.release:
		case <-ctx.Done():
			return ctx.Err()
		}
		if r.failFirst {
			return errFirstFails
		}
	}
	return inner.CreateOrder(ctx, o)
}

// writerFunc is an orders.Writer made of a function.
type writerFunc func(ctx context.Context, o orders.Order) error

func (f writerFunc) CreateOrder(ctx context.Context, o orders.Order) error { return f(ctx, o) }

// sendAsync sends the seed under key from a goroutine.
func sendAsync(t *testing.T, b *testBundle, key string) <-chan reply {
	t.Helper()
	return servicetest.Async(b.http, b.newRequest(t, http.MethodPost, "/orders", strings.NewReader(seedBody), "Idempotency-Key", key))
}

// startFirst sends the seed under key from a goroutine and returns once the
// operation is blocked inside CreateOrder.
func startFirst(t *testing.T, b *testBundle, repo *blockingRepo, key string) <-chan reply {
	t.Helper()
	// Registered after setup's, so it runs before the server's Close, which
	// would otherwise wait for the blocked request when a test fails early.
	t.Cleanup(repo.unblock)
	out := sendAsync(t, b, key)
	select {
	case <-repo.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first request never reached CreateOrder")
	}
	return out
}

// labelRequests runs each request under a pprof label naming its server
// and Idempotency-Key, which the request's goroutines inherit, so that
// awaitQueued can find where a given duplicate is.
func labelRequests(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pprof.Do(r.Context(), pprof.Labels(requestLabel, r.Host+" "+r.Header.Get("Idempotency-Key")), func(ctx context.Context) {
			h.ServeHTTP(w, r.WithContext(ctx))
		})
	})
}

const requestLabel = "oncekey-test-request"

// awaitQueued returns once a request to b under key waits in the engine's
// queue of duplicates behind the request that holds the key on this
// instance, and fails the test if none does within 10s. A duplicate that
// has only been sent may still be on its way: released then, the first
// request could finish before it arrives, and the test would check a plain
// replay instead of a wait.
func awaitQueued(t *testing.T, b *testBundle, key string) {
	t.Helper()
	label := fmt.Sprintf("# labels: {%q:%q}", requestLabel, strings.TrimPrefix(b.url, "http://")+" "+key)
	require.Eventually(t, func() bool {
		var profile strings.Builder
		if err := pprof.Lookup("goroutine").WriteTo(&profile, 1); err != nil {
			return false
		}
		// Goroutines with one stack and one set of labels share a record;
		// records are separated by blank lines.
		for record := range strings.SplitSeq(profile.String(), "\n\n") {
			if strings.Contains(record, label) && strings.Contains(record, "idempotency.(*collapser).enter") {
				return true
			}
		}
		return false
	}, 10*time.Second, 5*time.Millisecond, "a duplicate under %q waiting behind the first request", key)
}

func receive(t *testing.T, c <-chan reply, what string) reply {
	t.Helper()
	return servicetest.Receive(t, c, what, 15*time.Second)
}

func TestInFlightDuplicate(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		t.Run("gets 202 when the first outlasts the wait", func(t *testing.T) {
			t.Parallel()
			repo := newBlockingRepo(false)
			b := setup(t, be.open(t), options{cfg: httpapi.Config{Wait: 200 * time.Millisecond}, repo: repo.wrap})
			const key = "in-flight-202"

			firstC := startFirst(t, b, repo, key)
			start := time.Now()
			dup := b.postOrder(t, key, seedBody)
			requireProblem(t, dup, problem.InProgress, "duplicate while the first is running")
			require.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond, "the duplicate must wait before answering 202")
			retryAfter, err := strconv.Atoi(dup.Header.Get("Retry-After"))
			require.NoError(t, err, "202 needs an integer Retry-After, got %q", dup.Header.Get("Retry-After"))
			require.GreaterOrEqual(t, retryAfter, 1, "Retry-After")
			require.Equal(t, key, dup.Header.Get("Idempotency-Key"), "202 must echo the key")

			repo.unblock()
			first := receive(t, firstC, "first request")
			requireFresh(t, first, "first request after release")

			requireReplayOf(t, first, b.postOrder(t, key, seedBody), "third request")
			require.Equal(t, 1, b.orderCount(t))
		})

		t.Run("gets the replay when the first finishes within the wait", func(t *testing.T) {
			t.Parallel()
			repo := newBlockingRepo(false)
			b := setup(t, be.open(t), options{cfg: httpapi.Config{Wait: 5 * time.Second}, repo: repo.wrap})
			const key = "in-flight-replay"

			firstC := startFirst(t, b, repo, key)
			dupC := sendAsync(t, b, key)
			awaitQueued(t, b, key)
			repo.unblock()

			first := receive(t, firstC, "first request")
			requireFresh(t, first, "first request")
			requireReplayOf(t, first, receive(t, dupC, "duplicate"), "duplicate that waited")
			require.Equal(t, int32(1), repo.calls.Load(), "the duplicate must not run the operation")
			require.Equal(t, 1, b.orderCount(t))
		})

		t.Run("runs the operation itself when the first fails", func(t *testing.T) {
			t.Parallel()
			repo := newBlockingRepo(true)
			b := setup(t, be.open(t), options{cfg: httpapi.Config{Wait: 5 * time.Second}, repo: repo.wrap})
			const key = "in-flight-first-fails"

			firstC := startFirst(t, b, repo, key)
			dupC := sendAsync(t, b, key)
			awaitQueued(t, b, key)
			repo.unblock()

			requireProblem(t, receive(t, firstC, "first request"), problem.Internal, "first request fails")
			requireFresh(t, receive(t, dupC, "duplicate"), "duplicate after the first failed")
			require.Equal(t, int32(2), repo.calls.Load(), "the duplicate must run the operation")
			require.Equal(t, 1, b.orderCount(t))
		})
	})
}

// twin starts a second server on b's store with its own handler, its
// orders going through wrap; requests to it carry b's API key, so both
// servers act for one account.
func twin(t *testing.T, b *testBundle, wrap func(orders.Writer) orders.Writer, cfg httpapi.Config) *testBundle {
	t.Helper()
	cfg.Backend = b.store
	if cfg.DeferredKeys == nil {
		cfg.DeferredKeys = b.store.DeferredKeys()
	}
	cfg.DeferredKeys = servicetest.WrapOrders(cfg.DeferredKeys, wrap)
	handler, err := httpapi.New(cfg)
	require.NoError(t, err, "build second handler")
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)

	tw := *b
	tw.url = srv.URL
	tw.client, err = apiclient.NewClientWithResponses(srv.URL, apiclient.WithHTTPClient(b.http), apiclient.WithRequestEditorFn(tw.authorize))
	require.NoError(t, err, "build second client")
	return &tw
}

// slowRepo makes CreateOrder take a while, so that duplicates arrive while
// the first request is still running instead of after it.
type slowRepo struct {
	orders.Writer
	delay time.Duration
}

func (r slowRepo) CreateOrder(ctx context.Context, o orders.Order) error {
	select {
	case <-time.After(r.delay):
	case <-ctx.Done():
		return ctx.Err()
	}
	return r.Writer.CreateOrder(ctx, o)
}

func TestConcurrentDuplicatesMakeOneOrder(t *testing.T) {
	t.Parallel()
	const n = 100
	forEachBackend(t, func(t *testing.T, be backendCase) {
		for _, c := range []struct {
			name    string
			servers int
		}{{"one server", 1}, {"two servers", 2}} {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				store := be.open(t)
				slow := func(w orders.Writer) orders.Writer { return slowRepo{Writer: w, delay: 50 * time.Millisecond} }
				b := setup(t, store, options{repo: slow})
				servers := []*testBundle{b}
				if c.servers == 2 {
					servers = append(servers, twin(t, b, slow, httpapi.Config{}))
				}
				const key = "stampede"

				replies := b.stampede(t, n, func(i int) *http.Request {
					return servers[i%len(servers)].newRequest(t, http.MethodPost, "/orders", strings.NewReader(seedBody), "Idempotency-Key", key)
				})

				var created []byte
				statuses := map[int]int{}
				for i, r := range replies {
					statuses[r.Status]++
					switch r.Status {
					case http.StatusCreated:
						if created == nil {
							created = r.Body
						}
						require.Equal(t, string(created), string(r.Body), "request %d: every 201 must carry the same order", i)
					case http.StatusAccepted:
						require.NotEmpty(t, r.Header.Get("Retry-After"), "request %d: 202 without Retry-After", i)
					default:
						t.Fatalf("request %d: want 201 or 202, got %s", i, r)
					}
				}
				t.Logf("statuses: %v", statuses)
				require.NotNil(t, created, "no request created the order: %v", statuses)
				require.Equal(t, 1, b.orderCount(t), "one key must make one order; statuses %v", statuses)
			})
		}
	})
}
