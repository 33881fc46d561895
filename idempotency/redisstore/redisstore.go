// Package redisstore is a Redis fast path in front of a durable idempotency
// store (pgstore, say). Redis is for speed only; the durable store stays
// the record of truth, and every Redis failure falls back to it:
//
//   - Completed records are cached (SET … PX until the key expires) and
//     replays are served from Redis without touching the database. A
//     completed record never changes until it expires, so the cache can
//     never disagree with the database about it. The one exception, a long
//     operation's provisional 202 (replaced by its final response when the
//     background work ends), is never cached.
//   - Redis is looked up only while replays are a real share of recent
//     claims (at least one in eight): a storm of retries, which is when
//     taking replays off the durable store matters. Otherwise a claim goes
//     straight to the durable store and costs Redis nothing: most requests
//     are first requests, which Redis cannot answer, and a look-up each
//     would make all of them slower to speed up the few that are retries.
//     Config.AlwaysLookUp looks every claim up.
//   - A looked-up first request costs one Redis round trip, its look-up. A
//     record is cached when the durable store answers a looked-up replay
//     (read-through), not when it is first committed: most keys are never
//     retried, and a replay on the replica that committed is answered by
//     its own record cache (recordcache) before Redis. The durable store's
//     claim already keeps concurrent duplicates from running twice.
//   - With Config.ShedDuplicates, a first request also takes an in-flight
//     marker (SET NX PX, a short lease) and caches its record at commit, so
//     that concurrent duplicates wait on Redis instead of each holding a
//     database connection blocked on the first request's row: two more
//     round trips per first request, for storms of duplicates. The marker
//     is only a hint: if it is lost (flush, restart, expiry) duplicates go
//     to the database, which still runs the operation exactly once.
//   - A Redis that fails TripAfter commands in a row is left alone (a
//     circuit breaker) until a probe in the background finds it answering:
//     while it is down or paused, requests cost what the durable store
//     alone costs, not a timeout each.
//
// Every Redis key carries the scope in a hash tag ({scope}), so all of a
// scope's keys live in one Redis Cluster slot. One FastPath (a client and a
// key prefix) serves any number of durable stores through Wrap.
package redisstore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/idempotency"
)

// Observer receives what the fast path did, for metrics.
type Observer interface {
	// Redis reports a look-up: "hit", "miss", "error", "rejected" (a
	// record whose tag did not verify: forged, or sealed under another
	// Secret), "skipped" while the breaker keeps requests off Redis, or
	// "bypassed" for a claim not looked up because replays were rare. A
	// request that waits on another's marker reports one result for its
	// whole wait.
	Redis(result string)
	// Fallback reports a request that went to the durable store because
	// Redis failed (or was left alone) somewhere on its way; once per
	// request.
	Fallback()
	// Breaker reports that the breaker opened (Redis is left alone) or
	// closed again.
	Breaker(open bool)
}

type noObserver struct{}

func (noObserver) Redis(string) {}
func (noObserver) Fallback()    {}
func (noObserver) Breaker(bool) {}

