package idempotency

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// ErrCleanupBusy is returned by a Purger when another process is running
// cleanup: with several replicas, exactly one purges at a time.
var ErrCleanupBusy = errors.New("idempotency: another replica is running cleanup")

// Purger deletes expired records in bounded batches. Every Store is one; a
// store whose records expire by themselves (a cache with a TTL) returns an
// error wrapping errors.ErrUnsupported, and Cleanup has nothing to do.
type Purger interface {
	// PurgeExpired deletes expired records, at most batch (> 0) per
	// statement, until none is left or ctx ends, and returns how many it
	// deleted. It returns ErrCleanupBusy, having deleted nothing, while
	// another process is purging.
	PurgeExpired(ctx context.Context, batch int) (int64, error)
}

// CleanupResult is how a cleanup run ended.
type CleanupResult string

// The cleanup results.
const (
	CleanupOK      CleanupResult = "ok"
	CleanupError   CleanupResult = "error"
	CleanupSkipped CleanupResult = "skipped" // another replica held the cleanup lock
)

// CleanupObserver receives each run's result, for metrics.
type CleanupObserver interface {
	CleanupRun(result CleanupResult, deleted int64, d time.Duration)
}

// Defaults of Cleanup's zero fields.
const (
	DefaultCleanupInterval = time.Minute
	DefaultCleanupBatch    = 1000
)

// Cleanup purges expired keys periodically.
type Cleanup struct {
	Purger Purger
	// Interval is the time between runs (DefaultCleanupInterval if zero).
	Interval time.Duration
	// Batch bounds each delete statement, so that no statement holds many
	// row locks or runs long under load (DefaultCleanupBatch if zero).
	Batch    int
	Logger   *slog.Logger    // optional: slog.Default
	Observer CleanupObserver // optional
}

// Run purges every Interval until ctx ends. Expired keys are already treated
// as absent when claimed, so cleanup only reclaims space; a failed run is
// logged and retried at the next tick.
func (c Cleanup) Run(ctx context.Context) {
	interval := c.Interval
	if interval <= 0 {
		interval = DefaultCleanupInterval
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

// Once runs one cleanup pass and reports it to the Observer, unless ctx
// ended during it (shutting down: nothing to report).
func (c Cleanup) Once(ctx context.Context) (CleanupResult, int64) {
	start := time.Now()
	batch := c.Batch
	if batch <= 0 {
		batch = DefaultCleanupBatch
	}
	n, err := c.Purger.PurgeExpired(ctx, batch)
	result := CleanupOK
	switch {
	case errors.Is(err, ErrCleanupBusy):
		result = CleanupSkipped
	case err != nil:
		if ctx.Err() != nil {
			return CleanupError, n // shutting down
		}
		result = CleanupError
		c.logger().WarnContext(ctx, "cleanup failed", "err", err, "deleted", n)
	case n > 0:
		c.logger().InfoContext(ctx, "cleanup", "deleted", n, "duration_ms", time.Since(start).Milliseconds())
	}
	if c.Observer != nil {
		c.Observer.CleanupRun(result, n, time.Since(start))
	}
	return result, n
}

func (c Cleanup) logger() *slog.Logger {
	if c.Logger == nil {
		return slog.Default()
	}
	return c.Logger
}
