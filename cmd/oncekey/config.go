package main

import (
	"fmt"
	"strconv"
	"time"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/recordcache"
	"github.com/oncekey/oncekey/internal/auth"
	"github.com/oncekey/oncekey/internal/httpapi"
	"github.com/oncekey/oncekey/internal/payments"
	"github.com/oncekey/oncekey/internal/provider"
)

// config is everything serve reads from the environment. docs/operations.md
// and the README list the variables; a malformed value stops the process at
// start rather than running with a surprise default.
type config struct {
	DatabaseURL     string        // DATABASE_URL; empty: the in-memory store
	RedisURL        string        // REDIS_URL; empty: no Redis fast path
	Addr            string        // ONCEKEY_ADDR
	TTL             time.Duration // IDEMPOTENCY_TTL
	Wait            time.Duration // IDEMPOTENCY_WAIT
	MaxBodyBytes    int64         // ONCEKEY_MAX_BODY_BYTES
	RequestTimeout  time.Duration // ONCEKEY_REQUEST_TIMEOUT
	ShutdownTimeout time.Duration // ONCEKEY_SHUTDOWN_TIMEOUT
	CleanupInterval time.Duration // ONCEKEY_CLEANUP_INTERVAL
	CleanupBatch    int           // ONCEKEY_CLEANUP_BATCH
	DemoAPIKey      string        // ONCEKEY_DEMO_API_KEY (memory store only)
	Tracing         string        // ONCEKEY_TRACING: empty (off) or "stdout"
	// ProviderURL is ONCEKEY_PROVIDER_URL; empty: the sandbox provider runs
	// in-process (with the FAKEPROVIDER_* fault variables).
	ProviderURL     string
	ProviderFaults  provider.Faults      // FAKEPROVIDER_* (the in-process sandbox only)
	ProviderTimeout time.Duration        // ONCEKEY_PROVIDER_TIMEOUT
	PaymentPolicy   payments.RetryPolicy // ONCEKEY_PAYMENT_ATTEMPTS, _RETRY_BASE, _RETRY_MAX, _ATTEMPT_TIMEOUT
	PaymentWorkers  int                  // ONCEKEY_PAYMENT_WORKERS
	APIKeyCacheTTL  time.Duration        // ONCEKEY_API_KEY_CACHE_TTL
	RecordCacheSize int                  // ONCEKEY_RECORD_CACHE_SIZE; 0: no in-process record cache
	PprofAddr       string               // ONCEKEY_PPROF_ADDR; empty: no profiling endpoints
	MaxConns        int                  // ONCEKEY_MAX_CONNS; 0: httpserver's default (from the open-file limit)
	MaxInFlight     int                  // ONCEKEY_MAX_IN_FLIGHT; 0: httpserver's default
}