// Config configures the fast path.
type Config struct {
	// Prefix starts every Redis key (default "idempotency:"), so that
	// several applications can share one Redis.
	Prefix string
	// ShedDuplicates makes a first request take an in-flight marker and
	// cache its record at commit, so that its concurrent duplicates wait on
	// Redis rather than on the durable store: worth its two more round
	// trips per first request only where storms of duplicates would
	// otherwise hold database connections. Off, a first request costs one
	// round trip.
	ShedDuplicates bool
	// AlwaysLookUp looks every claim up on Redis. By default a claim is
	// looked up only while at least one in eight recent claims was a
	// replay, so that first requests cost Redis nothing while retries are
	// rare. ShedDuplicates looks every claim up too.
	AlwaysLookUp bool
	// Marker is the in-flight marker's lease (default 5s) with
	// ShedDuplicates: long enough to cover a normal operation, short enough
	// that a crashed holder's marker goes away by itself.
	Marker time.Duration
	// Poll is how often a duplicate looks for the first request's outcome
	// while the marker is held (default 10ms), with ShedDuplicates.
	Poll time.Duration
	// TripAfter is how many commands in a row must fail for Redis to be
	// left alone (default 3).
	TripAfter int
	// Cooldown is how long Redis is left alone before a probe, and between
	// probes while it does not answer (default 500ms).
	Cooldown time.Duration
	// Observer, optional, receives each look-up's result and each fallback
	// to the durable store, for metrics; nil reports nothing.
	Observer Observer
	// Logger receives a WARN line when Redis starts failing (requests
	// leave it alone) and one when it recovers: a line a change, never a
	// line a request, and while Redis flaps at most one line of each kind
	// a minute. Default slog.Default().
	Logger *slog.Logger
	// Secret authenticates every cached record (HMAC-SHA256 over the
	// record and its Redis key), so that whatever else can write to the
	// Redis cannot forge a replay: a record that does not verify is read
	// through from the durable store. Give every process that shares the
	// cache the same secret, 32 random bytes or more. When empty, New
	// draws one at random, and the cache serves each process only the
	// records it wrote itself.
	Secret []byte
}

// FastPath is the Redis fast path: a client and its settings, put in front
// of durable stores with Wrap. It is not a store itself (it keeps no record
// of truth): Wrap makes the idempotency.Store.
type FastPath struct {
	rdb redis.UniversalClient
	// reads serves the record look-ups, the one command on every replay:
	// go-redis' automatic pipelining where the client has it, so that
	// look-ups from concurrent requests share one write and one read on one
	// connection instead of a round trip each (docs/benchmarks.md has what
	// it saves). A lone look-up is sent at once.
	reads   redis.Cmdable
	cfg     Config
	breaker *breaker
	sealer  *sealer
	// replays is the share of recent claims that were replays, which
	// decides whether a claim is looked up.
	replays replayShare
}

// autoPipelined is a client that can pipeline concurrent commands by itself
// (redis.Client and redis.ClusterClient, go-redis v9.22 and later).
type autoPipelined interface {
	AutoPipeline() (*redis.AutoPipeliner, error)
}

