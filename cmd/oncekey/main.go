// Command oncekey serves the Oncekey API and runs its maintenance tasks;
// `oncekey --help` lists them, and docs/cli.md has every command's help.
//
// This package holds only wiring: the command line (cli.go), building the
// pieces, and signals. Everything testable is in internal/.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
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
	"github.com/oncekey/oncekey/idempotency/pgstore/keyadmin"
	"github.com/oncekey/oncekey/idempotency/recordcache"
	"github.com/oncekey/oncekey/idempotency/redisstore"
	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/httpserver"
	"github.com/oncekey/oncekey/internal/service/jobs"
	"github.com/oncekey/oncekey/internal/service/metrics"
	"github.com/oncekey/oncekey/internal/service/payments"
	"github.com/oncekey/oncekey/internal/service/provider"
	"github.com/oncekey/oncekey/internal/service/store"
	"github.com/oncekey/oncekey/internal/service/store/memory"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
	"github.com/oncekey/oncekey/internal/service/tracing"
)

func main() {
	os.Exit(runMain(os.Args[1:]))
}

// runMain runs the command of args in this process, stopped by SIGINT and
// SIGTERM, and returns its exit code (see exitCode).
func runMain(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, args, os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "oncekey:", err)
	}
	return exitCode(err)
}

// exitCode is the exit code of a command that returned err: 0, 2 for a
// command line naming no command (after the usage), the code of an
// exitError, 1 for every other failure.
func exitCode(err error) int {
	var coded exitError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errNoCommand):
		return 2
	case errors.As(err, &coded):
		return coded.code
	}
	return 1
}

// exitError is a failure whose exit code is not 1: one a script must be
// able to tell from the others (conformance's 2, checks that could not
// run).
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string { return e.err.Error() }
func (e exitError) Unwrap() error { return e.err }

func (p *purgeCmd) Run(e env) error {
	if err := p.require(); err != nil {
		return err
	}
	if p.Batch < 1 || p.Batch > 100_000 {
		return fmt.Errorf("--cleanup-batch (ONCEKEY_CLEANUP_BATCH) is %d: want 1 to 100000", p.Batch)
	}
	return withKeys(e.ctx, p.databaseFlags, func(s *pgstore.Store) error {
		if p.DryRun {
			n, err := keyadmin.CountExpired(e.ctx, s)
			if err != nil {
				return err
			}
			return json.NewEncoder(e.stdout).Encode(map[string]any{"dry_run": true, "would_delete": n})
		}
		n, err := s.PurgeExpired(e.ctx, p.Batch)
		if err != nil {
			return err
		}
		return json.NewEncoder(e.stdout).Encode(map[string]int64{"deleted": n})
	})
}

func (a *accountsCreateCmd) Run(e env) error {
	if err := a.require(); err != nil {
		return err
	}
	return withDatabase(e.ctx, a.databaseFlags, func(s *postgres.Store) error {
		accounts := s.UniqueNames()
		if a.AllowDuplicateName {
			accounts = s
		}
		creds, err := auth.CreateAccount(e.ctx, accounts, a.Name, "")
		if taken := (*postgres.NameTakenError)(nil); errors.As(err, &taken) {
			return fmt.Errorf("%s; pass --allow-duplicate-name to create another", taken)
		}
		if err != nil {
			return err
		}
		return json.NewEncoder(e.stdout).Encode(creds)
	})
}

// Run is `oncekey accounts revoke-key`: the key comes on standard input,
// never as an argument, so it does not show in process lists or shell
// history.
func (a *accountsRevokeCmd) Run(e env) error {
	if err := a.require(); err != nil {
		return err
	}
	line, err := bufio.NewReader(io.LimitReader(e.stdin, 4096)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("read the API key from standard input: %w", err)
	}
	key := strings.TrimSpace(line)
	if key == "" {
		return errors.New("accounts revoke-key: give the API key on standard input")
	}
	return withDatabase(e.ctx, a.databaseFlags, func(s *postgres.Store) error {
		revoked, err := s.RevokeKey(e.ctx, auth.HashKey(key))
		if err != nil {
			return err
		}
		return json.NewEncoder(e.stdout).Encode(map[string]bool{"revoked": revoked})
	})
}

// indented writes JSON for operators to read.
func indented(w io.Writer) *json.Encoder {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc
}

