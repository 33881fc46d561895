package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/recordcache"
	"github.com/oncekey/oncekey/idempotency/redisstore"
	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/servicetest"
	"github.com/oncekey/oncekey/internal/service/store"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
)

type options struct {
	duration              time.Duration
	clients               []int
	rounds                int
	scaleKeys             int
	expiredKeys           int
	soak                  time.Duration
	adminURL, redisURL    string
	markdown, json, chart string
	modes                 []string // empty: all
	cpuProfile            string
	costs                 bool
	proxy                 bool
	large                 bool
}

// Modes, in the order they are measured at each concurrency.
const (
	modeBaseline = "baseline"
	// modeBare is the floor under the baseline: POST /orders as a user
	// would write it by hand (bareHandler), with none of the service
	// around the INSERT. The baseline is the service on a key store that
	// keeps nothing (servicetest.KeepNothing), so first ÷ baseline is what the key
	// costs in PostgreSQL (the claim, the key row, the stored response),
	// baseline ÷ bare what the service costs (authentication, validation,
	// metrics, logging, the order service, and the engine's work in
	// process: fingerprint, recorded response), and first ÷ bare what a
	// user pays for Oncekey over the endpoint they would otherwise write.
	modeBare        = "bare"
	modeFirst       = "first"
	modeReplay      = "replay"
	modeReplayDB    = "replay-db"
	modeFirstRedis  = "first+redis"
	modeReplayRedis = "replay+redis"
)

// poolMaxConns is the size of the servers' pool, and of bare's own, so
// that neither waits for connections more than the other.
const poolMaxConns = 40

// bench is what the phases share: the database, the servers and the client.
type bench struct {
	opts    options
	log     *slog.Logger
	dbURL   string
	pool    *pgxpool.Pool
	store   *postgres.Store
	creds   auth.Credentials
	client  *http.Client
	targets map[string]string // mode → server URL
	modes   []string
	// counters count what the servers send to PostgreSQL and Redis.
	counters *counters
	// barePool is bare's own pool, closed once the phases that measure
	// bare are over.
	barePool *pgxpool.Pool
}

// run sets everything up, measures, reports, and returns how many targets
// were missed.
func run(ctx context.Context, opts options, stdout io.Writer, log *slog.Logger) (int, error) {
	dbURL, drop, err := createDatabase(ctx, opts.adminURL)
	if err != nil {
		return 0, err
	}
	defer drop()
	counters := &counters{}
	pool, err := postgres.Open(ctx, fmt.Sprintf("%s&pool_max_conns=%d", dbURL, poolMaxConns), postgres.WithQueryTracer(counters))
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool); err != nil {
		return 0, err
	}
	store := postgres.New(pool, nil)
	creds, err := auth.CreateAccount(ctx, store, "bench", "")
	if err != nil {
		return 0, err
	}
	b := &bench{opts: opts, log: log, dbURL: dbURL, pool: pool, store: store, creds: creds, targets: map[string]string{}, counters: counters,
		client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 0}}}
	stop, err := b.startServers(ctx)
	defer stop()
	if err != nil {
		return 0, err
	}

	rounds, err := b.mainRounds(ctx)
	if err != nil {
		return 0, err
	}
	rep := newReport(rounds, opts)
	if opts.costs {
		if rep.costs, err = b.costPhase(ctx); err != nil {
			return 0, err
		}
	}
	// No later phase measures bare. Its connections (as many as the
	// servers' pool) would otherwise stay open beside the servers' and
	// the memory phase's `oncekey serve`, near PostgreSQL's default
	// max_connections of 100.
	b.barePool.Close()
	if opts.proxy {
		if rep.proxy, err = b.proxyPhase(ctx); err != nil {
			return 0, fmt.Errorf("proxy phase: %w", err)
		}
	}
	if opts.scaleKeys > 0 {
		if rep.scale, err = b.scalePhase(ctx); err != nil {
			return 0, fmt.Errorf("scale phase: %w", err)
		}
	}
	if opts.expiredKeys > 0 {
		if rep.cleanup, err = b.cleanupPhase(ctx); err != nil {
			return 0, fmt.Errorf("cleanup phase: %w", err)
		}
	}
	if opts.soak > 0 {
		if rep.soak, err = b.soakPhase(ctx); err != nil {
			return 0, fmt.Errorf("memory phase: %w", err)
		}
	}
	// Last: each of its first requests stores megabytes in the key
	// table's pieces and the WAL, which no earlier phase should measure
	// beside.
	if opts.large {
		if rep.large, err = b.largePhase(ctx); err != nil {
			return 0, fmt.Errorf("large-body phase: %w", err)
		}
	}
	rep.judge()
	if err := rep.write(opts); err != nil {
		return 0, err
	}
	return rep.printRatios(stdout), nil
}

