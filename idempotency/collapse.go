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
	mu sync.Mutex
	// running holds the keys held on this instance, each with the channel
	// closed when its holder leaves: nil until a duplicate comes to wait on
	// it, as most keys never see one.
	running map[flightKey]chan struct{}
}

type flightKey struct {
	scope string
	key   string
}

func newCollapser() *collapser { return &collapser{running: map[flightKey]chan struct{}{}} }

// enter lets the first request for (scope, key) through at once, holding
// the key on this instance until it calls leave (holds reports that it
// must). A concurrent duplicate waits until that holder has finished and
// is then let through too, with every other request that waited, holding
// nothing: by then the key's outcome is stored, so they are quick replays,
// and serialising them would only make some of them time out into a false
// 202. It gives up when wait runs out or ctx ends, and then reports false.
// queued reports whether the request waited behind another. The holder's
// way through allocates nothing: it is every request's.
func (c *collapser) enter(ctx context.Context, scope, key string, wait time.Duration) (holds, queued, ok bool) {
	k := flightKey{scope, key}
	c.mu.Lock()
	busy, running := c.running[k]
	if !running {
		c.running[k] = nil
		c.mu.Unlock()
		return true, false, true
	}
	if busy == nil {
		busy = make(chan struct{})
		c.running[k] = busy
	}
	c.mu.Unlock()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-busy:
		return false, true, true
	case <-timer.C:
		return false, true, false
	case <-ctx.Done():
		return false, true, false
	}
}

// leave ends the hold of (scope, key) that enter gave, letting through
// whoever waits for it.
func (c *collapser) leave(scope, key string) {
	k := flightKey{scope, key}
	c.mu.Lock()
	busy := c.running[k]
	delete(c.running, k)
	c.mu.Unlock()
	if busy != nil {
		close(busy)
	}
}