func (k *keysInspectCmd) Run(e env) error {
	if err := k.require(); err != nil {
		return err
	}
	if err := k.check(); err != nil {
		return err
	}
	return withKeys(e.ctx, k.databaseFlags, func(s *pgstore.Store) error {
		stored, err := k.storedScope(e.ctx, s)
		if err != nil {
			return err
		}
		info, err := keyadmin.Inspect(e.ctx, s, stored.scope, k.Key)
		if err != nil {
			return err
		}
		if k.Gateway {
			return indented(e.stdout).Encode(gatewayKeyInfo{Namespace: stored.namespace, Scope: k.Account, KeyInfo: info})
		}
		return indented(e.stdout).Encode(keyInfo{Account: k.Account, KeyInfo: info})
	})
}

func (k *keysStatsCmd) Run(e env) error {
	if err := k.require(); err != nil {
		return err
	}
	return withKeys(e.ctx, k.databaseFlags, func(s *pgstore.Store) error {
		st, err := s.KeyStats(e.ctx)
		if err != nil {
			return err
		}
		return indented(e.stdout).Encode(map[string]any{
			"processing":                    st.Processing,
			"completed":                     st.Completed,
			"table_bytes":                   st.TableBytes,
			"pieces_bytes":                  st.PiecesBytes,
			"oldest_processing_age_seconds": st.OldestProcessingAge.Seconds(),
			"cleanup_lag_seconds":           st.CleanupLag.Seconds(),
			"held":                          st.Held,
			"unknown":                       st.Unknown,
		})
	})
}

func (k *keysStuckCmd) Run(e env) error {
	if err := k.require(); err != nil {
		return err
	}
	return withKeys(e.ctx, k.databaseFlags, func(s *pgstore.Store) error {
		stuck, err := keyadmin.Stuck(e.ctx, s, k.OlderThan, k.Limit)
		if err != nil {
			return err
		}
		out := make([]stuckKey, 0, len(stuck))
		for _, key := range stuck {
			out = append(out, stuckKey{Account: accountOf(key.Scope), StuckKey: key})
		}
		return indented(e.stdout).Encode(out)
	})
}

// Run is `oncekey payments stuck`: what the metrics
// oncekey_payments_oldest_pending_age_seconds and
// oncekey_payment_tasks_abandoned_total count, by name.
func (p *paymentsStuckCmd) Run(e env) error {
	if err := p.require(); err != nil {
		return err
	}
	pool, err := openDatabase(e.ctx, p.DatabaseURL, p.keys())
	if err != nil {
		return err
	}
	defer pool.Close()
	runner, err := jobs.New(pool, jobs.Config{Logger: e.log})
	if err != nil {
		return err
	}
	pending, refunds, err := postgres.NewKeys(pool, runner, p.keys()).PendingOlderThan(e.ctx, p.OlderThan, p.Limit)
	if err != nil {
		return err
	}
	given, err := runner.GivenUp(e.ctx, p.Limit)
	if err != nil {
		return err
	}
	out := stuckPayments{Payments: []stuckPayment{}, Refunds: []stuckRefund{}, GivenUp: []givenUpJob{}}
	now := time.Now()
	for _, pm := range pending {
		out.Payments = append(out.Payments, stuckPayment{Account: pm.AccountID.String(), Payment: pm.ID.String(), Order: pm.OrderID.String(),
			CreatedAt: pm.CreatedAt, AgeSeconds: now.Sub(pm.CreatedAt).Seconds()})
	}
	for _, r := range refunds {
		out.Refunds = append(out.Refunds, stuckRefund{Account: r.AccountID.String(), Refund: r.ID.String(), Payment: r.PaymentID.String(),
			CreatedAt: r.CreatedAt, AgeSeconds: now.Sub(r.CreatedAt).Seconds()})
	}
	for _, g := range given {
		job := givenUpJob{Kind: g.Task.Kind(), State: g.State, Attempts: g.Attempts, FinalizedAt: g.FinalizedAt, Error: g.Error,
			Account: g.Task.Charge.AccountID.String(), Payment: g.Task.Charge.PaymentID.String()}
		if g.Task.Kind() == "refund" {
			job.Account, job.Payment, job.Refund = g.Task.Refund.AccountID.String(), "", g.Task.Refund.RefundID.String()
		}
		out.GivenUp = append(out.GivenUp, job)
	}
	return indented(e.stdout).Encode(out)
}

