package redisstore_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/internal/testharness"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/pgstore/pgstoretest"
	"github.com/oncekey/oncekey/idempotency/redisstore"
	"github.com/oncekey/oncekey/idempotency/redisstore/redistest"
	"github.com/oncekey/oncekey/idempotency/storetest"
)

func TestMain(m *testing.M) {
	pgstoretest.Main(m, pgstoretest.Options{})
}

// pgStore is pgstore on the test database.
func pgStore(t *testing.T) *pgstore.Store {
	t.Helper()
	s, err := pgstore.New(pgstoretest.Pool(t), pgstore.Options{})
	require.NoError(t, err)
	return s
}

// fastPath puts the fast path on rdb in front of next.
func fastPath(rdb redis.UniversalClient, cfg redisstore.Config, next idempotency.Store[pgx.Tx]) idempotency.Store[pgx.Tx] {
	return redisstore.Wrap(redisstore.New(rdb, cfg), next)
}

// privateRedis runs a redis-server of the test's own on a free port, so the
// test can flush or kill it. stop kills it.
func privateRedis(t *testing.T) (rdb redis.UniversalClient, stop func()) {
	t.Helper()
	server := redistest.Start(t)
	stop = func() { _ = server.Process.Kill() }
	rdb, err := redisstore.NewClient(server.URL)
	require.NoError(t, err)
	t.Cleanup(func() { rdb.Close() })
	require.Eventually(t, func() bool { return rdb.Ping(context.Background()).Err() == nil }, 5*time.Second, 10*time.Millisecond)
	return rdb, stop
}

// TestConformance: with the fast path in front, pgstore keeps every promise
// of the store contract (redisstore's own tests run it on memstore):
// looking claims up as replays come and go (the default), always, and
// with the in-flight marker.
func TestConformance(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]redisstore.Config{
		"default":         {},
		"always look up":  {AlwaysLookUp: true},
		"shed duplicates": {ShedDuplicates: true},
	} {
		cfg.Prefix = "conformance:"
		fast := redisstore.New(redistest.Shared(t), cfg)
		t.Run("pgstore, "+name, func(t *testing.T) {
			t.Parallel()
			storetest.Run(t, testharness.Wrapped(pgstoretest.TxHarness(pgstoretest.Pool(t), pgstore.Options{}), infront[pgx.Tx](fast)))
		})
		t.Run("pgstore deferred, "+name, func(t *testing.T) {
			t.Parallel()
			storetest.Run(t, testharness.Wrapped(pgstoretest.DeferredHarness(pgstoretest.Pool(t), pgstore.Options{}), infront[*pgstore.Batch](fast)))
		})
	}
}

func infront[U any](fast *redisstore.FastPath) func(*testing.T, idempotency.Store[U]) idempotency.Store[U] {
	return func(_ *testing.T, next idempotency.Store[U]) idempotency.Store[U] { return redisstore.Wrap(fast, next) }
}

// counting counts the claims that reach the durable store.
type counting struct {
	idempotency.Store[pgx.Tx]
	claims atomic.Int64
}

func (c *counting) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Lease[pgx.Tx], *idempotency.Record, error) {
	c.claims.Add(1)
	return c.Store.Claim(ctx, req)
}

// observed counts what the fast path reports.
type observed struct {
	hit, miss, errs, rejected, bypassed, fallbacks, trips atomic.Int64
}

func (o *observed) Redis(result string) {
	switch result {
	case "hit":
		o.hit.Add(1)
	case "miss":
		o.miss.Add(1)
	case "error":
		o.errs.Add(1)
	case "rejected":
		o.rejected.Add(1)
	case "bypassed":
		o.bypassed.Add(1)
	}
}
func (o *observed) Fallback() { o.fallbacks.Add(1) }

func (o *observed) Breaker(open bool) {
	if open {
		o.trips.Add(1)
	}
}

func claimReq(scope, key string) idempotency.ClaimRequest {
	return idempotency.ClaimRequest{Scope: scope, Key: key, Fingerprint: idempotency.Fingerprint{7},
		Method: "POST", Route: "/orders", TTL: time.Hour, Wait: 2 * time.Second}
}

func resp201(body string) idempotency.Response {
	return idempotency.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(body)}
}