// New returns the fast path on rdb: a single node, Sentinel or a Cluster.
func New(rdb redis.UniversalClient, cfg Config) *FastPath {
	if cfg.Prefix == "" {
		cfg.Prefix = "idempotency:"
	}
	if cfg.Marker <= 0 {
		cfg.Marker = 5 * time.Second
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 10 * time.Millisecond
	}
	if cfg.TripAfter <= 0 {
		cfg.TripAfter = 3
	}
	if cfg.Cooldown <= 0 {
		cfg.Cooldown = 500 * time.Millisecond
	}
	if cfg.Observer == nil {
		cfg.Observer = noObserver{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &FastPath{rdb: rdb, reads: rdb, cfg: cfg, breaker: newBreaker(rdb, cfg), sealer: newSealer(cfg.Secret)}
	s.cfg.Secret = nil // kept only in the sealer
	if c, ok := rdb.(autoPipelined); ok {
		// Closed with the client.
		if ap, err := c.AutoPipeline(); err == nil {
			s.reads = ap
		}
	}
	return s
}

// NewClient connects to url with timeouts short enough that a slow or
// absent Redis costs little before the fallback: Redis must never make a
// request slower than the database alone by much. url is one Redis
// (redis://host:6379/0, rediss:// with TLS, unix://) or a Redis Cluster,
// given by any of its nodes as seeds:
//
//	redis+cluster://host1:6379,host2:6379,host3:6379   (rediss+cluster:// with TLS)
//
// A comma-separated host list in a plain redis:// URL is refused rather
// than read as one host or as a cluster.
func NewClient(url string) (redis.UniversalClient, error) {
	// go-redis logs every failed dial on its own; with Redis down that is a
	// line per request. The Observer counts failures instead.
	silenceOnce.Do(func() { redis.SetLogger(silent{}) })
	c, err := newClient(url)
	if err != nil {
		// The URL's user and password stay out of every error, which a
		// service prints at start and a log keeps: a parse error quotes the
		// URL whole.
		if secret := userinfo(url); secret != "" {
			return nil, errors.New(strings.ReplaceAll(err.Error(), secret, "REDACTED"))
		}
	}
	return c, err
}

// userinfo is the "user:password" part of a Redis URL, or "".
func userinfo(url string) string {
	_, rest, ok := strings.Cut(url, "://")
	if !ok {
		return ""
	}
	at := strings.LastIndex(rest, "@")
	if at <= 0 {
		return ""
	}
	return rest[:at]
}

func newClient(url string) (redis.UniversalClient, error) {
	if scheme, rest, ok := strings.Cut(url, "+cluster://"); ok {
		return newClusterClient(scheme, rest)
	}
	if _, rest, ok := strings.Cut(url, "://"); ok {
		if host, _, _ := strings.Cut(strings.SplitN(rest, "/", 2)[0], "?"); strings.Contains(host, ",") {
			return nil, fmt.Errorf("the Redis URL names several hosts (%s): for a Redis Cluster, write redis+cluster://%s", host, host)
		}
	}
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("parse the Redis URL: %w", err)
	}
	opts.DialTimeout = dialTimeout
	opts.ReadTimeout = ioTimeout
	opts.WriteTimeout = ioTimeout
	opts.MaxRetries = -1 // no retries: the database is the retry
	// One dial per attempt: go-redis would otherwise dial a Redis that
	// refuses connections five times, 100ms apart, per command.
	opts.DialerRetries = 1
	// Waiting for a pooled connection counts too (go-redis' default is
	// ReadTimeout + 1s).
	opts.PoolTimeout = dialTimeout
	return redis.NewClient(opts), nil
}

// The client's timeouts: a Redis slower than this is treated as down.
const (
	dialTimeout = 200 * time.Millisecond
	ioTimeout   = 100 * time.Millisecond
)

// newClusterClient is NewClient for redis+cluster:// (scheme "redis") and
// rediss+cluster:// ("rediss"): rest is the seeds, then any of go-redis'
// cluster URL options (?route_by_latency=true…); its timeouts are
// NewClient's whatever the options say.
func newClusterClient(scheme, rest string) (redis.UniversalClient, error) {
	if scheme != "redis" && scheme != "rediss" {
		return nil, fmt.Errorf("the Redis URL's scheme is %s+cluster: want redis+cluster or rediss+cluster", scheme)
	}
	hosts, query, _ := strings.Cut(rest, "?")
	userinfo := ""
	if at := strings.LastIndex(hosts, "@"); at >= 0 {
		userinfo, hosts = hosts[:at+1], hosts[at+1:]
	}
	if path := strings.Index(hosts, "/"); path >= 0 {
		if db := strings.Trim(hosts[path:], "/"); db != "" && db != "0" {
			return nil, fmt.Errorf("the Redis URL selects database %s: a Redis Cluster has only database 0", db)
		}
		hosts = hosts[:path]
	}
	seeds := strings.Split(hosts, ",")
	for _, h := range seeds {
		if h == "" {
			return nil, fmt.Errorf("the Redis URL %s+cluster://%s has an empty host: list host:port seeds separated by commas", scheme, rest)
		}
	}
	// go-redis' own cluster URL form: the first seed as the host, the
	// others as addr= options.
	u := scheme + "://" + userinfo + seeds[0]
	params := []string{}
	for _, h := range seeds[1:] {
		params = append(params, "addr="+h)
	}
	if query != "" {
		params = append(params, query)
	}
	if len(params) > 0 {
		u += "?" + strings.Join(params, "&")
	}
	opts, err := redis.ParseClusterURL(u)
	if err != nil {
		return nil, fmt.Errorf("parse the Redis Cluster URL: %w", err)
	}
	opts.DialTimeout = dialTimeout
	opts.ReadTimeout = ioTimeout
	opts.WriteTimeout = ioTimeout
	opts.MaxRetries = -1
	opts.DialerRetries = 1
	opts.PoolTimeout = dialTimeout
	// The slot map is read again this often while commands flow (go-redis'
	// default is a minute). A MOVED answer reloads it at once, but a master
	// that crashed answers nothing: until the map is read again, its slots'
	// commands would go on failing after its replica took over.
	opts.ClusterStateReloadInterval = time.Second
	return redis.NewClusterClient(opts), nil
}

var silenceOnce sync.Once

type silent struct{}

func (silent) Printf(context.Context, string, ...any) {}

// KeyNames returns the Redis keys of one idempotency key: the cached record
// and the in-flight marker. The scope (hex, as the hash tag) and the key
// (hashed) make short, safe Redis keys whatever bytes they hold.
func (s *FastPath) KeyNames(scope, key string) (record, marker string) {
	sum := sha256.Sum256([]byte(key))
	base := s.cfg.Prefix + "{" + hex.EncodeToString([]byte(scope)) + "}:" + hex.EncodeToString(sum[:16])
	return base + ":rec", base + ":inflight"
}

// Wrap puts the fast path in front of next. The store it returns does all
// that next does: held records are settled and released, the pieces of
// large bodies written and read, expired records purged and keys counted
// by next. Held records are never cached, so settling one changes nothing
// on Redis: the settled record is cached when it is first read, and a
// record whose body is in pieces is cached without them (Redis never holds
// pieces), its replay reading them from next.
func Wrap[U any](s *FastPath, next idempotency.Store[U]) idempotency.Store[U] {
	return &fastPath[U]{Store: next, s: s, next: next}
}

// fastPath is the durable store next behind the fast path s.
type fastPath[U any] struct {
	// Store, next, settles, purges and counts (pieces are the methods
	// below, which say why); Claim is the wrapper's own.
	idempotency.Store[U]
	s    *FastPath
	next idempotency.Store[U]
}

// WritePiece implements idempotency.Store: pieces are written to the
// durable store alone. Redis never holds them: a piece is large by
// definition, and Redis's memory is for the small records that answer
// storms of retries.
func (f *fastPath[U]) WritePiece(ctx context.Context, ref idempotency.Ref, n int, p []byte) (bool, error) {
	return f.next.WritePiece(ctx, ref, n, p)
}

// ReadPiece implements idempotency.Store: a piece is read from the durable
// store, where it is kept, even for a record replayed from Redis (which
// carries the count and size of its pieces, and the CreatedAt that names
// their claim).
func (f *fastPath[U]) ReadPiece(ctx context.Context, ref idempotency.Ref, n int) ([]byte, error) {
	return f.next.ReadPiece(ctx, ref, n)
}

// Claim implements idempotency.Store.
//
// The whole claim stays within req.Wait: time spent waiting on Redis is
// taken off what the durable store may wait. Whatever Redis says or fails
// to say, only the durable store hands out a lease, so Redis can make an
// answer slower or a 202 more likely, never an operation run twice.
func (f *fastPath[U]) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Lease[U], *idempotency.Record, error) {
	return f.claim(ctx, req, f.next.Claim)
}

