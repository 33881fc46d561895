package idempotency

import (
	"context"
	"sync"
	"time"
)

// detachedFor bounds how long a detached context lives.
const detachedFor = 10 * time.Second

// detach keeps ctx's values but not its cancellation: once the operation
// has run, its outcome is stored even if the client disconnected. It keeps
// ctx's deadline, so that a store that stops answering turns a request into
// an error at its deadline rather than later, and bounds the rest to 10s.
// The caller calls cancel once done with it, as with a CancelFunc.
func detach(ctx context.Context) *detached {
	return detachWithin(ctx, detachedFor)
}

// detachWithin is detach bounding the rest to d (at most detachedFor).
func detachWithin(ctx context.Context, d time.Duration) *detached {
	deadline := time.Now().Add(min(d, detachedFor))
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	return &detached{Context: context.WithoutCancel(ctx), deadline: deadline}
}

// detached is context.WithDeadline(context.WithoutCancel(ctx), deadline),
// except that the timer that ends it at its deadline is started only when
// something asks for Done (or for Err once the deadline has passed): a
// commit to memstore, which never blocks, never does, and so costs no
// timer, no timer context and no cancel function on every request. Once
// made, the timer context answers for it entirely, so that contexts
// derived from it hang on that context as they would on any other.
type detached struct {
	context.Context // WithoutCancel of the request's: its values
	deadline        time.Time

	mu       sync.Mutex
	timed    context.Context // WithDeadline(Context, deadline), once asked for
	stop     context.CancelFunc
	canceled bool
}

// Deadline implements context.Context.
func (d *detached) Deadline() (time.Time, bool) { return d.deadline, true }

// Done implements context.Context, starting the timer.
func (d *detached) Done() <-chan struct{} { return d.timer().Done() }

// Err implements context.Context. Before the deadline and before cancel,
// Done, whether made or not, is open, and Err nil.
func (d *detached) Err() error {
	d.mu.Lock()
	timed, canceled := d.timed, d.canceled
	d.mu.Unlock()
	if timed == nil && !canceled && time.Now().Before(d.deadline) {
		return nil
	}
	return d.timer().Err()
}

// Value implements context.Context: the request's values, and, once the
// timer context is made, what it adds (how context finds the cancelable
// parent of a context derived from this one).
func (d *detached) Value(key any) any {
	d.mu.Lock()
	timed := d.timed
	d.mu.Unlock()
	if timed != nil {
		return timed.Value(key)
	}
	return d.Context.Value(key)
}

// timer returns the timer context, made on first use; ended already if
// cancel was called.
func (d *detached) timer() context.Context {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timed == nil {
		d.timed, d.stop = context.WithDeadline(d.Context, d.deadline)
		if d.canceled {
			d.stop()
		}
	}
	return d.timed
}

// cancel ends d and releases its timer, as a CancelFunc does.
func (d *detached) cancel() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.canceled = true
	if d.stop != nil {
		d.stop()
	}
}