// TestReplaysAreServedFromRedis: replays reach PostgreSQL at most once.
// Without the marker the first replay reads the record through (a first
// request caches nothing); with it the first request cached its record at
// commit.
func TestReplaysAreServedFromRedis(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		shed   bool
		claims int64 // claims that reach PostgreSQL: the first request's, and the read-through's
	}{{shed: false, claims: 2}, {shed: true, claims: 1}} {
		t.Run(fmt.Sprintf("shed duplicates %t", tt.shed), func(t *testing.T) {
			t.Parallel()
			inner := &counting{Store: pgStore(t)}
			obs := &observed{}
			fast := fastPath(redistest.Shared(t), redisstore.Config{Observer: obs, AlwaysLookUp: true, ShedDuplicates: tt.shed}, inner)
			scope := rand.Text()
			ctx := context.Background()

			lease, _, err := fast.Claim(ctx, claimReq(scope, "k"))
			require.NoError(t, err)
			require.NoError(t, lease.Commit(ctx, resp201(`{"id":"1"}`)))
			hitsBefore := obs.hit.Load()

			const replays = 10
			for range replays {
				_, rec, err := fast.Claim(ctx, claimReq(scope, "k"))
				require.NoError(t, err)
				require.Equal(t, `{"id":"1"}`, string(rec.Response.Body))
				require.Equal(t, 201, rec.Response.Status)
				require.Equal(t, idempotency.Fingerprint{7}, rec.Fingerprint)
			}
			require.EqualValues(t, tt.claims, inner.claims.Load(), "replays reach PostgreSQL at most once")
			// Each replay's look-up is a hit, unless Redis answered it after
			// its read timeout (a loaded machine): then PostgreSQL or the
			// marker script answered instead.
			hits := obs.hit.Load() - hitsBefore
			require.GreaterOrEqual(t, hits+obs.errs.Load(), int64(replays)-(tt.claims-1), "replays answered by Redis")
			require.Positive(t, hits, "replays found by their look-up")
		})
	}
}

func TestRedisDownAtStartFallsBackToPostgres(t *testing.T) {
	t.Parallel()
	rdb, err := redisstore.NewClient("redis://127.0.0.1:1/0") // nothing listens there
	require.NoError(t, err)
	t.Cleanup(func() { rdb.Close() })
	inner := &counting{Store: pgStore(t)}
	obs := &observed{}
	fast := fastPath(rdb, redisstore.Config{Observer: obs, AlwaysLookUp: true}, inner)
	scope := rand.Text()
	ctx := context.Background()

	lease, _, err := fast.Claim(ctx, claimReq(scope, "k"))
	require.NoError(t, err, "a dead Redis must not fail the request")
	require.NoError(t, lease.Commit(ctx, resp201(`{"id":"1"}`)))
	_, rec, err := fast.Claim(ctx, claimReq(scope, "k"))
	require.NoError(t, err)
	require.Equal(t, `{"id":"1"}`, string(rec.Response.Body), "the replay comes from PostgreSQL")
	require.EqualValues(t, 2, inner.claims.Load())
	require.Positive(t, obs.errs.Load())
	require.EqualValues(t, 2, obs.fallbacks.Load(), "one fallback per request")
}

// TestStaleMarkerDefersToPostgres: a marker whose holder is gone (its
// release was lost) must not turn answers PostgreSQL has into 202s.
func TestStaleMarkerDefersToPostgres(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	store := pgStore(t)
	scope := rand.Text()
	ctx := context.Background()

	// The operation completed through the durable store alone...
	lease, _, err := store.Claim(ctx, claimReq(scope, "k"))
	require.NoError(t, err)
	require.NoError(t, lease.Commit(ctx, resp201(`{"id":"1"}`)))
	// ...and a marker of some departed holder lingers in Redis.
	_, marker := redisstore.New(rdb, redisstore.Config{}).KeyNames(scope, "k")
	require.NoError(t, rdb.Set(ctx, marker, "someone-else", time.Minute).Err())
	t.Cleanup(func() { rdb.Del(context.Background(), marker) })

	fast := fastPath(rdb, redisstore.Config{ShedDuplicates: true}, store)
	req := claimReq(scope, "k")
	req.Wait = 300 * time.Millisecond
	start := time.Now()
	_, rec, err := fast.Claim(ctx, req)
	require.NoError(t, err, "a stale marker must not make the answer a 202")
	require.Equal(t, `{"id":"1"}`, string(rec.Response.Body))
	require.Less(t, time.Since(start), req.Wait+500*time.Millisecond, "within the wait budget")
}

