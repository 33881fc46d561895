package idempotency

import (
	"context"
	"sync"
	"time"
)

// collapser lets one request per (scope, key) at a time go to the store
// from this instance; concurrent duplicates wait here for it to finish,
// holding no database connection. Without it, a thousand duplicates of one
// slow operation would each hold a pooled connection blocked on the first
// one's row for the whole wait, starving requests with other keys. It is
// only an optimisation: the store alone decides who runs the operation, on
// this instance or any other.
type collapser struct {
	mu      sync.Mutex
	running map[flightKey]chan struct{}
}

type flightKey struct {
	scope string
	key   string
}

func newCollapser() *collapser { return &collapser{running: map[flightKey]chan struct{}{}} }

// enter lets the first request for (scope, key) through at once, holding
// the key on this instance until it calls leave. A concurrent duplicate
// waits until that holder has finished and is then let through too, with
// every other request that waited (leave is then a no-op for it): by then
// the key's outcome is stored, so they are quick replays, and serialising
// them would only make some of them time out into a false 202. It gives up
// when wait runs out or ctx ends, and then reports false. queued reports
// whether the request waited behind another.
func (c *collapser) enter(ctx context.Context, scope, key string, wait time.Duration) (leave func(), queued, ok bool) {
	k := flightKey{scope, key}
	c.mu.Lock()
	busy, held := c.running[k]
	if !held {
		done := make(chan struct{})
		c.running[k] = done
		c.mu.Unlock()
		return func() {
			c.mu.Lock()
			delete(c.running, k)
			c.mu.Unlock()
			close(done)
		}, false, true
	}
	c.mu.Unlock()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-busy:
		return func() {}, true, true
	case <-timer.C:
		return nil, true, false
	case <-ctx.Done():
		return nil, true, false
	}
}