// stuckPayments is `payments stuck`'s output.
type stuckPayments struct {
	Payments []stuckPayment `json:"pending_payments"`
	Refunds  []stuckRefund  `json:"pending_refunds"`
	GivenUp  []givenUpJob   `json:"jobs_given_up"`
}

type stuckPayment struct {
	Account    string    `json:"account_id"`
	Payment    string    `json:"payment_id"`
	Order      string    `json:"order_id"`
	CreatedAt  time.Time `json:"created_at"`
	AgeSeconds float64   `json:"age_seconds"`
}

type stuckRefund struct {
	Account    string    `json:"account_id"`
	Refund     string    `json:"refund_id"`
	Payment    string    `json:"payment_id"`
	CreatedAt  time.Time `json:"created_at"`
	AgeSeconds float64   `json:"age_seconds"`
}

type givenUpJob struct {
	Kind        string    `json:"kind"`
	Account     string    `json:"account_id"`
	Payment     string    `json:"payment_id,omitempty"`
	Refund      string    `json:"refund_id,omitempty"`
	State       string    `json:"state"`
	Attempts    int       `json:"attempts"`
	FinalizedAt time.Time `json:"finalized_at"`
	Error       string    `json:"error"`
}

// keyInfo is `keys inspect`'s output: the engine's view of a key, with the
// account its scope is.
type keyInfo struct {
	Account string `json:"account_id"`
	keyadmin.KeyInfo
	Scope struct{} `json:"scope,omitzero"` // the account, above
}