func TestFlushedRedisKeepsAnsweringCorrectly(t *testing.T) {
	t.Parallel()
	rdb, _ := privateRedis(t)
	inner := &counting{Store: pgStore(t)}
	fast := fastPath(rdb, redisstore.Config{AlwaysLookUp: true}, inner)
	scope := rand.Text()
	ctx := context.Background()

	lease, _, err := fast.Claim(ctx, claimReq(scope, "k"))
	require.NoError(t, err)
	require.NoError(t, lease.Commit(ctx, resp201(`{"id":"1"}`)))
	require.NoError(t, rdb.FlushAll(ctx).Err())

	_, rec, err := fast.Claim(ctx, claimReq(scope, "k"))
	require.NoError(t, err)
	require.NotNil(t, rec, "after a flush the record still replays, from PostgreSQL")
	require.Equal(t, `{"id":"1"}`, string(rec.Response.Body))
	_, rec, err = fast.Claim(ctx, claimReq(scope, "k"))
	require.NoError(t, err)
	require.Equal(t, `{"id":"1"}`, string(rec.Response.Body))
	require.EqualValues(t, 2, inner.claims.Load(), "the first miss refilled the cache")
}

// TestMarkerShedsDuplicates: with ShedDuplicates, while the first request
// holds the key, its duplicates wait on Redis and do not each take a
// database connection.
func TestMarkerShedsDuplicates(t *testing.T) {
	t.Parallel()
	inner := &counting{Store: pgStore(t)}
	obs := &observed{}
	rdb := redistest.Shared(t) // a client of the test's own
	polls := &markerPolls{seen: map[int]bool{}}
	rdb.AddHook(polls)
	fast := fastPath(rdb, redisstore.Config{Observer: obs, ShedDuplicates: true}, inner)
	scope := rand.Text()
	ctx := context.Background()

	lease, _, err := fast.Claim(ctx, claimReq(scope, "k"))
	require.NoError(t, err)
	const duplicates = 30
	var wg sync.WaitGroup
	bodies := make([]string, duplicates)
	errs := make([]error, duplicates)
	for i := range duplicates {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, rec, err := fast.Claim(context.WithValue(ctx, duplicateKey{}, i), claimReq(scope, "k"))
			errs[i] = err
			if rec != nil {
				bodies[i] = string(rec.Response.Body)
			}
		}()
	}
	// Commit once every duplicate waits on Redis, polling the first
	// request's marker: committed sooner, the record would be there for
	// the late ones at once, and they would not have waited.
	require.Eventually(t, func() bool { return polls.count() == duplicates }, 10*time.Second, 5*time.Millisecond,
		"every duplicate polls the first request's marker")
	require.NoError(t, lease.Commit(ctx, resp201(`{"id":"1"}`)))
	waitFor(t, &wg, 30*time.Second, "the duplicates")
	for i := range duplicates {
		require.NoError(t, errs[i])
		require.Equal(t, `{"id":"1"}`, bodies[i])
	}
	require.Zero(t, obs.errs.Load(), "Redis answered every look-up")
	require.EqualValues(t, 1, inner.claims.Load(), "only the first request reached PostgreSQL")
}

// duplicateKey marks the context of a duplicate's claim with its index.
type duplicateKey struct{}

// markerPolls is a Redis hook that records which duplicates have polled a
// marker (EXISTS, which a claim sends only while it waits on another's
// marker).
type markerPolls struct {
	mu   sync.Mutex
	seen map[int]bool
}