func loadConfig(getenv func(string) string) (config, error) {
	c := config{
		DatabaseURL: getenv("DATABASE_URL"),
		RedisURL:    getenv("REDIS_URL"),
		Addr:        orDefault(getenv("ONCEKEY_ADDR"), ":8080"),
		DemoAPIKey:  getenv("ONCEKEY_DEMO_API_KEY"),
		Tracing:     getenv("ONCEKEY_TRACING"),
		ProviderURL: getenv("ONCEKEY_PROVIDER_URL"),
		PprofAddr:   getenv("ONCEKEY_PPROF_ADDR"),
	}
	var err error
	durations := []struct {
		name string
		dst  *time.Duration
		def  time.Duration
	}{
		{"IDEMPOTENCY_TTL", &c.TTL, idempotency.DefaultTTL},
		{"IDEMPOTENCY_WAIT", &c.Wait, idempotency.DefaultWait},
		{"ONCEKEY_REQUEST_TIMEOUT", &c.RequestTimeout, httpapi.DefaultRequestTimeout},
		{"ONCEKEY_SHUTDOWN_TIMEOUT", &c.ShutdownTimeout, 30 * time.Second},
		{"ONCEKEY_CLEANUP_INTERVAL", &c.CleanupInterval, time.Minute},
		{"ONCEKEY_PROVIDER_TIMEOUT", &c.ProviderTimeout, 10 * time.Second},
		{"ONCEKEY_API_KEY_CACHE_TTL", &c.APIKeyCacheTTL, auth.DefaultCacheTTL},
		{"ONCEKEY_PAYMENT_RETRY_BASE", &c.PaymentPolicy.Base, payments.DefaultBase},
		{"ONCEKEY_PAYMENT_RETRY_MAX", &c.PaymentPolicy.Limit, payments.DefaultLimit},
		{"ONCEKEY_PAYMENT_ATTEMPT_TIMEOUT", &c.PaymentPolicy.Timeout, payments.DefaultTimeout},
	}
	for _, d := range durations {
		if *d.dst, err = duration(getenv, d.name, d.def); err != nil {
			return config{}, err
		}
	}
	if c.MaxBodyBytes, err = integer(getenv, "ONCEKEY_MAX_BODY_BYTES", httpapi.DefaultMaxBodyBytes); err != nil {
		return config{}, err
	}
	batch, err := integer(getenv, "ONCEKEY_CLEANUP_BATCH", 1000)
	if err != nil {
		return config{}, err
	}
	if batch > 100_000 {
		return config{}, fmt.Errorf("ONCEKEY_CLEANUP_BATCH=%d: at most 100000 rows per statement, to keep each delete short", batch)
	}
	c.CleanupBatch = int(batch)
	c.RecordCacheSize = recordcache.DefaultSize
	if v := getenv("ONCEKEY_RECORD_CACHE_SIZE"); v == "0" {
		c.RecordCacheSize = 0
	} else if size, err := integer(getenv, "ONCEKEY_RECORD_CACHE_SIZE", recordcache.DefaultSize); err != nil {
		return config{}, fmt.Errorf("%w (or 0 for no cache)", err)
	} else {
		c.RecordCacheSize = int(size)
	}
	if c.ProviderFaults, err = provider.FaultsFromEnv(getenv); err != nil {
		return config{}, err
	}
	attempts, err := integer(getenv, "ONCEKEY_PAYMENT_ATTEMPTS", payments.DefaultAttempts)
	if err != nil {
		return config{}, err
	}
	if attempts > 100 {
		return config{}, fmt.Errorf("ONCEKEY_PAYMENT_ATTEMPTS=%d: at most 100, so that a payment settles long before its key expires", attempts)
	}
	c.PaymentPolicy.Attempts = int(attempts)
	workers, err := integer(getenv, "ONCEKEY_PAYMENT_WORKERS", 10)
	if err != nil {
		return config{}, err
	}
	c.PaymentWorkers = int(min(workers, 1000))
	conns, err := integer(getenv, "ONCEKEY_MAX_CONNS", 0)
	if err != nil {
		return config{}, err
	}
	inFlight, err := integer(getenv, "ONCEKEY_MAX_IN_FLIGHT", 0)
	if err != nil {
		return config{}, err
	}
	c.MaxConns, c.MaxInFlight = int(min(conns, 1_000_000)), int(min(inFlight, 1_000_000))
	if c.PaymentPolicy.Timeout <= c.ProviderTimeout {
		return config{}, fmt.Errorf("ONCEKEY_PAYMENT_ATTEMPT_TIMEOUT=%s must be longer than ONCEKEY_PROVIDER_TIMEOUT=%s: an attempt needs time to record the provider's answer", c.PaymentPolicy.Timeout, c.ProviderTimeout)
	}
	if c.Wait >= c.RequestTimeout {
		return config{}, fmt.Errorf("IDEMPOTENCY_WAIT=%s must be shorter than ONCEKEY_REQUEST_TIMEOUT=%s: a waiting duplicate would time out with 503 instead of getting 202", c.Wait, c.RequestTimeout)
	}
	return c, nil
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

func duration(getenv func(string) string, name string, def time.Duration) (time.Duration, error) {
	v := getenv(name)
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s=%q: want a positive Go duration such as 48h or 1s", name, v)
	}
	return d, nil
}

func integer(getenv func(string) string, name string, def int64) (int64, error) {
	v := getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s=%q: want a positive integer", name, v)
	}
	return n, nil
}