// claim is Claim with the durable store's claim given as next.
func (f *fastPath[U]) claim(ctx context.Context, req idempotency.ClaimRequest, next func(context.Context, idempotency.ClaimRequest) (idempotency.Lease[U], *idempotency.Record, error)) (idempotency.Lease[U], *idempotency.Record, error) {
	s := f.s
	start := time.Now()
	if !s.lookUp() {
		// Replays are rare: the durable store answers, and Redis is spared
		// a look-up that would almost always miss.
		s.cfg.Observer.Redis(resultBypassed)
		return direct(ctx, s, req, next)
	}
	if !s.breaker.closed() {
		// Redis is left alone: the durable store answers, as fast as it
		// does without Redis.
		s.cfg.Observer.Redis(resultSkipped)
		s.cfg.Observer.Fallback()
		return direct(ctx, s, req, next)
	}
	recKey, markerKey := s.KeyNames(req.Scope, req.Key)
	rec, res := s.cached(ctx, recKey)
	s.cfg.Observer.Redis(res)
	if rec != nil {
		return nil, s.counted(rec), nil
	}
	redisFailed := res == resultError || res == resultSkipped

	// Without ShedDuplicates no marker is taken: the durable store's claim
	// holds concurrent duplicates back, and nothing is released.
	var token string
	ours := false
	if s.cfg.ShedDuplicates {
		token = newToken()
		var held bool
		var err error
		rec, held, err = s.takeMarker(ctx, recKey, markerKey, token)
		// After a failed attempt the marker may still have been set (the
		// answer was lost): release it by token at the end, which is
		// harmless if not.
		ours = held || (err != nil && !errors.Is(err, errUnusableRecord))
		switch {
		case errors.Is(err, errUnusableRecord):
			// A record is there that this replica cannot use (another
			// version's format, a tag that does not verify, or expired by
			// this replica's clock): nobody holds the key on its account,
			// so the database answers, and its read-through replaces the
			// record.
		case errors.Is(err, errBreakerOpen):
			s.cfg.Observer.Redis(resultSkipped)
			redisFailed = true
		case err != nil:
			s.cfg.Observer.Redis(resultError)
			redisFailed = true
		case rec != nil:
			// The previous holder committed (cached, then released its
			// marker) between our look-up and our attempt at the marker.
			return nil, s.counted(rec), nil
		case !held:
			// Another request (on any replica) is running this key: wait
			// for its outcome on Redis, holding no database connection.
			rec, failed := s.await(ctx, recKey, markerKey, req.Wait)
			redisFailed = redisFailed || failed
			if rec != nil {
				return nil, s.counted(rec), nil
			}
			if err := ctx.Err(); err != nil {
				return nil, nil, err
			}
		}
	}
	if redisFailed {
		s.cfg.Observer.Fallback()
	}

	// The durable store decides, within what is left of the wait, but with
	// at least dbFloor: a stale marker (its holder gone, its release lost)
	// must be answered from the database, not with a 202, and a claim
	// statement needs a few milliseconds even when nothing blocks it.
	claimReq := req
	claimReq.Wait = max(req.Wait-time.Since(start), dbFloor)
	lease, rec, err := next(ctx, claimReq)
	if lease == nil {
		s.release(ctx, recKey, markerKey, token, ours, rec) // read-through
		return nil, s.counted(rec), err
	}
	return &cachedLease[U]{Lease: lease, s: s, lookedUp: true, recKey: recKey, markerKey: markerKey, token: token, ours: ours,
		cacheOnCommit: s.cfg.ShedDuplicates, fingerprint: req.Fingerprint, createdAt: start, expiresAt: start.Add(req.TTL)}, nil, nil
}

