// Command oncekey serves the Oncekey API and runs its maintenance tasks.
//
//	oncekey serve                  serve the API (PostgreSQL with DATABASE_URL, else in memory)
//	oncekey migrate                apply database migrations
//	oncekey purge [--dry-run]      delete expired idempotency keys in batches
//	oncekey keys inspect ACCOUNT KEY | keys stats | keys stuck [--older-than 10m]
//	oncekey accounts create NAME   create an account; prints its API key once
//	oncekey accounts revoke-key    revoke the API key read from standard input
//	oncekey contract-test --url URL --api-key KEY
//	                               check a deployment against the protocol and openapi.yaml
//
// This package holds only wiring: configuration from the environment,
// building the pieces, and signals. Everything testable is in internal/.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/recordcache"
	"github.com/oncekey/oncekey/idempotency/redisstore"
	"github.com/oncekey/oncekey/internal/auth"
	"github.com/oncekey/oncekey/internal/contracttest"
	"github.com/oncekey/oncekey/internal/httpapi"
	"github.com/oncekey/oncekey/internal/httpserver"
	"github.com/oncekey/oncekey/internal/jobs"
	"github.com/oncekey/oncekey/internal/metrics"
	"github.com/oncekey/oncekey/internal/payments"
	"github.com/oncekey/oncekey/internal/provider"
	"github.com/oncekey/oncekey/internal/store"
	"github.com/oncekey/oncekey/internal/store/memory"
	"github.com/oncekey/oncekey/internal/store/postgres"
	"github.com/oncekey/oncekey/internal/tracing"
)

