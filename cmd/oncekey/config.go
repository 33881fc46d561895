package main

import (
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"time"

	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/payments"
	"github.com/oncekey/oncekey/internal/service/provider"
	"github.com/oncekey/oncekey/internal/service/tracing"
)

// DemoAPIKey is the demo account's key on the in-memory store unless
// --demo-api-key says otherwise: fixed, so that the README's examples work
// as printed right after `make run`, and named so that nobody mistakes it
// for a real key.
const DemoAPIKey = "ok_local_demo"

// config is everything serve runs with, read from flags and their
// environment variables (serveCmd) and checked before anything listens.
type config struct {
	DatabaseURL string
	ReplicaURL  string
	// GroupCommitByAccount merges only one account's deferred commits.
	GroupCommitByAccount bool
	// KeyScope is the key table's scope type (pgstore.Options.Scope).
	KeyScope    pgstore.ScopeType
	RedisURL    string
	RedisSecret []byte
	Addr        string
	MetricsAddr string
	TTL         time.Duration
	Wait        time.Duration
	// RepeatWindow and RefuseRepeats spot (and refuse) a request sent
	// again under a new key (idempotency.Config).
	RepeatWindow    time.Duration
	RefuseRepeats   bool
	MaxBodyBytes    int64
	RequestTimeout  time.Duration
	ShutdownTimeout time.Duration
	CleanupInterval time.Duration
	CleanupBatch    int
	DemoAPIKey      string
	Tracing         string
	ProviderURL     string
	ProviderFaults  provider.Faults
	ProviderTimeout time.Duration
	PaymentPolicy   payments.RetryPolicy
	PaymentWorkers  int
	APIKeyCacheTTL  time.Duration
	RecordCacheSize int
	PprofAddr       string
	MaxConns        int
	MaxInFlight     int
	WriteTimeout    time.Duration
	MinWriteRate    int64
}

// config checks the flags and returns what serve runs with. Every problem
// is reported, one line each, so that a broken deployment is fixed in one
// go rather than one restart per mistake.
func (s *serveCmd) config(getenv func(string) string) (config, error) {
	var problems flagProblems
	bad, positive, within := problems.bad, problems.positive, problems.within
	s.protocolFlags.check(&problems)
	positive("request-timeout", "ONCEKEY_REQUEST_TIMEOUT", s.RequestTimeout)
	positive("shutdown-timeout", "ONCEKEY_SHUTDOWN_TIMEOUT", s.ShutdownTimeout)
	positive("cleanup-interval", "ONCEKEY_CLEANUP_INTERVAL", s.CleanupInterval)
	positive("provider-timeout", "ONCEKEY_PROVIDER_TIMEOUT", s.ProviderTimeout)
	positive("api-key-cache-ttl", "ONCEKEY_API_KEY_CACHE_TTL", s.APIKeyCacheTTL)
	positive("payment-retry-base", "ONCEKEY_PAYMENT_RETRY_BASE", s.PaymentRetryBase)
	positive("payment-retry-max", "ONCEKEY_PAYMENT_RETRY_MAX", s.PaymentRetryMax)
	positive("payment-attempt-timeout", "ONCEKEY_PAYMENT_ATTEMPT_TIMEOUT", s.PaymentAttemptTimeout)
	within("max-body-bytes", "ONCEKEY_MAX_BODY_BYTES", s.MaxBodyBytes, 1, 1<<30, "")
	within("cleanup-batch", "ONCEKEY_CLEANUP_BATCH", int64(s.CleanupBatch), 1, 100_000, ", to keep each delete short")
	within("record-cache-size", "ONCEKEY_RECORD_CACHE_SIZE", int64(s.RecordCacheSize), 0, 10_000_000, " (0: no cache)")
	within("payment-attempts", "ONCEKEY_PAYMENT_ATTEMPTS", int64(s.PaymentAttempts), 1, 100, ", so that a payment settles long before its key expires")
	within("payment-workers", "ONCEKEY_PAYMENT_WORKERS", int64(s.PaymentWorkers), 1, 1000, "")
	within("max-conns", "ONCEKEY_MAX_CONNS", int64(s.MaxConns), 0, 1_000_000, " (0: from the open-file limit)")
	within("max-in-flight", "ONCEKEY_MAX_IN_FLIGHT", int64(s.MaxInFlight), 0, 1_000_000, " (0: the default)")
	if s.PaymentAttemptTimeout <= s.ProviderTimeout {
		bad("--payment-attempt-timeout (ONCEKEY_PAYMENT_ATTEMPT_TIMEOUT) %s must be longer than --provider-timeout (ONCEKEY_PROVIDER_TIMEOUT) %s: an attempt needs time to record the provider's answer",
			s.PaymentAttemptTimeout, s.ProviderTimeout)
	}
	if s.Wait >= s.RequestTimeout {
		bad("--wait (IDEMPOTENCY_WAIT) %s must be shorter than --request-timeout (ONCEKEY_REQUEST_TIMEOUT) %s: a waiting duplicate would time out with 503 instead of getting 202",
			s.Wait, s.RequestTimeout)
	}
	for _, a := range []struct{ flag, env, addr string }{
		{"addr", "ONCEKEY_ADDR", s.Addr}, {"metrics-addr", "ONCEKEY_METRICS_ADDR", s.MetricsAddr}, {"pprof-addr", "ONCEKEY_PPROF_ADDR", s.PprofAddr},
	} {
		if _, _, err := net.SplitHostPort(a.addr); a.addr != "" && err != nil {
			bad("--%s (%s) %q: want host:port, such as 127.0.0.1:8080", a.flag, a.env, a.addr)
		}
	}
	if s.MetricsAddr != "" && s.MetricsAddr == s.Addr {
		bad("--metrics-addr (ONCEKEY_METRICS_ADDR) is the API's address: give the internal listener an address of its own")
	}
	tracingMode := s.Tracing
	switch tracingMode {
	case "off", "":
		tracingMode = tracing.Off
	case tracing.Stdout:
	default:
		bad("--tracing (ONCEKEY_TRACING) %q: want off or stdout", s.Tracing)
	}
	faults, err := provider.FaultsFromEnv(getenv)
	if err != nil {
		bad("%s", err)
	}
	if s.DemoAPIKey != "" && !auth.StrongKey(s.DemoAPIKey) && !s.AllowWeakDemoAPIKey {
		bad("--demo-api-key (ONCEKEY_DEMO_API_KEY) is not a full-strength key (ok_ and 43 base64url characters, 256 random bits): anyone may guess it. " +
			"Make one with `echo ok_$(openssl rand -base64 32 | tr '+/' '-_' | tr -d =)`, or set --allow-weak-demo-api-key (ONCEKEY_ALLOW_WEAK_DEMO_API_KEY) on a throwaway setup")
	}
	s.redisFlags.check(&problems)
	s.serverFlags.check(&problems)
	if s.RedisSecret != "" && s.RedisURL == "" {
		bad("--redis-secret (ONCEKEY_REDIS_SECRET) is given without --redis-url (REDIS_URL): it authenticates what is cached in Redis")
	}
	if s.DatabaseReplicaURL != "" && s.DatabaseURL == "" {
		bad("--database-replica-url (DATABASE_REPLICA_URL) needs --database-url (DATABASE_URL): it is a replica of that database")
	}
	if err := problems.err(); err != nil {
		return config{}, err
	}
	demo := s.DemoAPIKey
	if demo == "" && s.DatabaseURL == "" {
		demo = DemoAPIKey
	}
	return config{
		DatabaseURL: s.DatabaseURL, ReplicaURL: s.DatabaseReplicaURL, GroupCommitByAccount: s.GroupCommitByAccount, KeyScope: pgstore.ScopeType(s.KeyScope), RedisURL: s.RedisURL, RedisSecret: []byte(s.RedisSecret), Addr: s.Addr, MetricsAddr: s.MetricsAddr,
		TTL: s.TTL, Wait: s.Wait, RepeatWindow: s.repeatWindow(), RefuseRepeats: s.RefuseRepeats, MaxBodyBytes: s.MaxBodyBytes,
		RequestTimeout: s.RequestTimeout, ShutdownTimeout: s.ShutdownTimeout,
		CleanupInterval: s.CleanupInterval, CleanupBatch: s.CleanupBatch,
		DemoAPIKey: demo, Tracing: tracingMode,
		ProviderURL: s.ProviderURL, ProviderFaults: faults, ProviderTimeout: s.ProviderTimeout,
		PaymentPolicy: payments.RetryPolicy{
			Attempts: s.PaymentAttempts, Base: s.PaymentRetryBase, Limit: s.PaymentRetryMax, Timeout: s.PaymentAttemptTimeout,
		},
		PaymentWorkers: s.PaymentWorkers, APIKeyCacheTTL: s.APIKeyCacheTTL, RecordCacheSize: s.RecordCacheSize,
		PprofAddr: s.PprofAddr, MaxConns: s.MaxConns, MaxInFlight: s.MaxInFlight,
		WriteTimeout: s.WriteTimeout, MinWriteRate: s.MinWriteRate,
	}, nil
}

