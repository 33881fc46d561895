package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of HeldConfig's bounds on the outcomes kept in memory until
// their store takes them.
const (
	defaultMaxPending      = 10_000
	defaultMaxPendingBytes = 64 << 20
)

// The backoff between attempts to store a held operation's outcome: from
// the first to the last, doubling, each with some jitter so that the
// settles a database outage left behind do not all return at once.
const (
	settleRetryFirst = 50 * time.Millisecond
	settleRetryMax   = 5 * time.Second
)

// Why an outcome was given up before its store took it (see
// Observer.SettleDropped).
const (
	droppedBound    = "bound"
	droppedShutdown = "shutdown"
	droppedExpired  = "expired"
)

// recordID names a key in logs without the key itself: the first 8 bytes
// of the SHA-256 of its scope, a zero byte and its key, in hex. The engine
// logs it in place of the key, which is a client's secret for as long as
// it can be replayed; an operator who has the key computes the same id
// (docs/gateway.md says how).
func recordID(scope, key string) string {
	h := sha256.New()
	h.Write([]byte(scope))
	h.Write([]byte{0})
	h.Write([]byte(key))
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// pendingKey names a key whose outcome waits in memory, as the engine's
// queue of duplicates names one: by scope and key.
type pendingKey struct{ scope, key string }

// pendingSettle is a held operation's outcome that its store has not
// taken yet: the settle or release of one claim, and what a log needs to
// name it.
type pendingSettle struct {
	ref     Ref
	fp      Fingerprint
	resp    *Response // nil: the key is to be released
	settler settler
	size    int64
	expires time.Time // the key's TTL: past it, there is nothing to keep
	// label, method and path name the operation and request in logs.
	label, method, path string
	// unsure: the hold itself may not have committed, so a release that
	// finds no record is no news.
	unsure bool
	// nudge asks the retry to try at once: a retry of a key to be
	// released waits for it.
	nudge chan struct{}
}

// attempt stores p's outcome once; settled is false when the record is
// no longer the one p holds (released by an operator, or claimed again
// after it expired).
func (p *pendingSettle) attempt(ctx context.Context) (settled bool, err error) {
	if p.resp == nil {
		return p.settler.Release(ctx, p.ref)
	}
	return p.settler.Settle(ctx, p.ref, *p.resp)
}

// logAttrs name p in logs: the scope as stored, a record id in place of
// the key (see recordID), the request's method and path.
func (p *pendingSettle) logAttrs(err error, attempts int) []any {
	attrs := []any{"operation", p.label, "scope", p.ref.Scope, "record", recordID(p.ref.Scope, p.ref.Key),
		"method", p.method, "path", p.path, "attempts", attempts}
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	return attrs
}

// pendingSettles are an engine's outcomes that their store did not take:
// each is kept in memory, within bounds, so that the engine answers its
// key's retries from it, and retried with backoff until the store takes it
// or Shutdown.
type pendingSettles struct {
	log *slog.Logger
	obs Observer

	// ctx ends at Shutdown, and with it the retries.
	ctx  context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup

	// n is len(byKey), read without the lock: most requests meet no
	// pending outcome, and pay one atomic load for it.
	n      atomic.Int64
	mu     sync.Mutex
	byKey  map[pendingKey]*pendingSettle
	bytes  int64
	closed bool
}

func newPendingSettles(log *slog.Logger, obs Observer) *pendingSettles {
	ps := &pendingSettles{log: log, obs: obs, byKey: map[pendingKey]*pendingSettle{}}
	ps.ctx, ps.stop = context.WithCancel(context.Background())
	return ps
}

// settle stores a held operation's outcome: at once, within ctx, and,
// when the store fails, kept in memory and retried until it takes it. It
// takes the outcome by value, so that one stored at once, as nearly all
// are, costs no allocation of its own.
func (ps *pendingSettles) settle(ctx context.Context, held *heldOperation, outcome pendingSettle) {
	settled, err := outcome.attempt(ctx)
	switch {
	case err == nil && !settled && !outcome.unsure:
		ps.log.WarnContext(ctx, "idempotency: a held key changed while its operation ran (released by an operator, or expired)", outcome.logAttrs(nil, 1)...)
		return
	case err == nil:
		return
	}
	p := new(pendingSettle)
	*p = outcome
	ps.failedAttempt(p)
	if !ps.keep(held, p) {
		ps.log.ErrorContext(ctx, "idempotency: a held key could not be settled, and its outcome is not kept to retry (past the bound on outcomes kept in memory, or shutting down); its outcome is unknown once its lease ends", p.logAttrs(err, 1)...)
		return
	}
	ps.log.ErrorContext(ctx, "idempotency: a held key could not be settled; its outcome is kept in memory, answers this process's retries, and is retried until stored", p.logAttrs(err, 1)...)
}

// keep adds p within held's bounds and starts its retries; false, counted
// as dropped, when it is past them or the engine is shutting down.
func (ps *pendingSettles) keep(held *heldOperation, p *pendingSettle) bool {
	if p.resp != nil {
		p.size = int64(len(p.resp.Body))
		for name, values := range p.resp.Header {
			p.size += int64(len(name))
			for _, v := range values {
				p.size += int64(len(v))
			}
		}
	}
	p.size += int64(len(p.ref.Scope) + len(p.ref.Key) + len(p.path))
	p.nudge = make(chan struct{}, 1)
	ps.mu.Lock()
	k := pendingKey{p.ref.Scope, p.ref.Key}
	old := ps.byKey[k]
	count, bytes := len(ps.byKey), ps.bytes
	if old != nil {
		count, bytes = count-1, bytes-old.size
	}
	if ps.closed || count >= held.MaxPending || bytes+p.size > held.MaxPendingBytes {
		closed := ps.closed
		ps.mu.Unlock()
		reason := droppedBound
		if closed {
			reason = droppedShutdown
		}
		ps.dropped(p, reason)
		return false
	}
	if old != nil {
		// A later claim of the key: its outcome is the one to keep, and
		// the earlier one's retry ends with it.
		ps.removeLocked(k, old)
	}
	ps.byKey[k] = p
	ps.bytes += p.size
	ps.n.Add(1)
	ps.wg.Add(1)
	ps.mu.Unlock()
	ps.obs.SettlesPending(1)
	go ps.retry(p)
	return true
}

// retry tries p again, with backoff, until the store takes it, its key
// expires, or Shutdown (which tries it once more itself).
func (ps *pendingSettles) retry(p *pendingSettle) {
	defer ps.wg.Done()
	wait := settleRetryFirst
	for attempts := 2; ; attempts++ {
		t := time.NewTimer(wait/2 + rand.N(wait/2+1))
		select {
		case <-ps.ctx.Done():
			t.Stop()
			return
		case <-p.nudge:
			t.Stop()
		case <-t.C:
		}
		if !ps.holds(p) {
			return // replaced by a later claim of its key
		}
		if time.Now().After(p.expires) {
			ps.forget(p)
			ps.dropped(p, droppedExpired)
			ps.log.Error("idempotency: a held key expired before its outcome could be stored", p.logAttrs(nil, attempts-1)...)
			return
		}
		actx, cancel := context.WithTimeout(ps.ctx, detachedFor)
		settled, err := p.attempt(actx)
		cancel()
		if err == nil {
			ps.forget(p)
			if settled {
				ps.log.Info("idempotency: a held key's outcome was stored after its store failed; every replica replays it now", p.logAttrs(nil, attempts)...)
			} else if !p.unsure {
				ps.log.Warn("idempotency: a held key changed before its outcome could be stored (released by an operator, or expired); its outcome is not stored", p.logAttrs(nil, attempts)...)
			}
			return
		}
		if ps.ctx.Err() != nil {
			return // Shutdown cut the attempt short, and tries once more
		}
		ps.failedAttempt(p)
		ps.log.Warn("idempotency: a held key still could not be settled; retrying", p.logAttrs(err, attempts)...)
		wait = min(wait*2, settleRetryMax)
	}
}

// remembered is what a held operation's key holds in memory while its
// store has not taken it, as a record the store would return: nil when
// there is none to answer from. A key to be released has none (it is
// free once released: its retry is nudged to try at once, and the request
// claims), and neither has a key of unknown outcome that retryUnknown
// runs again (its claim finds it held, as on any other process).
func (ps *pendingSettles) remembered(scope, key string, retryUnknown bool) *Record {
	if ps.n.Load() == 0 {
		return nil
	}
	ps.mu.Lock()
	p := ps.byKey[pendingKey{scope, key}]
	ps.mu.Unlock()
	switch {
	case p == nil:
		return nil
	case p.resp == nil:
		select {
		case p.nudge <- struct{}{}:
		default:
		}
		return nil
	}
	if h, ok := ParseHeld(*p.resp, time.Time{}); ok && retryUnknown && h.State == HeldUnknown {
		return nil
	}
	return &Record{Fingerprint: p.fp, Response: *p.resp, CreatedAt: p.ref.ClaimedAt, ExpiresAt: p.expires}
}

// holds reports whether p is still its key's pending outcome.
func (ps *pendingSettles) holds(p *pendingSettle) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.byKey[pendingKey{p.ref.Scope, p.ref.Key}] == p
}

