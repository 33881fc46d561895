package httpapi_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/orders"
	"github.com/oncekey/oncekey/internal/service/servicetest"
	"github.com/oncekey/oncekey/internal/service/store"
	"github.com/oncekey/oncekey/internal/service/store/memory"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// stormBound is what a request with its own key may take while a storm of
// duplicates of another, slow key rages on a 10-connection pool. Without
// collapsing, each duplicate holds a connection for all of IDEMPOTENCY_WAIT
// (the first request holds the key longer than that), and a request with
// its own key waits for tens of seconds or times out.
const (
	stormLeader = 5 * time.Second
	stormBound  = 3 * time.Second
)

// slowSKURepo makes the orders of one SKU slow. entered, if set, is called
// as each such order starts.
type slowSKURepo struct {
	orders.Writer
	sku     string
	delay   time.Duration
	entered func()
}

func (r slowSKURepo) CreateOrder(ctx context.Context, o orders.Order) error {
	if len(o.Items) > 0 && o.Items[0].SKU == r.sku {
		if r.entered != nil {
			r.entered()
		}
		select {
		case <-time.After(r.delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return r.Writer.CreateOrder(ctx, o)
}

// A storm of 300 concurrent duplicates of one key does not starve requests
// with other keys: the duplicates wait inside the instance on the one that
// went to the database, holding no connection.
func TestStormOnOneKeyDoesNotStarveOthers(t *testing.T) {
	t.Parallel()
	pool, err := postgres.Open(context.Background(), testdb.URL(t)+"&pool_max_conns=10")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store := postgres.New(pool, nil)
	stormKey := uuid.NewString()
	const stormBody = `{"items":[{"sku":"STORM","qty":1}],"amount":1200,"currency":"RUB"}`
	// leading is closed once the storm's first request holds its key,
	// running its slow order.
	leading := make(chan struct{})
	var lead sync.Once
	b := setup(t, store, options{
		repo: func(w orders.Writer) orders.Writer {
			return slowSKURepo{Writer: w, sku: "STORM", delay: stormLeader, entered: func() { lead.Do(func() { close(leading) }) }}
		},
		cfg: httpapi.Config{Wait: time.Second},
	})

	const storm, others = 300, 40
	// A plain client: validating 340 responses against the contract would
	// load the CPU this test measures (the other tests validate them).
	client := &http.Client{Timeout: 30 * time.Second}
	var wg sync.WaitGroup
	start := make(chan struct{})
	stormStatuses := make([]int, storm)
	for i := range storm {
		req := b.newRequest(t, http.MethodPost, "/orders", strings.NewReader(stormBody), "Idempotency-Key", stormKey)
		wg.Go(func() {
			<-start
			r, err := servicetest.Exchange(client, req)
			if err == nil {
				stormStatuses[i] = r.Status
			}
		})
	}
	latencies := make([]time.Duration, others)
	otherStatuses := make([]int, others)
	for i := range others {
		req := b.newRequest(t, http.MethodPost, "/orders", strings.NewReader(seedBody), "Idempotency-Key", uuid.NewString())
		wg.Go(func() {
			<-start
			// Sent once the storm is under way: its first request holds
			// the key, and the duplicates pile up behind it. Sent sooner,
			// they would measure a quiet server.
			select {
			case <-leading:
			case <-time.After(time.Minute):
				return // no status: fails below
			}
			began := time.Now()
			r, err := servicetest.Exchange(client, req)
			latencies[i] = time.Since(began)
			if err == nil {
				otherStatuses[i] = r.Status
			}
		})
	}
	close(start)
	servicetest.Wait(t, &wg, 2*time.Minute, "the storm")

	for i, s := range otherStatuses {
		require.Equal(t, http.StatusCreated, s, "request %d with its own key", i)
	}
	slices.Sort(latencies)
	p99 := latencies[len(latencies)*99/100]
	require.Less(t, p99, stormBound, "p99 of requests with other keys during the storm (median %s)", latencies[len(latencies)/2])
	for i, s := range stormStatuses {
		require.Contains(t, []int{http.StatusCreated, http.StatusAccepted}, s, "storm request %d", i)
	}
	require.Equal(t, others+1, b.orderCount(t), "one order for the storm key, one for each other key")
	t.Logf("p99 %s, median %s of %d requests with other keys beside %d duplicates", p99, latencies[len(latencies)/2], others, storm)
}

// slowClaims makes every claim take a while, as a loaded database would.
type slowClaims[U any] struct {
	idempotency.Store[U]
	delay time.Duration
}

func (s slowClaims[U]) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Lease[U], *idempotency.Record, error) {
	pace(s.delay)
	return s.Store.Claim(ctx, req)
}

// 100 concurrent retries of a key whose outcome is already stored all get
// the replay: queueing duplicates inside the instance must not serialise
// them into the wait budget and turn some into a false 202 (a reviewer's
// reproduction of a first version of the queue: 49 replays, 51 of 202).
func TestConcurrentRetriesOfAFinishedKeyAllReplay(t *testing.T) {
	t.Parallel()
	mem := memory.New()
	b := setup(t, mem, options{cfg: httpapi.Config{
		DeferredKeys: slowClaims[store.Deferred]{Store: mem.DeferredKeys(), delay: 20 * time.Millisecond}, Wait: time.Second,
	}})
	key := uuid.NewString()
	first := b.postOrder(t, key, seedBody)
	requireFresh(t, first, "the first request")
	replies := b.stampede(t, 100, func(int) *http.Request {
		return b.newRequest(t, http.MethodPost, "/orders", strings.NewReader(seedBody), "Idempotency-Key", key)
	})
	for i, r := range replies {
		requireReplayOf(t, first, r, fmt.Sprintf("retry %d", i))
	}
}