// direct claims on the durable store alone, Redis not looked up. Its lease
// is still wrapped, so that its commit counts what it turns out to be.
func direct[U any](ctx context.Context, s *FastPath, req idempotency.ClaimRequest, next func(context.Context, idempotency.ClaimRequest) (idempotency.Lease[U], *idempotency.Record, error)) (idempotency.Lease[U], *idempotency.Record, error) {
	lease, rec, err := next(ctx, req)
	if lease == nil {
		return nil, s.counted(rec), err
	}
	return &cachedLease[U]{Lease: lease, s: s}, nil, nil
}

// counted returns rec, a record the durable store answered a claim with,
// counted as a replay if there is one.
func (s *FastPath) counted(rec *idempotency.Record) *idempotency.Record {
	if rec != nil {
		s.replays.observe(true)
	}
	return rec
}

// lookUp says whether a claim goes to Redis first.
func (s *FastPath) lookUp() bool {
	return s.cfg.AlwaysLookUp || s.cfg.ShedDuplicates || s.replays.share() >= lookUpShare
}

// await polls Redis for the in-flight request's record until wait runs out
// or the holder's marker goes away. A nil record means: ask the durable
// store (the holder rolled back, Redis lost the marker, the wait ran out,
// or Redis failed, which failed reports).
func (s *FastPath) await(ctx context.Context, recKey, markerKey string, wait time.Duration) (rec *idempotency.Record, failed bool) {
	deadline := time.Now().Add(wait)
	ticker := time.NewTicker(s.cfg.Poll)
	defer ticker.Stop()
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return nil, false
		case <-ticker.C:
		}
		rec, res := s.cached(ctx, recKey)
		if rec != nil {
			s.cfg.Observer.Redis(resultHit)
			return rec, false
		}
		if res == resultError || res == resultSkipped {
			s.cfg.Observer.Redis(res)
			return nil, true
		}
		var n int64
		err := s.breaker.do(ctx, func() (err error) {
			n, err = s.rdb.Exists(ctx, markerKey).Result()
			return err
		})
		if err != nil {
			s.cfg.Observer.Redis(resultError)
			return nil, true
		}
		if n == 0 {
			// The holder caches its outcome before it releases the marker,
			// so look once more before going to the database.
			if rec, _ := s.cached(ctx, recKey); rec != nil {
				s.cfg.Observer.Redis(resultHit)
				return rec, false
			}
			return nil, false
		}
	}
	return nil, false
}