const usage = `usage: oncekey <command>

commands:
  serve                  serve the API (PostgreSQL when DATABASE_URL is set, else in memory)
  migrate                apply database migrations (needs DATABASE_URL)
  purge [--dry-run]      delete expired idempotency keys in batches, or count them (needs DATABASE_URL)
  keys inspect ACCOUNT KEY
                         show one key's record (status, fingerprint, timestamps, stored status)
  keys stats             rows by status, table size, oldest processing key, cleanup lag
  keys stuck [--older-than 10m]
                         list keys processing for longer than that (needs DATABASE_URL)
  accounts create NAME   create an account and print its API key once (needs DATABASE_URL)
  accounts revoke-key    revoke the API key read from standard input, from the next request on
  contract-test --url URL --api-key KEY
                         run the black-box conformance suite against a deployment
                         (creates a few orders in that key's account)
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "oncekey:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	log := slog.New(slog.NewJSONHandler(stderr, nil))
	cfg, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("no command given")
	}
	switch args[0] {
	case "serve":
		return serve(ctx, cfg, log, stdout)
	case "migrate":
		return withDatabase(ctx, cfg, func(s *postgres.Store) error {
			log.Info("migrations applied")
			return nil
		})
	case "purge":
		fs := flag.NewFlagSet("purge", flag.ContinueOnError)
		fs.SetOutput(stderr)
		dryRun := fs.Bool("dry-run", false, "count the expired keys without deleting them")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		return withDatabase(ctx, cfg, func(s *postgres.Store) error {
			if *dryRun {
				n, err := s.KeyStore().CountExpired(ctx)
				if err != nil {
					return err
				}
				return json.NewEncoder(stdout).Encode(map[string]any{"dry_run": true, "would_delete": n})
			}
			n, err := s.PurgeExpired(ctx, cfg.CleanupBatch)
			if err != nil {
				return err
			}
			return json.NewEncoder(stdout).Encode(map[string]int64{"deleted": n})
		})
	case "keys":
		return keysCommand(ctx, cfg, args[1:], stdout, stderr)
	case "accounts":
		if len(args) == 2 && args[1] == "revoke-key" {
			return revokeKey(ctx, cfg, stdin, stdout)
		}
		if len(args) != 3 || args[1] != "create" {
			fmt.Fprint(stderr, usage)
			return errors.New("usage: oncekey accounts create NAME | oncekey accounts revoke-key < KEY")
		}
		return withDatabase(ctx, cfg, func(s *postgres.Store) error {
			creds, err := auth.CreateAccount(ctx, s, args[2], "")
			if err != nil {
				return err
			}
			return json.NewEncoder(stdout).Encode(creds)
		})
	case "contract-test":
		return contractTest(ctx, args[1:], stdout, stderr)
	default:
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("unknown command %q", args[0])
	}
}

// revokeKey is `oncekey accounts revoke-key`: the key comes on standard
// input, never as an argument, so it does not show in process lists or
// shell history.
func revokeKey(ctx context.Context, cfg config, stdin io.Reader, stdout io.Writer) error {
	line, err := bufio.NewReader(io.LimitReader(stdin, 4096)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("read the API key from standard input: %w", err)
	}
	key := strings.TrimSpace(line)
	if key == "" {
		return errors.New("accounts revoke-key: give the API key on standard input")
	}
	return withDatabase(ctx, cfg, func(s *postgres.Store) error {
		revoked, err := s.RevokeKey(ctx, auth.HashKey(key))
		if err != nil {
			return err
		}
		return json.NewEncoder(stdout).Encode(map[string]bool{"revoked": revoked})
	})
}

// keysCommand is `oncekey keys …`: read-only views of the keys table for
// operators. Output is JSON, one document per command.
func keysCommand(ctx context.Context, cfg config, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("usage: oncekey keys inspect ACCOUNT KEY | stats | stuck [--older-than 10m]")
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	switch args[0] {
	case "inspect":
		if len(args) != 3 {
			return errors.New("usage: oncekey keys inspect ACCOUNT KEY")
		}
		account, err := uuid.Parse(args[1])
		if err != nil {
			return fmt.Errorf("ACCOUNT %q is not an account id", args[1])
		}
		return withDatabase(ctx, cfg, func(s *postgres.Store) error {
			info, err := s.KeyStore().Inspect(ctx, auth.Scope(account), args[2])
			if err != nil {
				return err
			}
			return enc.Encode(keyInfo{Account: account.String(), KeyInfo: info})
		})
	case "stats":
		return withDatabase(ctx, cfg, func(s *postgres.Store) error {
			st, err := s.KeyStats(ctx)
			if err != nil {
				return err
			}
			return enc.Encode(map[string]any{
				"processing":                    st.Processing,
				"completed":                     st.Completed,
				"table_bytes":                   st.TableBytes,
				"oldest_processing_age_seconds": st.OldestProcessingAge.Seconds(),
				"cleanup_lag_seconds":           st.CleanupLag.Seconds(),
			})
		})
	case "stuck":
		fs := flag.NewFlagSet("keys stuck", flag.ContinueOnError)
		fs.SetOutput(stderr)
		olderThan := fs.Duration("older-than", 10*time.Minute, "list keys processing for longer than this")
		limit := fs.Int("limit", 100, "list at most this many")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		return withDatabase(ctx, cfg, func(s *postgres.Store) error {
			stuck, err := s.KeyStore().Stuck(ctx, *olderThan, *limit)
			if err != nil {
				return err
			}
			out := make([]stuckKey, 0, len(stuck))
			for _, k := range stuck {
				out = append(out, stuckKey{Account: accountOf(k.Scope), StuckKey: k})
			}
			return enc.Encode(out)
		})
	default:
		return fmt.Errorf("unknown keys command %q", args[0])
	}
}

// keyInfo is `keys inspect`'s output: the engine's view of a key, with the
// account its scope is.
type keyInfo struct {
	Account string `json:"account_id"`
	pgstore.KeyInfo
	Scope struct{} `json:"scope,omitzero"` // the account, above
}

// stuckKey is one line of `keys stuck`.
type stuckKey struct {
	Account string `json:"account_id"`
	pgstore.StuckKey
	Scope struct{} `json:"scope,omitzero"` // the account, above
}

// accountOf is the account id whose keys' scope is scope.
func accountOf(scope string) string {
	id, err := uuid.FromBytes([]byte(scope))
	if err != nil {
		return fmt.Sprintf("%x", scope)
	}
	return id.String()
}

// contractTest runs internal/contracttest against --url and prints one line
// per check and a closing "N passed, M failed" line.
func contractTest(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("contract-test", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "", "base URL of the deployment, e.g. http://localhost:8080")
	apiKey := fs.String("api-key", "", "API key of a test account")
	if err := fs.Parse(args); err != nil {
		return err
	}
	results, err := contracttest.Run(ctx, contracttest.Config{BaseURL: *url, APIKey: *apiKey})
	if err != nil {
		return err
	}
	failed := 0
	for _, r := range results {
		if r.Err != nil {
			failed++
			fmt.Fprintf(stdout, "FAIL %s\n     %s\n", r.Name, strings.ReplaceAll(r.Err.Error(), "\n", "\n     "))
			continue
		}
		fmt.Fprintf(stdout, "ok   %s\n", r.Name)
	}
	fmt.Fprintf(stdout, "contract: %d passed, %d failed\n", len(results)-failed, failed)
	if failed > 0 {
		return fmt.Errorf("%d contract checks failed", failed)
	}
	return nil
}

// withDatabase opens the migrated database of DATABASE_URL and runs fn.
func withDatabase(ctx context.Context, cfg config, fn func(*postgres.Store) error) error {
	if cfg.DatabaseURL == "" {
		return errors.New("DATABASE_URL is not set")
	}
	pool, err := openDatabase(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	return fn(postgres.New(pool, nil))
}

// openDatabase connects and migrates, so every command works on a fresh
// database; the pool is closed again if migrating fails.
func openDatabase(ctx context.Context, url string, opts ...postgres.Option) (*pgxpool.Pool, error) {
	pool, err := postgres.Open(ctx, url, opts...)
	if err != nil {
		return nil, err
	}
	if err := postgres.Migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

func serve(ctx context.Context, cfg config, log *slog.Logger, stdout io.Writer) error {
	shutdownTracing, err := tracing.Setup(cfg.Tracing, stdout)
	if err != nil {
		return err
	}
	defer func() { _ = shutdownTracing(context.WithoutCancel(ctx)) }()
	var dbOpts []postgres.Option
	if cfg.Tracing != tracing.Off {
		dbOpts = append(dbOpts, postgres.WithTracing())
	}

	m := metrics.New()
	be, err := openBackend(ctx, cfg, log, stdout, dbOpts)
	if err != nil {
		return err
	}
	defer be.close()
	if be.pool != nil {
		m.RegisterPool(be.pool)
	}
	m.RegisterStore(be.Backend)
	keys, writeKeys := be.Keys(), be.WriteKeys()
	if cfg.RedisURL != "" {
		rdb, err := redisstore.NewClient(cfg.RedisURL)
		if err != nil {
			return err
		}
		defer rdb.Close()
		// No ping: Redis being down at start only costs speed, and the
		// client reconnects by itself when it comes back.
		fast := redisstore.New(rdb, redisstore.Config{Prefix: "oncekey:", Observer: m})
		keys, writeKeys = redisstore.Wrap(fast, keys), redisstore.Wrap(fast, writeKeys)
		log.Info("idempotency fast path: Redis")
	}
	if cfg.RecordCacheSize > 0 {
		// In front of Redis too: a replay of a key this replica has seen
		// costs no round trip at all.
		cache, err := recordcache.New(cfg.RecordCacheSize, m)
		if err != nil {
			return err
		}
		keys, writeKeys = recordcache.Wrap(cache, keys), recordcache.Wrap(cache, writeKeys)
	}
	pay, err := startPayments(ctx, cfg, be, log)
	if err != nil {
		return err
	}
	defer pay.stop()
	handler, err := httpapi.New(httpapi.Config{
		Backend:   be.Backend,
		Keys:      keys,
		WriteKeys: writeKeys,
		Payments:  pay.svc,
		// Looked-up keys are trusted for ONCEKEY_API_KEY_CACHE_TTL: a round
		// trip saved on every request, at the price of that revocation delay
		// on other replicas.
		Auth:           auth.NewCache(be.Backend, auth.DefaultCacheSize, cfg.APIKeyCacheTTL),
		TTL:            cfg.TTL,
		Wait:           cfg.Wait,
		MaxBodyBytes:   cfg.MaxBodyBytes,
		RequestTimeout: cfg.RequestTimeout,
		Logger:         log,
		Metrics:        m,
		Tracing:        cfg.Tracing != tracing.Off,
	})
	if err != nil {
		return err
	}
	if cfg.PprofAddr != "" {
		stopPprof, err := servePprof(cfg.PprofAddr, log)
		if err != nil {
			return err
		}
		defer stopPprof()
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return err
	}
	cleanupCtx, stopCleanup := context.WithCancel(ctx)
	defer stopCleanup()
	go idempotency.Cleanup{Purger: be.Backend, Interval: cfg.CleanupInterval, Batch: cfg.CleanupBatch, Logger: log, Observer: m}.Run(cleanupCtx)

	log.Info("listening", "addr", ln.Addr().String())
	// SIGTERM: stop accepting, close idle and stalled connections at once,
	// let running requests finish (and store their responses) within the
	// deadline.
	return httpserver.Serve(ctx, ln, httpserver.Config{
		Handler:         handler,
		MaxBodyBytes:    cfg.MaxBodyBytes, // httpapi's limit too, so httpapi answers 413
		ShutdownTimeout: cfg.ShutdownTimeout,
		MaxConns:        cfg.MaxConns,
		MaxInFlight:     cfg.MaxInFlight,
		Logger:          log,
	})
}

// backend is the store serve runs on, with what it holds open.
type backend struct {
	store.Backend
	pool    *pgxpool.Pool // nil in memory
	local   *memory.Store // nil on PostgreSQL
	charges *jobs.Runner  // nil in memory
	close   func()
}

// openBackend opens PostgreSQL when DATABASE_URL is set (migrating first),
// and the in-memory store with a demo account otherwise.
func openBackend(ctx context.Context, cfg config, log *slog.Logger, stdout io.Writer, dbOpts []postgres.Option) (backend, error) {
	if cfg.DatabaseURL == "" {
		mem := memory.New()
		creds, err := auth.CreateAccount(ctx, mem, "demo", cfg.DemoAPIKey)
		if err != nil {
			return backend{}, err
		}
		log.Warn("store: in memory (set DATABASE_URL for PostgreSQL); data is lost on exit")
		fmt.Fprintf(stdout, "demo account %s, API key: %s\n", creds.AccountID, creds.APIKey)
		return backend{Backend: mem, local: mem, close: func() {}}, nil
	}
	pool, err := openDatabase(ctx, cfg.DatabaseURL, dbOpts...)
	if err != nil {
		return backend{}, err
	}
	runner, err := jobs.New(pool, jobs.Config{Policy: cfg.PaymentPolicy, Workers: cfg.PaymentWorkers, Logger: log.With("component", "river")})
	if err != nil {
		pool.Close()
		return backend{}, err
	}
	log.Info("store: PostgreSQL")
	return backend{Backend: postgres.New(pool, runner), pool: pool, charges: runner, close: pool.Close}, nil
}

// paymentsRuntime is the payment service with its worker and provider.
type paymentsRuntime struct {
	svc  *payments.Service
	stop func()
}

// startPayments builds the payment service and starts its worker: River on
// PostgreSQL, the in-process worker in memory. The provider is
// ONCEKEY_PROVIDER_URL or, without one, the sandbox provider in-process (so
// the in-memory default works end to end). stop lets attempts under way
// finish, for up to ONCEKEY_SHUTDOWN_TIMEOUT.
func startPayments(ctx context.Context, cfg config, be backend, log *slog.Logger) (paymentsRuntime, error) {
	var stops []func(context.Context)
	stopAll := func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
		defer cancel()
		for _, stop := range slices.Backward(stops) {
			stop(sctx)
		}
	}
	providerURL := cfg.ProviderURL
	if providerURL == "" {
		sandbox := provider.NewServer(provider.NewMemoryStore(), cfg.ProviderFaults, log.With("component", "sandbox-provider"))
		url, stop, err := provider.Listen(ctx, "127.0.0.1:0", sandbox, log)
		if err != nil {
			return paymentsRuntime{}, fmt.Errorf("start the sandbox provider: %w", err)
		}
		stops = append(stops, func(ctx context.Context) { _ = stop(ctx) })
		providerURL = url
		log.Warn("payments: sandbox provider in-process (set ONCEKEY_PROVIDER_URL for a real one)", "url", url)
	}
	client := provider.NewClient(providerURL, &http.Client{Timeout: cfg.ProviderTimeout})
	pcfg := payments.Config{Repo: be.Backend, Provider: client, Render: httpapi.PaymentOutcome}

	if mem := be.local; mem != nil {
		svc := payments.NewService(pcfg)
		wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan struct{})
		go func() {
			defer close(done)
			payments.RunLocal(wctx, mem, svc, cfg.PaymentPolicy, cfg.PaymentWorkers, log)
		}()
		stops = append(stops, func(sctx context.Context) {
			cancel()
			select {
			case <-done:
			case <-sctx.Done():
			}
		})
		return paymentsRuntime{svc: svc, stop: stopAll}, nil
	}

	runner := be.charges
	svc := payments.NewService(pcfg)
	if err := runner.Start(context.WithoutCancel(ctx), svc); err != nil {
		stopAll()
		return paymentsRuntime{}, fmt.Errorf("start the payment worker: %w", err)
	}
	stops = append(stops, func(sctx context.Context) {
		if err := runner.Stop(sctx); err != nil {
			log.Warn("payments: worker stop", "err", err)
		}
	})
	return paymentsRuntime{svc: svc, stop: stopAll}, nil
}

// servePprof serves Go's profiling endpoints (/debug/pprof/) on addr, a
// listener of their own: they reveal internals and cost CPU while they
// profile, so they are off by default and never on the API's address.
func servePprof(addr string, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("ONCEKEY_PPROF_ADDR: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	log.Warn("profiling endpoints on", "addr", ln.Addr().String())
	return func() { _ = srv.Close() }, nil
}