// forget removes p, if it is still its key's pending outcome.
func (ps *pendingSettles) forget(p *pendingSettle) {
	ps.mu.Lock()
	k := pendingKey{p.ref.Scope, p.ref.Key}
	if ps.byKey[k] != p {
		ps.mu.Unlock()
		return
	}
	ps.removeLocked(k, p)
	ps.mu.Unlock()
}

// removeLocked removes p, stored under k; ps.mu is held.
func (ps *pendingSettles) removeLocked(k pendingKey, p *pendingSettle) {
	delete(ps.byKey, k)
	ps.bytes -= p.size
	ps.n.Add(-1)
	ps.obs.SettlesPending(-1)
}

func (ps *pendingSettles) failedAttempt(p *pendingSettle) {
	ps.obs.SettleFailed(p.label)
}

func (ps *pendingSettles) dropped(p *pendingSettle, reason string) {
	ps.obs.SettleDropped(p.label, reason)
}

// shutdown ends the retries, tries each outcome still kept once more
// within ctx, and logs each that is left.
func (ps *pendingSettles) shutdown(ctx context.Context) error {
	ps.mu.Lock()
	ps.closed = true
	ps.mu.Unlock()
	ps.stop()
	ps.wg.Wait()
	ps.mu.Lock()
	left := make([]*pendingSettle, 0, len(ps.byKey))
	for _, p := range ps.byKey {
		left = append(left, p)
	}
	ps.mu.Unlock()
	var lost int
	for _, p := range left {
		_, err := p.attempt(ctx)
		ps.forget(p)
		if err == nil {
			continue
		}
		lost++
		ps.dropped(p, droppedShutdown)
		ps.log.Error("idempotency: a held key could not be settled before shutdown; its outcome is unknown once its lease ends", p.logAttrs(err, 0)...)
	}
	if lost > 0 {
		return fmt.Errorf("idempotency: %d held keys could not be settled before shutdown; their outcomes are unknown once their leases end", lost)
	}
	return nil
}

// Shutdown ends the retries of held operations' outcomes that their store
// did not take (see HeldConfig.MaxPending): each still kept is tried once
// more, within ctx, and each that is left is logged, its key of unknown
// outcome once its lease ends. A server calls it once it has stopped
// serving; from then on an outcome that its store does not take at once is
// logged and given up. It returns an error saying how many were left.
func (e *Engine) Shutdown(ctx context.Context) error {
	err := e.settles.shutdown(ctx)
	if errors.Is(ctx.Err(), context.DeadlineExceeded) && err != nil {
		return fmt.Errorf("%w (the shutdown's time ran out)", err)
	}
	return err
}