// stuckKey is one line of `keys stuck`.
type stuckKey struct {
	Account string `json:"account_id"`
	keyadmin.StuckKey
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

// withDatabase opens the migrated database of url and runs fn.
func withDatabase(ctx context.Context, db databaseFlags, fn func(*postgres.Store) error) error {
	pool, err := openDatabase(ctx, db.DatabaseURL, db.keys())
	if err != nil {
		return err
	}
	defer pool.Close()
	return fn(postgres.NewKeys(pool, nil, db.keys()))
}

// openDatabase connects and migrates, so every command works on a fresh
// database; the pool is closed again if migrating fails.
func openDatabase(ctx context.Context, url string, keys pgstore.Options, opts ...postgres.Option) (*pgxpool.Pool, error) {
	pool, err := postgres.Open(ctx, url, opts...)
	if err != nil {
		return nil, err
	}
	if err := postgres.MigrateKeys(ctx, pool, keys); err != nil {
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
	be, err := openBackend(ctx, cfg, log, dbOpts, m)
	if err != nil {
		return err
	}
	defer be.close()
	if be.pool != nil {
		m.RegisterPool(be.pool)
	}
	m.RegisterStore(be.Backend)
	m.RegisterPending(be.Backend)
	m.RegisterReadiness(be.Backend.Ready)
	if be.replica != nil {
		m.RegisterReplica(be.replica)
	}
	keys, deferredKeys := be.Keys(), be.DeferredKeys()
	if cfg.RedisURL != "" {
		rdb, err := redisstore.NewClient(cfg.RedisURL)
		if err != nil {
			return err
		}
		defer rdb.Close()
		// No ping: Redis being down at start only costs speed, and the
		// client reconnects by itself when it comes back.
		fast := redisstore.New(rdb, redisstore.Config{Prefix: "oncekey:", Observer: m, Secret: cfg.RedisSecret, Logger: log})
		keys, deferredKeys = redisstore.Wrap(fast, keys), redisstore.Wrap(fast, deferredKeys)
		log.Info("idempotency fast path: Redis")
		if len(cfg.RedisSecret) == 0 {
			log.Warn("ONCEKEY_REDIS_SECRET is not set: this process authenticates its Redis records with a random secret, so other replicas' cached responses are misses here")
		}
	}
	if cfg.RecordCacheSize > 0 {
		// In front of Redis too: a replay of a key this replica has seen
		// costs no round trip at all.
		cache, err := recordcache.New(cfg.RecordCacheSize, m)
		if err != nil {
			return err
		}
		keys, deferredKeys = recordcache.Wrap(cache, keys), recordcache.Wrap(cache, deferredKeys)
	}
	pay, err := startPayments(ctx, cfg, be, log, m)
	if err != nil {
		return err
	}
	defer pay.stop()
	handler, err := httpapi.New(httpapi.Config{
		Backend:      be.Backend,
		Reads:        be.reads,
		Keys:         keys,
		DeferredKeys: deferredKeys,
		Payments:     pay.svc,
		// Looked-up keys are trusted for ONCEKEY_API_KEY_CACHE_TTL: a round
		// trip saved on every request, at the price of that revocation delay
		// on other replicas.
		Auth:           auth.NewCache(be.Backend, auth.DefaultCacheSize, cfg.APIKeyCacheTTL),
		TTL:            cfg.TTL,
		Wait:           cfg.Wait,
		RepeatWindow:   cfg.RepeatWindow,
		RefuseRepeats:  cfg.RefuseRepeats,
		MaxBodyBytes:   cfg.MaxBodyBytes,
		RequestTimeout: cfg.RequestTimeout,
		Logger:         log,
		Metrics:        m,
		HideMetrics:    cfg.MetricsAddr != "",
		Tracing:        cfg.Tracing != tracing.Off,
	})
	if err != nil {
		return err
	}
	if cfg.PprofAddr != "" {
		stop, err := serveInternal(cfg.PprofAddr, profiling(), "profiling", log)
		if err != nil {
			return fmt.Errorf("--pprof-addr: %w", err)
		}
		defer stop()
	}
	if cfg.MetricsAddr != "" {
		stop, err := serveMetrics(cfg.MetricsAddr, m, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("--addr: %w", err)
	}
	cleanupCtx, stopCleanup := context.WithCancel(ctx)
	defer stopCleanup()
	go idempotency.Cleanup{Purge: be.Backend.PurgeExpired, Interval: cfg.CleanupInterval, Batch: cfg.CleanupBatch, Logger: log, Observe: m.CleanupRun}.Run(cleanupCtx)

	log.Info("listening", "addr", ln.Addr().String())
	if be.demoKey != "" {
		// The key is printed only where it is the README's own: a key given
		// by the operator stays out of terminals and logs.
		shown := be.demoKey
		if shown != DemoAPIKey {
			shown = "$ONCEKEY_DEMO_API_KEY"
		}
		fmt.Fprintf(stdout, "Oncekey serves http://%s (%s). Try it (twice: the second answer is the first, replayed):\n\n%s\n\n",
			ln.Addr(), be.kind, tryIt(ln.Addr().String(), shown))
	}
	// SIGTERM: stop accepting, close idle and stalled connections at once,
	// let running requests finish (and store their responses) within the
	// deadline.
	return httpserver.Serve(ctx, ln, httpserver.Config{
		Handler:         handler,
		MaxBodyBytes:    cfg.MaxBodyBytes, // httpapi's limit too, so httpapi answers 413
		ShutdownTimeout: cfg.ShutdownTimeout,
		MaxConns:        cfg.MaxConns,
		MaxInFlight:     cfg.MaxInFlight,
		WriteTimeout:    cfg.WriteTimeout,
		MinWriteRate:    cfg.MinWriteRate,
		Logger:          log,
	})
}

// tryIt is a curl command that creates an order on the server at addr with
// apiKey, under a key new for each start.
func tryIt(addr, apiKey string) string {
	return fmt.Sprintf("  curl -si http://%s/orders -H 'Authorization: Bearer %s' -H 'Idempotency-Key: %s' \\\n"+
		"    -H 'Content-Type: application/json' -d '{\"items\":[{\"sku\":\"SKU-1\",\"qty\":2}],\"amount\":1200,\"currency\":\"RUB\"}'",
		addr, apiKey, uuid.NewString())
}

// backend is the store serve runs on, with what it holds open.
type backend struct {
	store.Backend
	// reads serves the API's reads: the backend, or the replica in front
	// of it. The payment worker never gets it.
	reads   store.Reads
	replica *postgres.Replica // nil without DATABASE_REPLICA_URL
	kind    string            // what it is, for people
	demoKey string            // the demo account's API key, if there is one
	pool    *pgxpool.Pool     // nil in memory
	local   *memory.Store     // nil on PostgreSQL
	charges *jobs.Runner      // nil in memory
	close   func()
}

// openBackend opens PostgreSQL when DATABASE_URL is set (migrating first),
// and the in-memory store with a demo account otherwise.
func openBackend(ctx context.Context, cfg config, log *slog.Logger, dbOpts []postgres.Option, m *metrics.Metrics) (backend, error) {
	if cfg.DatabaseURL == "" {
		mem := memory.New()
		if _, err := auth.CreateAccount(ctx, mem, "demo", cfg.DemoAPIKey); err != nil {
			return backend{}, err
		}
		log.Warn("store: in memory (set DATABASE_URL for PostgreSQL); data is lost on exit")
		return backend{Backend: mem, reads: mem, kind: "in memory: data is lost on exit", demoKey: cfg.DemoAPIKey, local: mem, close: func() {}}, nil
	}
	keys := pgstore.Options{Scope: cfg.KeyScope, MergeByScope: cfg.GroupCommitByAccount}
	pool, err := openDatabase(ctx, cfg.DatabaseURL, keys, dbOpts...)
	if err != nil {
		return backend{}, err
	}
	runner, err := jobs.New(pool, jobs.Config{Policy: cfg.PaymentPolicy, Workers: cfg.PaymentWorkers, Logger: log.With("component", "river")})
	if err != nil {
		pool.Close()
		return backend{}, err
	}
	log.Info("store: PostgreSQL")
	pg := postgres.NewKeys(pool, runner, keys)
	be := backend{Backend: pg, reads: pg, kind: "on PostgreSQL", demoKey: cfg.DemoAPIKey, pool: pool, charges: runner, close: pool.Close}
	if cfg.ReplicaURL != "" {
		// Not migrated: a replica follows the primary's schema.
		replicaPool, err := postgres.OpenReplica(ctx, cfg.ReplicaURL, dbOpts...)
		if err != nil {
			pool.Close()
			return backend{}, fmt.Errorf("the replica (DATABASE_REPLICA_URL): %w", err)
		}
		be.replica = postgres.NewReplica(pg, replicaPool, postgres.ReplicaConfig{Observer: m})
		be.reads = be.replica
		be.close = func() { be.replica.Close(); replicaPool.Close(); pool.Close() }
		log.Info("reads that may lag: from the replica")
	}
	// Every start settles the demo account: with the setting, its key is
	// its only active one; without, it has none.
	account, revoked, err := pg.SetDemoKey(ctx, cfg.DemoAPIKey)
	if err != nil {
		be.close()
		return backend{}, fmt.Errorf("the demo account of --demo-api-key (ONCEKEY_DEMO_API_KEY): %w", err)
	}
	if revoked > 0 {
		log.Warn("demo API keys disabled: --demo-api-key (ONCEKEY_DEMO_API_KEY) is not the key they were given with", "disabled", revoked)
	}
	if cfg.DemoAPIKey != "" {
		log.Info("demo account", "account_id", account)
	}
	return be, nil
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
func startPayments(ctx context.Context, cfg config, be backend, log *slog.Logger, m *metrics.Metrics) (paymentsRuntime, error) {
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
	// The worker settles through the backend, whose reads are the
	// primary's: never through be.reads.
	worker := payments.NewWorker(payments.WorkerConfig{
		Repo: be.Backend, Provider: client, Render: httpapi.PaymentOutcome, RenderRefund: httpapi.RefundOutcome,
		Observer: m, Logger: log,
	})
	svc := payments.NewService(be.reads)

	if mem := be.local; mem != nil {
		wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan struct{})
		go func() {
			defer close(done)
			payments.RunLocal(wctx, mem, worker, cfg.PaymentPolicy, cfg.PaymentWorkers, log)
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
	if err := runner.Start(context.WithoutCancel(ctx), worker); err != nil {
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

// serveInternal serves h on addr, an internal listener of its own (the
// metrics, or the profiling endpoints): never on the API's address.
func serveInternal(addr string, h http.Handler, what string, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	log.Warn("internal endpoints on", "addr", ln.Addr().String(), "serving", what)
	return func() { _ = srv.Close() }, nil
}

// serveMetrics serves GET /metrics alone on addr (--metrics-addr).
func serveMetrics(addr string, m *metrics.Metrics, log *slog.Logger) (stop func(), err error) {
	only := http.NewServeMux()
	only.Handle("GET /metrics", m.Handler())
	stop, err = serveInternal(addr, only, "metrics", log)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	return stop, nil
}

// profiling is Go's profiling endpoints (/debug/pprof/). They reveal the
// command line (and so any secret given as a flag) and burn CPU while they
// profile, so they are served only where --pprof-addr asks, apart from the
// metrics.
func profiling() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}