// startServers starts one in-process server per way of wiring the store
// that a mode needs, and returns what stops them all.
func (b *bench) startServers(ctx context.Context) (func(), error) {
	var stops []func()
	stopAll := func() {
		for _, stop := range slices.Backward(stops) {
			stop()
		}
	}
	quiet := slog.New(slog.DiscardHandler)
	serve := func(keys keyStores) (string, error) {
		h, err := httpapi.New(httpapi.Config{
			Backend: b.store, Keys: keys.tx, DeferredKeys: keys.writes,
			// As serve wires it.
			Auth:   auth.NewCache(b.store, auth.DefaultCacheSize, auth.DefaultCacheTTL),
			Logger: quiet,
		})
		if err != nil {
			return "", err
		}
		return listen(h, &stops)
	}
	withCache := func(keys keyStores) keyStores {
		cache, err := recordcache.New(recordcache.DefaultSize, nil)
		if err != nil {
			panic(err) // only for a size below 1
		}
		return keyStores{recordcache.Wrap(cache, keys.tx), recordcache.Wrap(cache, keys.writes)}
	}
	backend := keyStores{b.store.Keys(), b.store.DeferredKeys()}
	var err error
	if b.targets[modeBaseline], err = serve(keyStores{backend.tx, servicetest.KeepNothing(b.store.CreateOrder)}); err != nil {
		return stopAll, err
	}
	// As serve wires it: the in-process record cache in front.
	if b.targets[modeFirst], err = serve(withCache(backend)); err != nil {
		return stopAll, err
	}
	b.targets[modeReplay] = b.targets[modeFirst]
	// A replica that has not seen the key: no record cache, so every replay
	// is answered by PostgreSQL.
	if b.targets[modeReplayDB], err = serve(backend); err != nil {
		return stopAll, err
	}
	if b.targets[modeBare], err = b.startBare(ctx, &stops); err != nil {
		return stopAll, err
	}
	b.modes = []string{modeBaseline, modeBare, modeFirst, modeReplay, modeReplayDB}
	if b.opts.redisURL != "" {
		rdb, err := redisstore.NewClient(b.opts.redisURL)
		if err != nil {
			return stopAll, err
		}
		stops = append(stops, func() { _ = rdb.Close() })
		rdb.AddHook(redisHook{b.counters})
		if err := rdb.Ping(ctx).Err(); err != nil {
			return stopAll, fmt.Errorf("Redis at %s: %w (pass -redis-url= to leave the Redis modes out)", b.opts.redisURL, err)
		}
		fastPath := redisstore.New(rdb, redisstore.Config{Prefix: "oncekey:"})
		stops = append(stops, func() { flushBench(ctx, rdb, fastPath, b.creds.AccountID) })
		// First requests as serve wires it (the record cache in front of
		// Redis); replays on a replica that has not seen the key, so Redis
		// answers them.
		fast := keyStores{redisstore.Wrap(fastPath, backend.tx), redisstore.Wrap(fastPath, backend.writes)}
		if b.targets[modeFirstRedis], err = serve(withCache(fast)); err != nil {
			return stopAll, err
		}
		if b.targets[modeReplayRedis], err = serve(fast); err != nil {
			return stopAll, err
		}
		b.modes = append(b.modes, modeFirstRedis, modeReplayRedis)
	}
	if len(b.opts.modes) > 0 {
		// A misspelt mode would otherwise be measured as nothing at all.
		for _, m := range b.opts.modes {
			if !slices.Contains(b.modes, m) {
				return stopAll, fmt.Errorf("-modes: %q is not one this run can measure (%s)", m, strings.Join(b.modes, ", "))
			}
		}
		b.modes = slices.DeleteFunc(b.modes, func(m string) bool { return !slices.Contains(b.opts.modes, m) })
	}
	return stopAll, nil
}

