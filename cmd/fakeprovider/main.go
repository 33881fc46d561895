// Command fakeprovider runs the sandbox payment provider (internal/service/provider)
// on its own port, for trying Oncekey against a provider in another process
// and for chaos runs with injected faults. It serves POST and GET
// /v1/charges, POST and GET /v1/refunds, GET /v1/stats and GET /healthz;
// the faults apply to both POST endpoints alike.
//
//	fakeprovider [-addr 127.0.0.1:8090] [-database-url URL]
//	             [-fail-rate 0] [-timeout-rate 0] [-timeout-hold 30s]
//	             [-latency 0] [-decline-rate 0] [-seed 0]
//
// Every flag falls back to an environment variable (FAKEPROVIDER_ADDR,
// FAKEPROVIDER_DATABASE_URL, FAKEPROVIDER_FAIL_RATE, …); a flag given wins.
// Without a database URL the charges and refunds are kept in memory.
//
// This package holds only wiring: flags, building the pieces, and signals.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/internal/service/provider"
)

// shutdownTimeout bounds the graceful stop after SIGINT or SIGTERM.
const shutdownTimeout = 10 * time.Second

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.Is(err, errUsage):
		os.Exit(2) // the flag package has already said what is wrong
	default:
		fmt.Fprintln(os.Stderr, "fakeprovider:", err)
		os.Exit(1)
	}
}

// errUsage marks a command line the flag package refused.
var errUsage = errors.New("usage")

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	faults, err := provider.FaultsFromEnv(getenv)
	if err != nil {
		return err
	}
	fs := flag.NewFlagSet("fakeprovider", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", envOr(getenv, "FAKEPROVIDER_ADDR", "127.0.0.1:8090"), "listen address; port 0 picks a free one (env FAKEPROVIDER_ADDR)")
	dbURL := fs.String("database-url", getenv("FAKEPROVIDER_DATABASE_URL"), "PostgreSQL URL; empty keeps charges and refunds in memory (env FAKEPROVIDER_DATABASE_URL)")
	fs.Float64Var(&faults.FailRate, "fail-rate", faults.FailRate, "share of charge and refund requests answered 500 before anything is stored (env "+provider.EnvFailRate+")")
	fs.Float64Var(&faults.TimeoutRate, "timeout-rate", faults.TimeoutRate, "share of charge and refund requests stored whose answer is then lost (env "+provider.EnvTimeoutRate+")")
	fs.DurationVar(&faults.TimeoutHold, "timeout-hold", faults.TimeoutHold, "longest a lost answer is held before the connection drops; 0 means 30s (env "+provider.EnvTimeoutHold+")")
	fs.DurationVar(&faults.Latency, "latency", faults.Latency, "delay before each charge and refund request (env "+provider.EnvLatency+")")
	fs.Float64Var(&faults.DeclineRate, "decline-rate", faults.DeclineRate, "share of new charges and refunds declined (env "+provider.EnvDeclineRate+")")
	fs.Int64Var(&faults.Seed, "seed", faults.Seed, "seed of the fault dice; 0 seeds from the clock (env "+provider.EnvSeed+")")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := faults.Validate(); err != nil {
		return fmt.Errorf("invalid fault settings: %w", err)
	}

	log := slog.New(slog.NewJSONHandler(stderr, nil))
	store, closeStore, err := openStore(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer closeStore()
	srv := provider.NewServer(store, faults, log)
	url, stop, err := provider.Listen(ctx, *addr, srv, log)
	if err != nil {
		return err
	}
	// Tests and scripts wait for this line, and read the real port from it.
	fmt.Fprintf(stdout, "listening on %s\n", url)
	log.Info("fakeprovider serving", "url", url, "postgres", *dbURL != "",
		"fail_rate", faults.FailRate, "timeout_rate", faults.TimeoutRate, "timeout_hold", faults.TimeoutHold.String(),
		"latency", faults.Latency.String(), "decline_rate", faults.DeclineRate, "seed", faults.Seed)

	<-ctx.Done()
	log.Info("fakeprovider shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := stop(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}

// openStore returns the PostgreSQL store when dbURL is set, else a memory
// one. It opens its own pool rather than Oncekey's (internal/service/store/postgres):
// the sandbox stands apart from the product it tests.
func openStore(ctx context.Context, dbURL string) (provider.Store, func(), error) {
	if dbURL == "" {
		return provider.NewMemoryStore(), func() {}, nil
	}
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, nil, fmt.Errorf("parse database URL: %w", err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "fakeprovider"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("create pool: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	store, err := provider.NewPostgresStore(ctx, pool)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return store, pool.Close, nil
}

func envOr(getenv func(string) string, name, fallback string) string {
	if v := getenv(name); v != "" {
		return v
	}
	return fallback
}