// dbFloor is the least time the durable store gets to answer a claim
// after waiting on Redis, so a whole claim takes at most Wait + dbFloor.
const dbFloor = 100 * time.Millisecond

// Results of a Redis look-up, as reported to the Observer.
const (
	resultHit      = "hit"
	resultMiss     = "miss"
	resultError    = "error"
	resultRejected = "rejected"
	resultSkipped  = "skipped"
	resultBypassed = "bypassed"
)

// cached returns the record cached under recKey, if any and not expired,
// and the look-up's result. It reports nothing itself: polling callers
// count one result per wait, not one per poll.
func (s *FastPath) cached(ctx context.Context, recKey string) (*idempotency.Record, string) {
	var raw []byte
	err := s.breaker.do(ctx, func() (err error) {
		raw, err = s.reads.Get(ctx, recKey).Bytes()
		return err
	})
	switch {
	case errors.Is(err, errBreakerOpen):
		return nil, resultSkipped
	case errors.Is(err, redis.Nil):
		return nil, resultMiss
	case err != nil:
		return nil, resultError
	}
	return s.decodeCached(recKey, raw)
}

// decodeCached reads the record cached under recKey, and what the look-up
// found.
func (s *FastPath) decodeCached(recKey string, raw []byte) (*idempotency.Record, string) {
	if len(raw) == 0 || raw[0] != recordFormat {
		return nil, resultMiss // another version's record: read through again
	}
	raw, ok := s.sealer.open(recKey, raw)
	if !ok {
		return nil, resultRejected
	}
	rec, err := decodeRecord(raw)
	switch {
	case errors.Is(err, errRecordFormat):
		return nil, resultMiss // another version's record: read through again
	case err != nil:
		return nil, resultError
	case !time.Now().Before(rec.ExpiresAt):
		return nil, resultMiss // expired: absent, as in the database
	}
	return rec, resultHit
}

