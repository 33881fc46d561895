package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"
)

// StatusHeld is the stored status of a held record (see Held): 102
// Processing, which is never a final HTTP status, so that no store, cache
// or replay can take a held record for an operation's outcome.
const StatusHeld = 102

// ErrOutcomeUnknown answers a request whose key holds an operation that may
// have run and whose outcome nobody will learn: a gateway wrote the request
// upstream and no answer came (a timeout, a reset, a crash). Running it
// again could run it twice, so the key stays so until an operator settles
// or releases it, or it expires: 409.
var ErrOutcomeUnknown = errors.New("the request with this Idempotency-Key may have run, and its outcome is unknown (the upstream took it and never answered): it is not run again under this key; check whether it took effect, then use a new key if it did not")

// ErrNotStored answers a request whose key holds an operation that ran but
// whose response was not stored (larger than the limit, broken off, or a
// stream on a store that keeps no pieces), so
// it cannot be replayed: 409. It never runs again under this key.
var ErrNotStored = errors.New("the request with this Idempotency-Key ran, but its response was not stored (too large, or broken off), so it cannot be replayed; it is not run again under this key")

// The states of a held record (Held.State): what it knows of its
// operation.
const (
	// HeldRunning: the operation runs now, until Held.Until at the latest.
	HeldRunning = "running"
	// HeldUnknown: the operation may have run; its outcome is unknown.
	HeldUnknown = "unknown"
	// HeldNotStored: the operation ran; its response was not kept.
	HeldNotStored = "not-stored"
)

// Held is what a key holds while an operation that runs outside the
// store's unit of work (a gateway's call to an upstream) is running, or
// once its outcome turned out unknown or unstorable. A held operation
// commits it before it starts, so that no crash can free its key for a
// second run; it is stored as a record of status StatusHeld, and replaced
// (Store.Settle) or deleted (Store.Release) once the outcome is known.
type Held struct {
	// State is HeldRunning, HeldUnknown or HeldNotStored.
	State string `json:"state"`
	// Until bounds a running operation: past it, its holder is presumed
	// gone, and the outcome is unknown. It is on the store's clock where
	// the store keeps one (see Lease and Record.ReadAt), so that processes
	// whose clocks disagree agree on when a lease ends; else on the
	// holder's.
	Until time.Time `json:"until,omitzero"`
	// Lease is a running operation's lease (HeldConfig.Lease), from when
	// its record is stored. A store that keeps a clock of its own (a
	// database's now()) sets Until to its time plus Lease as it stores the
	// record, and says what time it is when it reads one (Record.ReadAt).
	// Zero in records written before it was kept.
	Lease time.Duration `json:"lease_ns,omitempty"`
	// Reason says, for people, why the outcome is unknown or not stored.
	Reason string `json:"reason,omitempty"`
	// Holder names the process that held the key (HeldConfig.Holder), and
	// Path is the path its request was sent to (as the client spelled it),
	// so that an operator settling a key of unknown outcome knows which
	// gateway's and upstream's logs to read. Empty in records written
	// before they were kept.
	Holder string `json:"holder,omitempty"`
	Path   string `json:"path,omitempty"`
}

// Response is h as stored.
func (h Held) Response() Response {
	body, _ := json.Marshal(h)
	return Response{Status: StatusHeld, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: body}
}

// ParseHeld reads a stored response as a held record; false when it is an
// operation's outcome. Its State is the record's at now, a time on the
// clock of Until (the store's, Record.ReadAt, where the store keeps one):
// a running operation past its Until is unknown, its holder presumed gone.
// A zero now reads the state as stored.
func ParseHeld(resp Response, now time.Time) (Held, bool) {
	if resp.Status != StatusHeld {
		return Held{}, false
	}
	var h Held
	if err := json.Unmarshal(resp.Body, &h); err != nil || h.State == "" {
		return Held{State: HeldUnknown, Reason: "unreadable held record"}, true
	}
	if h.State == HeldRunning && !now.IsZero() && !now.Before(h.Until) {
		h.State = HeldUnknown
	}
	return h, true
}

// settler is what a held operation needs of its store: to change a
// record committed already (Store.Settle and Release).
type settler interface {
	Settle(ctx context.Context, ref Ref, resp Response) (bool, error)
	Release(ctx context.Context, ref Ref) (bool, error)
}

