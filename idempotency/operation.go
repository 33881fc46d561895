package idempotency

import (
	"strconv"
	"sync/atomic"
	"time"
)

// OperationConfig configures one operation; zero fields take the engine's.
type OperationConfig struct {
	// Name labels the operation in metrics; empty names it by method and
	// route pattern ("POST /widgets"), as oapi.Bind does.
	Name string
	// TTL overrides Config.TTL for this operation.
	TTL time.Duration
	// Wait overrides Config.Wait for this operation.
	Wait time.Duration
	// RepeatWindow overrides Config.RepeatWindow for this operation;
	// negative turns spotting repeats off, for an operation where the same
	// request under a new key is normal (a top-up of the same amount).
	RepeatWindow time.Duration
	// RefuseRepeats refuses, rather than only reports, a request that
	// repeats under another key one the operation ran or runs within the
	// window: 409 repeated-request, which names the earlier request,
	// stores nothing and consumes no key. A client that means the repeat
	// says so with Idempotency-Repeat: ?1 (Request.Repeat). It holds per
	// process: see docs/protocol.md.
	RefuseRepeats bool
	// Held, when set, makes the operation held (see HeldConfig): its
	// store must then keep held records (Store.Settle), as pgstore and
	// memstore do, and any store in front of them.
	Held *HeldConfig
}

// Operation is one unsafe operation under the protocol, whose claims its
// store makes and whose handler writes through the store's unit of work, of
// type U. The store, and with it U, is fixed when the operation is
// declared: a write-only operation declared on a store that defers its
// claim to the commit gets a unit that can only queue writes, and the
// compiler holds its handler to that.
type Operation[U any] struct {
	e     *Engine
	store Store[U]
	cfg   OperationConfig
	held  *heldOperation // nil unless declared with OperationConfig.Held
	// retention is cfg.TTL in whole seconds, the value of the
	// Idempotency-TTL header on the operation's answers (Serve).
	retention string
	// named is the label last made of a method and route, for an operation
	// without a name: an operation is nearly always served on one route,
	// so its requests share one label instead of each making its own.
	named atomic.Pointer[routeLabel]
}

// routeLabel is the label of an operation served with method on route.
type routeLabel struct{ method, route, label string }

// NewOperation declares an operation of e whose keys store keeps.
func NewOperation[U any](e *Engine, store Store[U], cfg OperationConfig) *Operation[U] {
	if cfg.TTL <= 0 {
		cfg.TTL = e.cfg.TTL
	}
	if cfg.Wait <= 0 {
		cfg.Wait = e.cfg.Wait
	}
	if cfg.RepeatWindow == 0 {
		cfg.RepeatWindow = e.cfg.RepeatWindow
	}
	cfg.RefuseRepeats = cfg.RefuseRepeats || e.cfg.RefuseRepeats
	op := &Operation[U]{e: e, store: store, cfg: cfg}
	if cfg.Held != nil {
		op.held = newHeld(*cfg.Held, store)
		op.cfg.Held = &op.held.HeldConfig
		// A key that expired while its operation ran could be claimed
		// again, and run twice: a held key lives at least as long as its
		// lease.
		op.cfg.TTL = max(op.cfg.TTL, op.held.Lease)
	}
	// Rounded down: a client told a second more than the store keeps
	// could retry into an expired key.
	op.retention = strconv.FormatInt(int64(op.cfg.TTL/time.Second), 10)
	return op
}

// labelOf names the operation, served with method on route, for metrics:
// OperationName(method, route) unless it has a name of its own.
func (o *Operation[U]) labelOf(method, route string) string {
	if o.cfg.Name != "" {
		return o.cfg.Name
	}
	if l := o.named.Load(); l != nil && l.method == method && l.route == route {
		return l.label
	}
	l := &routeLabel{method: method, route: route, label: OperationName(method, route)}
	o.named.Store(l)
	return l.label
}