// listen serves h on a loopback port of its own, adds what stops it to
// stops, and returns its URL.
func listen(h http.Handler, stops *[]func()) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	*stops = append(*stops, func() { _ = srv.Close() })
	return "http://" + ln.Addr().String(), nil
}

// mainRounds measures every mode at every concurrency, round after round.
func (b *bench) mainRounds(ctx context.Context) ([][]result, error) {
	if b.opts.cpuProfile != "" {
		f, err := os.Create(b.opts.cpuProfile)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return nil, err
		}
		defer pprof.StopCPUProfile()
	}
	var rounds [][]result
	for round := range b.opts.rounds {
		var results []result
		for _, n := range b.opts.clients {
			rs, err := b.measureModes(ctx, b.modes, n, round)
			if err != nil {
				return nil, err
			}
			results = append(results, rs...)
		}
		rounds = append(rounds, results)
	}
	return rounds, nil
}

// measureModes measures modes one after the other at n clients.
func (b *bench) measureModes(ctx context.Context, modes []string, n, round int) ([]result, error) {
	var results []result
	for _, mode := range modes {
		r, err := measure(ctx, b.client, b.targets[mode], b.creds.APIKey, mode, n, b.opts.duration)
		if err != nil {
			return nil, fmt.Errorf("%s at %d clients: %w", mode, n, err)
		}
		r.Round = round + 1
		b.log.Info("measured", "round", r.Round, "mode", mode, "clients", n, "rps", fmt.Sprintf("%.0f", r.RPS), "p99_ms", fmt.Sprintf("%.2f", r.P99Ms))
		results = append(results, r)
	}
	return results, nil
}

// createDatabase makes the benchmark's own database and returns a function
// that drops it.
func createDatabase(ctx context.Context, adminURL string) (string, func(), error) {
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return "", nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "oncekey_bench_" + hex.EncodeToString(b[:])
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		admin.Close(ctx)
		return "", nil, fmt.Errorf("create database: %w", err)
	}
	u, err := url.Parse(adminURL)
	if err != nil {
		admin.Close(ctx)
		return "", nil, err
	}
	u.Path = "/" + name
	q := u.Query()
	q.Set("sslmode", "disable")
	u.RawQuery = q.Encode()
	return u.String(), func() {
		_, _ = admin.Exec(context.WithoutCancel(ctx), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		admin.Close(context.WithoutCancel(ctx))
	}, nil
}

// keyStores are the key stores a server is built with.
type keyStores struct {
	tx     idempotency.Store[store.Tx]
	writes idempotency.Store[store.Deferred]
}

// flushBench removes what the Redis modes cached: the keys of the
// benchmark's account, which carry its scope in their hash tag.
func flushBench(ctx context.Context, rdb redis.UniversalClient, fast *redisstore.FastPath, account uuid.UUID) {
	record, _ := fast.KeyNames(auth.Scope(account), "")
	prefix := record[:strings.Index(record, "}")+1]
	iter := rdb.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	for iter.Next(ctx) {
		_ = rdb.Del(ctx, iter.Val()).Err()
	}
}