// HeldConfig makes an operation held: it runs outside the store's unit of
// work, as a gateway's call to an upstream does, so its claim is committed
// before it runs and settled after. A held operation's handler never gets a
// unit of work.
type HeldConfig struct {
	// Lease bounds how long the operation may run (a gateway's upstream
	// timeout, and some margin). Past it, a holder that neither settled
	// nor released the key is presumed gone, and the outcome is unknown:
	// never a second run. So that a live holder never outlasts it, the
	// handler's context ends heldSettleMargin before the lease does
	// (unless its response already passes through, which is recorded),
	// and it does not end when the client goes away: the outcome is still
	// settled. A key is kept at least as long as its lease.
	Lease time.Duration
	// MaxStored bounds the response kept for replays (default 64 MiB).
	// One larger than a piece (256 KiB), and a stream (text/event-stream)
	// from its first byte, is stored in pieces as it passes
	// (Store.WritePiece), so memory holds a piece of it at a time, and a
	// request that finds it still passing follows it. One larger than
	// MaxStored, or, where the store keeps no pieces, a stream or one over
	// 1 MiB, passes through to the client once, and the key records that it
	// was not stored. Negative stores none, an empty one neither: every
	// response passes through as it comes, for an operation whose answers
	// must not be kept.
	MaxStored int64
	// RetryUnknown runs an operation whose outcome is unknown again, under
	// the same key, instead of answering ErrOutcomeUnknown: for an upstream
	// that deduplicates the Idempotency-Key it is passed itself.
	RetryUnknown bool
	// Holder names this process in the held records it writes (Held.Holder),
	// for operators: by default the host's name and the process id
	// (host:pid).
	Holder string
	// MaxPending and MaxPendingBytes bound the outcomes the engine keeps
	// in memory because their store did not take them (a database blip):
	// each is retried with backoff until the store takes it (every
	// replica replays it then) or Engine.Shutdown, and the engine answers
	// its key's retries from it meanwhile, as the store would. Other
	// processes find the key held until its lease ends, and of unknown
	// outcome after, until the store takes it. Past either bound (default
	// 10,000 outcomes, 64 MiB of responses) an outcome is not kept: it is
	// logged and counted (Observer.SettleDropped), and its key is of
	// unknown outcome once its lease ends, as if its process had died.
	MaxPending      int
	MaxPendingBytes int64
}

// defaultMaxStored is the largest response a held operation stores unless
// HeldConfig.MaxStored says otherwise.
const defaultMaxStored = 64 << 20

// newHeld is the held part of an operation declared with
// OperationConfig.Held, its zero fields defaulted.
func newHeld(held HeldConfig, store settler) *heldOperation {
	if held.Lease <= 0 {
		held.Lease = time.Minute
	}
	if held.MaxStored == 0 {
		held.MaxStored = defaultMaxStored
	}
	if held.Holder == "" {
		held.Holder = defaultHolder()
	}
	if held.MaxPending <= 0 {
		held.MaxPending = defaultMaxPending
	}
	if held.MaxPendingBytes <= 0 {
		held.MaxPendingBytes = defaultMaxPendingBytes
	}
	return &heldOperation{HeldConfig: held, settler: store}
}

// defaultHolder is HeldConfig.Holder's default: host:pid.
func defaultHolder() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown-host"
	}
	return host + ":" + strconv.Itoa(os.Getpid())
}

type heldOperation struct {
	HeldConfig
	settler settler
}

// holdSlack is how long committing a held operation's hold may take beyond
// the operation's wait: on a deferring store that commit is the claim, whose
// statement pgstore bounds by the wait plus 2 s, after waiting for a
// connection of the pool.
const holdSlack = 5 * time.Second

// heldPoll is how often a request polls a key held by a running operation
// elsewhere: a held record is committed, so the store has no lock to wait
// on.
const heldPoll = 20 * time.Millisecond

// heldAt reads rec as a held record, judged at the time rec was read: a
// store with a clock of its own set Until on it, and says what time it is
// there (the holder's clock and this process's may differ by more than a
// lease); else on this process's clock.
func (o *Operation[U]) heldAt(rec *Record) (Held, bool) {
	now := rec.ReadAt
	if now.IsZero() {
		now = o.e.now()
	}
	return ParseHeld(rec.Response, now)
}

