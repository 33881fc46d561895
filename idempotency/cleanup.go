package idempotency

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// ErrCleanupBusy is returned by Store.PurgeExpired when another process is running
// cleanup: with several replicas, exactly one purges at a time.
var ErrCleanupBusy = errors.New("idempotency: another replica is running cleanup")

// Defaults of Cleanup's zero fields.
const (
	defaultCleanupInterval = time.Minute
	defaultCleanupBatch    = 1000
)

// Cleanup purges expired keys periodically.
type Cleanup struct {
	// Purge deletes expired records in batches: a store's PurgeExpired
	// (Purge: keys.PurgeExpired).
	Purge func(ctx context.Context, batch int) (int64, error)
	// Interval is the time between runs (a minute if zero).
	Interval time.Duration
	// Batch bounds each delete statement, so that no statement holds many
	// row locks or runs long under load (1000 if zero).
	Batch  int
	Logger *slog.Logger // optional: slog.Default
	// Observe, if set, is told of each run, for metrics: how many keys it
	// deleted (a run that fails part-way has still deleted its earlier
	// batches'), how long it took, and Once's error: nil,
	// ErrCleanupBusy when another replica held the cleanup lock, or the
	// store's failure.
	Observe func(deleted int64, took time.Duration, err error)
}

// Run purges every Interval until ctx ends. Expired keys are already treated
// as absent when claimed, so cleanup only reclaims space; a failed run is
// logged and retried at the next tick.
func (c Cleanup) Run(ctx context.Context) {
	interval := c.Interval
	if interval <= 0 {
		interval = defaultCleanupInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.Once(ctx)
	}
}

// Once runs one cleanup pass, reports it to Observe, unless ctx ended
// during it (shutting down: nothing to report), and returns how many keys
// it deleted and Purge's error: ErrCleanupBusy when another replica
// is purging.
func (c Cleanup) Once(ctx context.Context) (int64, error) {
	start := time.Now()
	batch := c.Batch
	if batch <= 0 {
		batch = defaultCleanupBatch
	}
	n, err := c.Purge(ctx, batch)
	switch {
	case errors.Is(err, ErrCleanupBusy):
	case err != nil:
		if ctx.Err() != nil {
			return n, err // shutting down
		}
		c.logger().WarnContext(ctx, "cleanup failed", "err", err, "deleted", n)
	case n > 0:
		c.logger().InfoContext(ctx, "cleanup", "deleted", n, "duration_ms", time.Since(start).Milliseconds())
	}
	if c.Observe != nil {
		c.Observe(n, time.Since(start), err)
	}
	return n, err
}

func (c Cleanup) logger() *slog.Logger {
	if c.Logger == nil {
		return slog.Default()
	}
	return c.Logger
}