// flagProblems collects what is wrong with a command's flags: every problem
// is reported, one line each, so that a broken deployment is fixed in one
// go rather than one restart per mistake.
type flagProblems []string

func (p *flagProblems) bad(format string, args ...any) {
	*p = append(*p, fmt.Sprintf(format, args...))
}

// positive requires a duration above zero.
func (p *flagProblems) positive(flag, env string, d time.Duration) {
	if d <= 0 {
		p.bad("--%s (%s) is %s: want a positive duration such as 1s", flag, env, d)
	}
}

// within requires lo ≤ v ≤ hi (hi math.MaxInt64: no ceiling); why, if
// not empty, ends the line.
func (p *flagProblems) within(flag, env string, v, lo, hi int64, why string) {
	if hi == math.MaxInt64 && v < lo {
		p.bad("--%s (%s) is %d: want at least %d%s", flag, env, v, lo, why)
		return
	}
	if v < lo || v > hi {
		p.bad("--%s (%s) is %d: want %d to %d%s", flag, env, v, lo, hi, why)
	}
}

// err is every problem as one error (flagProblems itself, so that run can
// add the bad values kong parsed past), or nil.
func (p flagProblems) err() error {
	if len(p) == 0 {
		return nil
	}
	return p
}

// Error is every problem, one line each.
func (p flagProblems) Error() string {
	return "invalid configuration:\n  - " + strings.Join(p, "\n  - ")
}

// check requires a secret strong enough to authenticate what is cached.
func (r redisFlags) check(p *flagProblems) {
	if r.RedisSecret != "" && len(r.RedisSecret) < 32 {
		p.bad("--redis-secret (ONCEKEY_REDIS_SECRET) has %d characters: give it 32 or more, such as `openssl rand -hex 32`", len(r.RedisSecret))
	}
}

// errNoDatabase is what a command that needs PostgreSQL says without it.
var errNoDatabase = errors.New("this command needs PostgreSQL: set --database-url or DATABASE_URL, e.g. postgres://postgres@127.0.0.1:5432/postgres")
