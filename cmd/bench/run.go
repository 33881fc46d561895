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
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/internal/auth"
	"github.com/oncekey/oncekey/internal/httpapi"
	"github.com/oncekey/oncekey/internal/idempotency"
	"github.com/oncekey/oncekey/internal/ledger"
	"github.com/oncekey/oncekey/internal/orders"
	"github.com/oncekey/oncekey/internal/store/postgres"
	"github.com/oncekey/oncekey/internal/store/recordcache"
	"github.com/oncekey/oncekey/internal/store/rediscache"
)

type options struct {
	duration              time.Duration
	clients               []int
	adminURL, redisURL    string
	markdown, json, chart string
	modes                 []string // empty: all
	cpuProfile            string
}

// Modes, in the order they are measured at each concurrency.
const (
	modeBaseline    = "baseline"
	modeFirst       = "first"
	modeReplay      = "replay"
	modeReplayDB    = "replay-db"
	modeFirstRedis  = "first+redis"
	modeReplayRedis = "replay+redis"
)

// run sets everything up, measures, reports, and returns how many targets
// were missed.
func run(ctx context.Context, opts options, stdout io.Writer, log *slog.Logger) (int, error) {
	dbURL, drop, err := createDatabase(ctx, opts.adminURL)
	if err != nil {
		return 0, err
	}
	defer drop()
	pool, err := postgres.Open(ctx, dbURL+"&pool_max_conns=40")
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool); err != nil {
		return 0, err
	}
	store := postgres.New(pool)
	creds, err := auth.CreateAccount(ctx, store, "bench", "")
	if err != nil {
		return 0, err
	}
	quiet := slog.New(slog.DiscardHandler)
	serve := func(keys idempotency.Store, without bool) (string, func(), error) {
		h, err := httpapi.New(httpapi.Config{
			Orders: orders.NewService(store), Ledger: ledger.NewService(store),
			// As serve wires it.
			Auth:        auth.NewCache(store, auth.DefaultCacheSize, auth.DefaultCacheTTL),
			Idempotency: keys, WithoutIdempotency: without, Logger: quiet,
		})
		if err != nil {
			return "", nil, err
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", nil, err
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		return "http://" + ln.Addr().String(), func() { _ = srv.Close() }, nil
	}
	targets := map[string]string{}
	baseURL, stopBase, err := serve(store, true)
	if err != nil {
		return 0, err
	}
	defer stopBase()
	targets[modeBaseline] = baseURL
	// As serve wires it: the in-process record cache in front.
	cached, err := recordcache.New(store, recordcache.DefaultSize, nil)
	if err != nil {
		return 0, err
	}
	pgURL, stopPG, err := serve(cached, false)
	if err != nil {
		return 0, err
	}
	defer stopPG()
	targets[modeFirst], targets[modeReplay] = pgURL, pgURL
	// A replica that has not seen the key: no record cache, so every replay
	// is answered by PostgreSQL.
	dbURL, stopDB, err := serve(store, false)
	if err != nil {
		return 0, err
	}
	defer stopDB()
	targets[modeReplayDB] = dbURL
	modes := []string{modeBaseline, modeFirst, modeReplay, modeReplayDB}
	if opts.redisURL != "" {
		rdb, err := rediscache.NewClient(opts.redisURL)
		if err != nil {
			return 0, err
		}
		defer rdb.Close()
		if err := rdb.Ping(ctx).Err(); err != nil {
			return 0, fmt.Errorf("Redis at %s: %w (pass -redis-url= to leave the Redis modes out)", opts.redisURL, err)
		}
		// First requests as serve wires it (the record cache in front of
		// Redis); replays on a replica that has not seen the key, so Redis
		// answers them.
		fast := rediscache.New(store, rdb, rediscache.Config{})
		cachedFast, err := recordcache.New(fast, recordcache.DefaultSize, nil)
		if err != nil {
			return 0, err
		}
		firstURL, stopFirst, err := serve(cachedFast, false)
		if err != nil {
			return 0, err
		}
		defer stopFirst()
		replayURL, stopReplay, err := serve(fast, false)
		if err != nil {
			return 0, err
		}
		defer stopReplay()
		targets[modeFirstRedis], targets[modeReplayRedis] = firstURL, replayURL
		modes = append(modes, modeFirstRedis, modeReplayRedis)
		defer flushBench(ctx, rdb, creds.AccountID.String())
	}

	if len(opts.modes) > 0 {
		modes = slices.DeleteFunc(modes, func(m string) bool { return !slices.Contains(opts.modes, m) })
	}
	if opts.cpuProfile != "" {
		f, err := os.Create(opts.cpuProfile)
		if err != nil {
			return 0, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return 0, err
		}
		defer pprof.StopCPUProfile()
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 0}}
	var results []result
	for _, n := range opts.clients {
		for _, mode := range modes {
			r, err := measure(ctx, client, targets[mode], creds.APIKey, mode, n, opts.duration)
			if err != nil {
				return 0, fmt.Errorf("%s at %d clients: %w", mode, n, err)
			}
			log.Info("measured", "mode", mode, "clients", n, "rps", fmt.Sprintf("%.0f", r.RPS), "p99_ms", fmt.Sprintf("%.2f", r.P99Ms))
			results = append(results, r)
		}
	}
	report := newReport(results, opts)
	if err := report.write(opts); err != nil {
		return 0, err
	}
	return report.printRatios(stdout), nil
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

// flushBench removes what the Redis modes cached: the keys of the
// benchmark's account, which carry it in their hash tag.
func flushBench(ctx context.Context, rdb *redis.Client, account string) {
	iter := rdb.Scan(ctx, 0, "oncekey:{"+account+"}:*", 1000).Iterator()
	for iter.Next(ctx) {
		_ = rdb.Del(ctx, iter.Val()).Err()
	}
}