func (p *markerPolls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (p *markerPolls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if i, ok := ctx.Value(duplicateKey{}).(int); ok && cmd.Name() == "exists" {
			p.mu.Lock()
			p.seen[i] = true
			p.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

func (p *markerPolls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (p *markerPolls) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.seen)
}

// TestRedisKilledMidLoad: Redis dies while requests are running; every
// operation still happens exactly once and nobody gets an error, whether
// claims are looked up as replays come (the default: here most claims are
// replays) or always.
func TestRedisKilledMidLoad(t *testing.T) {
	t.Parallel()
	for _, always := range []bool{false, true} {
		t.Run(fmt.Sprintf("always look up %t", always), func(t *testing.T) {
			t.Parallel()
			rdb, stop := privateRedis(t)
			obs := &observed{}
			fast := fastPath(rdb, redisstore.Config{AlwaysLookUp: always, Observer: obs}, pgStore(t))
			const keys, fresh, rounds = 20, 4, 10
			executed, failures, _ := load(t, fast, []string{rand.Text()}, keys, fresh, rounds, 0, func(round int) {
				if round == rounds/2 {
					require.Positive(t, obs.hit.Load(), "replays served by Redis before it went away")
					stop() // Redis goes away mid-load
				}
			})
			for key, err := range failures {
				t.Errorf("%s: %v", key, err)
			}
			require.EqualValues(t, keys+fresh*rounds, executed.Load(), "each key's operation ran exactly once, the keys first claimed as Redis went away included")
		})
	}
}

// commandCounter counts the commands a client sends, alone or pipelined.
type commandCounter struct{ n atomic.Int64 }

func (c *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

func (c *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// TestRedisCommandsPerRequest pins what the fast path costs in Redis. By
// default, while replays are rare, nothing: claims go straight to the
// durable store. A looked-up first request looks its record up, and that
// is all; with ShedDuplicates it also takes the marker (a script that looks
// again in the same step) and, once committed, caches the record and gives
// the marker up (another script). A looked-up replay is one look-up, and
// the first replay of a record that was not cached reads it through: the
// look-up and the write.
func TestRedisCommandsPerRequest(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                       string
		cfg                        redisstore.Config
		first, firstReplay, replay int64
	}{
		{name: "replays rare", cfg: redisstore.Config{}, first: 0, firstReplay: 0, replay: 0},
		{name: "always look up", cfg: redisstore.Config{AlwaysLookUp: true}, first: 1, firstReplay: 2, replay: 1},
		{name: "shed duplicates", cfg: redisstore.Config{ShedDuplicates: true}, first: 3, firstReplay: 1, replay: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rdb := redistest.Shared(t) // a client of the test's own
			counter := &commandCounter{}
			rdb.AddHook(counter)
			fast := fastPath(rdb, tt.cfg, pgStore(t))
			scope := rand.Text()
			ctx := context.Background()
			first := func(key string) { t.Helper(); commitNew(t, fast, scope, key) }
			replay := func(what string, want int64) {
				t.Helper()
				counter.n.Store(0)
				_, rec, err := fast.Claim(ctx, claimReq(scope, "k"))
				require.NoError(t, err, what)
				require.NotNil(t, rec, "%s: the record", what)
				require.Equal(t, `{"key":"k"}`, string(rec.Response.Body), "%s: the replayed body", what)
				require.Equal(t, want, counter.n.Load(), "Redis commands of %s", what)
			}
			first("warm-up") // Redis may not know the scripts yet (EVALSHA, then EVAL)

			counter.n.Store(0)
			first("k")
			require.Equal(t, tt.first, counter.n.Load(), "Redis commands of a first request")
			replay("the first replay", tt.firstReplay)
			replay("a replay", tt.replay)
		})
	}
}

// TestLookUpsFollowReplays: by default the fast path looks claims up on
// Redis only while replays are a real share of them. First requests alone
// cost Redis nothing; a storm of retries turns look-ups on within a handful
// of replays, after which Redis serves them; and once first requests are
// most of the traffic again, look-ups go off.
func TestLookUpsFollowReplays(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t) // a client of the test's own
	counter := &commandCounter{}
	rdb.AddHook(counter)
	inner := &counting{Store: pgStore(t)}
	obs := &observed{}
	fast := fastPath(rdb, redisstore.Config{Observer: obs}, inner)
	scope := rand.Text()
	ctx := context.Background()
	first := func(key string) { t.Helper(); commitNew(t, fast, scope, key) }

	const firsts = 50
	for i := range firsts {
		first(fmt.Sprintf("first-%d", i))
	}
	require.Zero(t, counter.n.Load(), "Redis commands of first requests while nobody retries")
	require.EqualValues(t, firsts, obs.bypassed.Load(), "claims that bypassed Redis")
	require.EqualValues(t, firsts, inner.claims.Load(), "claims that reached PostgreSQL")

	// A storm: the same key, again and again.
	replays := 0
	for obs.hit.Load() == 0 {
		replays++
		require.LessOrEqual(t, replays, 10, "replays before Redis served one")
		_, rec, err := fast.Claim(ctx, claimReq(scope, "first-0"))
		require.NoError(t, err, "replay %d", replays)
		require.Equal(t, `{"key":"first-0"}`, string(rec.Response.Body), "replay %d", replays)
		if replays <= 4 {
			require.Zero(t, counter.n.Load(), "Redis commands of replay %d: four in fifty-four claims are still rare", replays)
		}
	}
	claims := inner.claims.Load()
	for range 5 {
		_, rec, err := fast.Claim(ctx, claimReq(scope, "first-0"))
		require.NoError(t, err, "a replay in the storm")
		require.Equal(t, `{"key":"first-0"}`, string(rec.Response.Body), "a replay in the storm")
	}
	require.Equal(t, claims, inner.claims.Load(), "replays in the storm answered by Redis")

	// The storm is over: first requests, looked up at first, until replays
	// are rare again.
	var lookedUp int
	for i := 0; ; i++ {
		require.Less(t, i, 200, "first requests still looked up after the storm")
		before := counter.n.Load()
		first(fmt.Sprintf("after-%d", i))
		if counter.n.Load() == before {
			break
		}
		lookedUp++
	}
	require.Positive(t, lookedUp, "first requests looked up while the storm was recent")
	before := counter.n.Load()
	for i := range 20 {
		first(fmt.Sprintf("later-%d", i))
	}
	require.Equal(t, before, counter.n.Load(), "Redis commands of first requests once replays are rare again")
}

// commitNew claims scope's new key on s and commits {"key":key}.
func commitNew(t *testing.T, s idempotency.Store[pgx.Tx], scope, key string) {
	t.Helper()
	ctx := context.Background()
	lease, rec, err := s.Claim(ctx, claimReq(scope, key))
	require.NoError(t, err, "claim %s", key)
	require.Nil(t, rec, "claim %s: a record for a new key", key)
	require.NoError(t, lease.Commit(ctx, resp201(`{"key":"`+key+`"}`)), "commit %s", key)
}

// TestUnusableCachedRecordIsReplaced: a record this replica cannot read
// (here another version's JSON) is neither served nor mistaken for a
// request in flight: the database answers at once and its read-through
// replaces the record.
func TestUnusableCachedRecordIsReplaced(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	inner := &counting{Store: pgStore(t)}
	obs := &observed{}
	fast := fastPath(rdb, redisstore.Config{Observer: obs, Poll: time.Second, ShedDuplicates: true}, inner)
	scope := rand.Text()
	ctx := context.Background()

	lease, _, err := inner.Store.Claim(ctx, claimReq(scope, "k"))
	require.NoError(t, err, "claim through PostgreSQL alone")
	require.NoError(t, lease.Commit(ctx, resp201(`{"id":"1"}`)), "commit")
	recKey, _ := redisstore.New(rdb, redisstore.Config{}).KeyNames(scope, "k")
	require.NoError(t, rdb.Set(ctx, recKey, `{"fp":"AAAA","status":201}`, time.Minute).Err(), "an old replica's record")

	start := time.Now()
	_, rec, err := fast.Claim(ctx, claimReq(scope, "k"))
	require.NoError(t, err, "claim over an unusable record")
	require.NotNil(t, rec, "the record, from PostgreSQL")
	require.Equal(t, `{"id":"1"}`, string(rec.Response.Body), "the replayed body")
	require.Less(t, time.Since(start), 500*time.Millisecond, "answered without waiting for a holder that does not exist")
	require.EqualValues(t, 1, inner.claims.Load(), "PostgreSQL answered")
	require.Zero(t, obs.fallbacks.Load(), "an unusable record is no Redis failure")

	_, rec, err = fast.Claim(ctx, claimReq(scope, "k"))
	require.NoError(t, err, "claim after the read-through")
	require.Equal(t, `{"id":"1"}`, string(rec.Response.Body), "the replayed body")
	require.EqualValues(t, 1, inner.claims.Load(), "the read-through replaced the record: Redis answered")
}

// TestForgedRecordsAreNotReplayed checks that what else can write to the
// Redis cannot make the fast path replay a response of its making: a
// record sealed under another secret, or one scope's record copied to
// another scope's key, is rejected and read through from PostgreSQL, which
// then replaces it. Processes that share the secret share the records.
func TestForgedRecordsAreNotReplayed(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	ctx := context.Background()
	secret := []byte(rand.Text() + rand.Text())
	inner := &counting{Store: pgStore(t)}
	obs := &observed{}
	fast := redisstore.New(rdb, redisstore.Config{Secret: secret, Observer: obs, AlwaysLookUp: true})
	store := redisstore.Wrap(fast, idempotency.Store[pgx.Tx](inner))
	commit := func(s idempotency.Store[pgx.Tx], scope, body string) {
		t.Helper()
		lease, rec, err := s.Claim(ctx, claimReq(scope, "k"))
		require.NoError(t, err, "claim %s", scope)
		require.Nil(t, rec, "a new key of %s", scope)
		require.NoError(t, lease.Commit(ctx, resp201(body)), "commit %s", scope)
	}
	// readThrough replays scope's key on s, which caches the record from
	// the durable store (a commit caches nothing).
	readThrough := func(s idempotency.Store[pgx.Tx], scope, body string) {
		t.Helper()
		_, rec, err := s.Claim(ctx, claimReq(scope, "k"))
		require.NoError(t, err, "replay %s", scope)
		require.Equal(t, body, string(rec.Response.Body), "the replay of %s", scope)
	}

	t.Run("sealed under another secret", func(t *testing.T) {
		scope := rand.Text()
		// A forger that caches at commit: it could write anything anyway.
		forger := redisstore.Wrap(redisstore.New(rdb, redisstore.Config{Secret: []byte("not the service's secret at all"), ShedDuplicates: true}), memstore.New())
		lease, _, err := forger.Claim(ctx, claimReq(scope, "k"))
		require.NoError(t, err, "the forger's claim")
		require.NoError(t, lease.Commit(ctx, resp201(`{"forged":true}`)), "the forger caches its record")

		lease2, rec, err := store.Claim(ctx, claimReq(scope, "k"))
		require.NoError(t, err, "claim over the forged record")
		require.Nil(t, rec, "the forged record replayed: %+v", rec)
		require.NotNil(t, lease2, "a new key runs its operation")
		require.NoError(t, lease2.Commit(ctx, resp201(`{"real":1}`)), "commit")
		require.EqualValues(t, 1, obs.rejected.Load(), "look-ups that rejected a record")
		_, rec, err = store.Claim(ctx, claimReq(scope, "k"))
		require.NoError(t, err, "replay")
		require.Equal(t, `{"real":1}`, string(rec.Response.Body), "the record that replaced the forged one")
	})

	t.Run("another scope's record copied", func(t *testing.T) {
		victim, other := rand.Text(), rand.Text()
		commit(inner, victim, `{"owner":"victim"}`) // through PostgreSQL alone: nothing cached
		commit(store, other, `{"owner":"other"}`)
		readThrough(store, other, `{"owner":"other"}`)
		otherKey, _ := fast.KeyNames(other, "k")
		victimKey, _ := fast.KeyNames(victim, "k")
		raw, err := rdb.Get(ctx, otherKey).Bytes()
		require.NoError(t, err, "the other scope's cached record")
		require.NoError(t, rdb.Set(ctx, victimKey, raw, time.Minute).Err(), "copy it to the victim's key")

		before := obs.rejected.Load()
		_, rec, err := store.Claim(ctx, claimReq(victim, "k"))
		require.NoError(t, err, "the victim's replay")
		require.Equal(t, `{"owner":"victim"}`, string(rec.Response.Body), "the victim's own record, from PostgreSQL")
		require.Equal(t, before+1, obs.rejected.Load(), "look-ups that rejected a record")
	})

	t.Run("replicas share the secret and the records", func(t *testing.T) {
		scope := rand.Text()
		commit(store, scope, `{"shared":true}`)
		readThrough(store, scope, `{"shared":true}`)
		replicaObs := &observed{}
		replica := redisstore.Wrap(redisstore.New(rdb, redisstore.Config{Secret: secret, Observer: replicaObs, AlwaysLookUp: true}), idempotency.Store[pgx.Tx](inner))
		claims := inner.claims.Load()
		_, rec, err := replica.Claim(ctx, claimReq(scope, "k"))
		require.NoError(t, err, "the replica's replay")
		require.Equal(t, `{"shared":true}`, string(rec.Response.Body), "the replayed body")
		require.Equal(t, claims, inner.claims.Load(), "the replica's replay came from Redis")
		require.Zero(t, replicaObs.rejected.Load(), "records rejected by a replica with the same secret")
	})
}

// waitFor waits for wg, and fails the test with what if that takes longer
// than d: a claim stuck behind a fault must fail the test, not hang it.
func waitFor(t testing.TB, wg *sync.WaitGroup, d time.Duration, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s: still running after %s", what, d)
	}
}
