package idempotency

import "context"

// Outcome is what the protocol did with one request. Logs, metrics and
// traces report it; it has a small fixed set of values so it can be a label.
type Outcome string

// The outcomes.
const (
	OutcomeNone     Outcome = ""          // not an idempotent operation (a safe method)
	OutcomeExecuted Outcome = "executed"  // the operation ran and its response was stored
	OutcomeReplayed Outcome = "replayed"  // the stored response was sent again
	OutcomeConflict Outcome = "conflict"  // 409: the key belongs to another request
	OutcomeInFlight Outcome = "in_flight" // 202: the first request was still running
	OutcomeRejected Outcome = "rejected"  // 4xx before or instead of the operation; no key consumed
	OutcomeError    Outcome = "error"     // 5xx; nothing stored
)

type outcomeKey struct{}

// WithOutcome returns a context in which the middleware records the outcome
// of the request into *o. The request logger installs it before routing.
func WithOutcome(ctx context.Context, o *Outcome) context.Context {
	return context.WithValue(ctx, outcomeKey{}, o)
}

func setOutcome(ctx context.Context, o Outcome) {
	if p, ok := ctx.Value(outcomeKey{}).(*Outcome); ok {
		*p = o
	}
}