// meetHeld decides what a request does about a key that holds h (read by
// heldAt): wait for it (true), or answer err.
func (o *Operation[U]) meetHeld(ctx context.Context, h Held, ref Ref, budget time.Duration) (again bool, err error) {
	switch h.State {
	case HeldRunning:
		if budget <= 0 {
			return false, ErrInFlight
		}
		t := time.NewTimer(min(heldPoll, budget))
		defer t.Stop()
		select {
		case <-t.C:
			return true, nil
		case <-ctx.Done():
			return false, ctx.Err()
		}
	case HeldNotStored:
		return false, ErrNotStored
	}
	if o.held == nil || !o.held.RetryUnknown {
		return false, ErrOutcomeUnknown
	}
	// The upstream deduplicates the key itself: free it, and claim again.
	// Of several requests that do so at once, one releases the record and
	// the others find the key claimed anew.
	if _, err := o.held.settler.Release(ctx, ref); err != nil {
		return false, fmt.Errorf("release a key whose outcome is unknown: %w", err)
	}
	return true, nil
}

// hold commits the key as held under lease, before the operation runs, so
// that from then on only a settle or a release frees it. An error is what
// answers the request, or what the store found holding the key
// (*TakenError, ErrInFlight), nothing written.
func (d *Decision[U]) hold(ctx context.Context, lease Lease[U]) error {
	e, held := d.op.e, d.op.held
	// The lease counts from here on this process's monotonic clock; the
	// record's Until is on the store's clock where it keeps one (Held.Lease).
	d.heldSince = time.Now()
	// The hold is the claim itself on a deferring store: bounded by the
	// wait, and holdSlack for the connection and the statement, so that a
	// key table that does not answer (locked) gets its 503 soon.
	dctx := detachWithin(ctx, d.op.cfg.Wait+holdSlack)
	err := lease.Commit(dctx, d.mark(Held{State: HeldRunning, Until: e.now().Add(held.Lease), Lease: held.Lease}))
	dctx.cancel()
	if err == nil {
		return nil
	}
	var taken *TakenError
	if errors.As(err, &taken) || errors.Is(err, ErrInFlight) {
		return err // nothing was written
	}
	// The hold may have committed all the same (its answer lost): nothing
	// ran, so free the key if it is held under this claim, retried as any
	// settle is. Not on the client's time: a store that did not answer the
	// hold (a locked key table) may not answer this either, and the 503
	// must not wait for it (it did, 10 s more).
	rctx := detach(ctx)
	p := d.pending(lease.Ref(), nil)
	p.unsure = true
	go func() {
		defer rctx.cancel()
		e.settles.settle(rctx, held, p)
	}()
	return d.fail(ctx, fmt.Errorf("hold idempotency key: %w", err))
}

// mark signs a held record with its holder and the request's path, for
// the operator who settles it.
func (d *Decision[U]) mark(h Held) Response {
	h.Holder, h.Path = d.op.held.Holder, d.req.Path
	return h.Response()
}

// pending is the settle of ref's record with resp (nil: its release).
func (d *Decision[U]) pending(ref Ref, resp *Response) pendingSettle {
	return pendingSettle{
		ref: ref, fp: d.fp, resp: resp, settler: d.op.held.settler, expires: time.Now().Add(d.op.cfg.TTL),
		label: d.label, method: d.req.Method, path: d.req.Path,
	}
}

// settleHeld ends a held operation's run with resp, as Finish does: a held
// record (unknown, not stored) is settled marked, an outcome is settled as
// it is, and a response that is not one releases the key.
func (d *Decision[U]) settleHeld(ctx context.Context, resp Response) {
	var stored *Response
	outcome := OutcomeExecuted
	switch h, ok := ParseHeld(resp, time.Time{}); {
	case ok:
		marked := d.mark(h)
		stored = &marked
		if h.State == HeldUnknown {
			outcome = OutcomeUnknown
		}
	case !replayable(resp.Status):
		outcome = ""
	default:
		stored = &resp
	}
	// Repeats learn the outcome before it is counted, so that whoever
	// sees the count sees a finished run.
	d.repeatDone(stored)
	if outcome == "" {
		d.finished(resp.Status)
	} else {
		d.report(outcome)
	}
	sctx := detach(ctx)
	defer sctx.cancel()
	d.op.e.settles.settle(sctx, d.op.held, d.pending(d.Ref, stored))
}