// store caches rec until it expires. Failures only cost speed. A
// provisional record (a long operation's 202) is not cached: it is replaced
// by the operation's final response later, and only PostgreSQL sees that.
func (s *FastPath) store(ctx context.Context, recKey string, rec *idempotency.Record) {
	ttl := cacheTTL(rec)
	if ttl <= 0 {
		return
	}
	ctx = context.WithoutCancel(ctx)
	err := s.breaker.do(ctx, func() error { return s.rdb.Set(ctx, recKey, s.sealer.seal(recKey, encodeRecord(rec)), ttl).Err() })
	if err != nil && !errors.Is(err, errBreakerOpen) {
		s.cfg.Observer.Redis(resultError)
	}
}

// takeMarkerScript looks the record up again and, if it is still absent,
// takes the in-flight marker, atomically: one round trip where a SET NX and
// a second GET (for a holder that cached and released between our first
// look-up and the SET NX) were two, and no gap between them.
// KEYS: record, marker. ARGV: token, lease in milliseconds. Returns
// {record, 0} when the record is there, {false, 1} when the marker was
// taken, {false, 0} when another request holds it.
var takeMarkerScript = redis.NewScript(`
local rec = redis.call("GET", KEYS[1])
if rec then return {rec, 0} end
if redis.call("SET", KEYS[2], ARGV[1], "NX", "PX", ARGV[2]) then return {false, 1} end
return {false, 0}`)

// errUnusableRecord is takeMarker finding a record it cannot use; the
// script then takes no marker.
var errUnusableRecord = errors.New("redisstore: cached record unusable here")

// takeMarker runs takeMarkerScript: the record if it appeared meanwhile, or
// whether the marker is now ours; errUnusableRecord if a record is there
// that this replica cannot read or verify, or that has expired by its
// clock.
func (s *FastPath) takeMarker(ctx context.Context, recKey, markerKey, token string) (*idempotency.Record, bool, error) {
	var res []any
	err := s.breaker.do(ctx, func() (err error) {
		res, err = takeMarkerScript.Run(ctx, s.rdb, []string{recKey, markerKey}, token, s.cfg.Marker.Milliseconds()).Slice()
		return err
	})
	if err != nil {
		return nil, false, err
	}
	if len(res) != 2 {
		return nil, false, fmt.Errorf("redisstore: take marker answered %d values", len(res))
	}
	if raw, ok := res[0].(string); ok {
		if rec, _ := s.decodeCached(recKey, []byte(raw)); rec != nil {
			return rec, false, nil
		}
		return nil, false, errUnusableRecord
	}
	held, _ := res[1].(int64)
	return nil, held == 1, nil
}

// releaseScript caches a committed record and gives up the in-flight marker
// if it is still ours, in one round trip.
// KEYS: record, marker. ARGV: the encoded record, its TTL in milliseconds
// (0: cache nothing), token.
var releaseScript = redis.NewScript(`
if ARGV[2] ~= "0" then redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2]) end
if redis.call("GET", KEYS[2]) == ARGV[3] then return redis.call("DEL", KEYS[2]) end
return 0`)

// release caches rec, if there is one that may be cached, and gives up the
// in-flight marker if it may be ours: one round trip either way. It runs
// even when the request was cancelled: a marker left behind would make
// duplicates wait for nothing until its lease ran out.
func (s *FastPath) release(ctx context.Context, recKey, markerKey, token string, ours bool, rec *idempotency.Record) {
	if !ours {
		if rec != nil {
			s.store(ctx, recKey, rec)
		}
		return
	}
	var raw []byte
	var ttl int64
	if rec != nil {
		if ttl = cacheTTL(rec).Milliseconds(); ttl > 0 {
			raw = s.sealer.seal(recKey, encodeRecord(rec))
		}
	}
	ctx = context.WithoutCancel(ctx)
	err := s.breaker.do(ctx, func() error {
		return releaseScript.Run(ctx, s.rdb, []string{recKey, markerKey}, raw, ttl, token).Err()
	})
	if err != nil && !errors.Is(err, redis.Nil) && !errors.Is(err, errBreakerOpen) {
		s.cfg.Observer.Redis(resultError)
	}
}

