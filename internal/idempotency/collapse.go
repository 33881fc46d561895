package idempotency

import (
	"context"
	"sync"
	"time"

	"github.com/google/uuid"
)

// collapser lets one request per (account, key) at a time go to the store
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
	account uuid.UUID
	key     string
}

func newCollapser() *collapser { return &collapser{running: map[flightKey]chan struct{}{}} }

// enter waits until no other request of this instance holds (account, key),
// then holds it itself; it returns the function that lets it go. It gives up
// when wait runs out or ctx ends, and then reports false.
func (c *collapser) enter(ctx context.Context, account uuid.UUID, key string, wait time.Duration) (leave func(), ok bool) {
	k := flightKey{account, key}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
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
			}, true
		}
		c.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(wait)
		}
		select {
		case <-busy: // its holder finished: look again (its outcome is stored, or the key is free)
		case <-timer.C:
			return nil, false
		case <-ctx.Done():
			return nil, false
		}
	}
}
