package idempotency

import (
	"context"
	"log/slog"
	"time"
)

// Purger deletes expired records in bounded batches.
type Purger interface {
	PurgeExpired(ctx context.Context, batch int) (int64, error)
}

// RunCleanup purges expired keys every interval until ctx ends. Expired keys
// are already treated as absent when claimed, so cleanup only reclaims
// space; a failed run is logged and retried at the next tick.
func RunCleanup(ctx context.Context, p Purger, interval time.Duration, batch int, log *slog.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		start := time.Now()
		n, err := p.PurgeExpired(ctx, batch)
		if err != nil && ctx.Err() == nil {
			log.WarnContext(ctx, "cleanup failed", "err", err, "deleted", n)
			continue
		}
		if n > 0 {
			log.InfoContext(ctx, "cleanup", "deleted", n, "duration_ms", time.Since(start).Milliseconds())
		}
	}
}