// cacheTTL is how long rec may be cached: until it expires, and not at all
// if it is provisional (0).
func cacheTTL(rec *idempotency.Record) time.Duration {
	if idempotency.Provisional(rec.Response.Status) {
		return 0
	}
	return max(time.Until(rec.ExpiresAt), 0)
}

// cachedLease counts what its claim turned out to be (a deferred commit
// may find the key completed: a replay) and, when the claim was looked up
// on Redis, gives up the in-flight marker if it may hold one and caches the
// outcome once the durable store has committed it: its own with
// ShedDuplicates (its duplicates wait for it on Redis), or the one a
// deferred commit found already there.
type cachedLease[U any] struct {
	idempotency.Lease[U]
	s                 *FastPath
	lookedUp          bool // the claim went to Redis: cache, release
	recKey, markerKey string
	token             string
	ours              bool // the marker may be ours: release it by token
	cacheOnCommit     bool // cache the committed outcome (ShedDuplicates)
	fingerprint       idempotency.Fingerprint
	// The durable store counts the TTL from its own claim, which happened
	// after createdAt: the cached copy expires no later than the durable one.
	createdAt, expiresAt time.Time
}

func (l *cachedLease[U]) Commit(ctx context.Context, resp idempotency.Response) error {
	if err := l.Lease.Commit(ctx, resp); err != nil {
		// A deferred commit that found the key completed: a replay, and a
		// read-through.
		var taken *idempotency.TakenError
		if errors.As(err, &taken) && taken.Record != nil {
			l.s.replays.observe(true)
			l.release(ctx, taken.Record)
		} else {
			l.release(ctx, nil)
		}
		return err
	}
	l.s.replays.observe(false)
	if !l.cacheOnCommit {
		return nil
	}
	// The durable commit happened; caching it is only an optimisation. A
	// body in pieces is read under the claim that wrote it, which its
	// CreatedAt names (the lease's, a claim made at once: a claim made at
	// commit takes no pieces).
	createdAt := l.createdAt
	if resp.Pieces > 0 {
		createdAt = l.Ref().ClaimedAt
	}
	l.release(ctx, &idempotency.Record{
		Fingerprint: l.fingerprint, Response: resp, CreatedAt: createdAt, ExpiresAt: l.expiresAt,
	})
	return nil
}

func (l *cachedLease[U]) Rollback(ctx context.Context) error {
	err := l.Lease.Rollback(ctx)
	l.release(ctx, nil)
	return err
}

func (l *cachedLease[U]) release(ctx context.Context, rec *idempotency.Record) {
	if !l.lookedUp {
		return
	}
	l.s.release(ctx, l.recKey, l.markerKey, l.token, l.ours, rec)
	l.ours = false
}

func newToken() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// replayShare is a moving estimate of the share of claims that were
// replays: each claim's outcome weighs shareWeight against the estimate so
// far, so a storm of retries turns look-ups on within a handful of claims,
// and they go off again once first requests are most of the traffic again.
type replayShare struct{ bits atomic.Uint64 }

const (
	// shareWeight is what one claim's outcome weighs in the estimate.
	shareWeight = 1.0 / 32
	// lookUpShare is the share of replays from which claims are looked up
	// on Redis: below it, the look-ups of first requests would cost more
	// than the replays they take off the durable store save.
	lookUpShare = 1.0 / 8
)

func (r *replayShare) share() float64 { return math.Float64frombits(r.bits.Load()) }

func (r *replayShare) observe(replay bool) {
	x := 0.0
	if replay {
		x = 1
	}
	for {
		old := r.bits.Load()
		s := math.Float64frombits(old)
		next := math.Float64bits(s + (x-s)*shareWeight)
		// A steady run of first requests leaves the estimate at 0: no write.
		if next == old || r.bits.CompareAndSwap(old, next) {
			return
		}
	}
}
