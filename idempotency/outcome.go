package idempotency

import "time"

// Outcome is what the protocol did with one request. Logs, metrics and
// traces report it; it has a small fixed set of values so it can be a label.
// The zero value, "", is no outcome: the request was not under the
// protocol (a safe method).
type Outcome string

// The outcomes.
const (
	OutcomeExecuted Outcome = "executed"  // the operation ran and its response was stored
	OutcomeReplayed Outcome = "replayed"  // the stored response was sent again
	OutcomeConflict Outcome = "conflict"  // 409: the key belongs to another request
	OutcomeInFlight Outcome = "in_flight" // 202: the first request was still running
	OutcomeRejected Outcome = "rejected"  // 4xx before or instead of the operation; no key consumed
	OutcomeError    Outcome = "error"     // 5xx; nothing stored

	OutcomeUnknown   Outcome = "outcome_unknown" // 409: a held operation may have run, and its outcome is unknown
	OutcomeNotStored Outcome = "not_stored"      // 409: a held operation ran, and its response was not stored
)

// Observer receives what the protocol did, for metrics. operation is the
// operation's name (see OperationConfig.Name): a bounded set of values.
type Observer interface {
	// Outcome reports how one request under the protocol ended, once per
	// request.
	Outcome(operation string, o Outcome)
	// DuplicateWait reports how long a request that did not run the
	// operation (replayed, in_flight, conflict) spent claiming its key,
	// which includes any wait for an in-flight first request.
	DuplicateWait(operation string, o Outcome, d time.Duration)

	// The settles of held operations' outcomes that their store did not
	// take at once:

	// SettleFailed reports one failed attempt to store a held operation's
	// outcome (Store.Settle or Release).
	SettleFailed(operation string)
	// SettlesPending reports that the outcomes kept in memory, waiting
	// for their store, changed in number by delta.
	SettlesPending(delta int)
	// SettleDropped reports an outcome given up before its store took it:
	// its key stays held, and its outcome is unknown once its lease ends.
	// reason is one of "bound" (the engine kept as many outcomes, or
	// bytes, as HeldConfig.MaxPending or MaxPendingBytes allow),
	// "shutdown" (Engine.Shutdown's last attempt failed too) and
	// "expired" (the key's TTL ended before its store took it).
	SettleDropped(operation, reason string)

	// Repeated reports a request that repeats, under another key, one its
	// operation ran or runs within the window (Config.RepeatWindow): most
	// likely a client that makes a new key per attempt, whose every retry
	// runs the operation again. refused: the operation refused it
	// (OperationConfig.RefuseRepeats); otherwise it ran.
	Repeated(operation string, refused bool)
}

type noObserver struct{}

func (noObserver) Outcome(string, Outcome)                      {}
func (noObserver) DuplicateWait(string, Outcome, time.Duration) {}
func (noObserver) SettleFailed(string)                          {}
func (noObserver) SettlesPending(int)                           {}
func (noObserver) SettleDropped(string, string)                 {}
func (noObserver) Repeated(string, bool)                        {}
