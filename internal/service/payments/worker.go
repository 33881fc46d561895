package payments

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/google/uuid"
)

// RetryPolicy says how often and how patiently a charge is attempted. Both
// workers (River's on PostgreSQL, RunLocal in memory) follow it.
type RetryPolicy struct {
	// Attempts is how many times the provider is asked to charge before
	// the payment is settled from what the provider holds (see
	// Service.Process).
	Attempts int
	// Base is the wait after the first failed attempt; it doubles with each
	// further one, up to Limit.
	Base, Limit time.Duration
	// Timeout bounds one attempt, provider call and database writes
	// included.
	Timeout time.Duration
}

// Defaults for RetryPolicy fields left zero: eight attempts spread over
// about four minutes, well inside the 48h a key is kept, so the final
// answer always lands on the key it belongs to.
const (
	DefaultAttempts = 8
	DefaultBase     = time.Second
	DefaultLimit    = 2 * time.Minute
	DefaultTimeout  = 30 * time.Second
)

// WithDefaults fills in the zero fields.
func (p RetryPolicy) WithDefaults() RetryPolicy {
	if p.Attempts <= 0 {
		p.Attempts = DefaultAttempts
	}
	if p.Base <= 0 {
		p.Base = DefaultBase
	}
	if p.Limit <= 0 {
		p.Limit = DefaultLimit
	}
	if p.Timeout <= 0 {
		p.Timeout = DefaultTimeout
	}
	return p
}

// NextRetry is when the attempt after a failed attempt should run: after
// the backoff while the provider is still being asked to charge (the
// reconciliation after the last charge, too: a provider may need a moment
// to record a charge whose answer was lost), every Limit once reconciling
// failed.
func (p RetryPolicy) NextRetry(attempt int, now time.Time) time.Time {
	if attempt > p.Attempts {
		return now.Add(p.Limit)
	}
	return now.Add(Backoff(attempt, p.Base, p.Limit, rand.Int64N))
}

// Task is one provider call the worker makes: the charge of a payment, or
// a refund. Exactly one of the two is set.
type Task struct {
	Charge Ref
	Refund RefundRef
}

// ChargeTask and RefundTask name the two kinds of task.
func ChargeTask(ref Ref) Task       { return Task{Charge: ref} }
func RefundTask(ref RefundRef) Task { return Task{Refund: ref} }

// String names the task in logs.
func (t Task) String() string {
	if t.Refund.RefundID != uuid.Nil {
		return "refund " + t.Refund.RefundID.String()
	}
	return "charge of payment " + t.Charge.PaymentID.String()
}

// Kind names the task's kind in metrics: "charge" or "refund".
func (t Task) Kind() string {
	if t.Refund.RefundID != uuid.Nil {
		return "refund"
	}
	return "charge"
}

// Run runs attempt number attempt of t (Process or ProcessRefund).
func (w *Worker) Run(ctx context.Context, t Task, attempt, maxAttempts int) error {
	if t.Refund.RefundID != uuid.Nil {
		return w.ProcessRefund(ctx, t.Refund, attempt, maxAttempts)
	}
	return w.Process(ctx, t.Charge, attempt, maxAttempts)
}

// Abandon reports whether a task whose attempt number attempt failed with
// err is given up rather than retried: only a task whose payment or refund
// the primary still does not hold once its charge attempts ran out
// (ErrGone). Giving up is logged as an error and told to the Observer, so
// that an alert fires; until then the task is retried like any other.
func (w *Worker) Abandon(t Task, attempt, maxAttempts int, err error) bool {
	if !errors.Is(err, ErrGone) || attempt < maxAttempts {
		return false
	}
	w.cfg.Logger.Error("payments: giving up a task whose row the primary does not hold", "task", t.String(), "attempts", attempt, "err", err)
	w.cfg.Observer.TaskAbandoned(t.Kind())
	return true
}

// LocalQueue is an in-process job queue (the in-memory store's).
type LocalQueue interface {
	// NextTask blocks until a committed task is due, and returns it with
	// the number of the attempt to make.
	NextTask(ctx context.Context) (t Task, attempt int, err error)
	// RetryTask puts back a task whose attempt failed, due at due.
	RetryTask(t Task, attempt int, due time.Time)
}

// RunLocal works q's tasks with at most workers at a time until ctx ends,
// then waits for the attempts under way. It is the in-memory mode's worker,
// with River's observable behaviour: the same attempts, backoff and final
// outcomes, but no durability (memory dies with the process anyway).
func RunLocal(ctx context.Context, q LocalQueue, w *Worker, policy RetryPolicy, workers int, log *slog.Logger) {
	policy = policy.WithDefaults()
	if log == nil {
		log = slog.Default()
	}
	slots := make(chan struct{}, max(workers, 1))
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		task, attempt, err := q.NextTask(ctx)
		if err != nil {
			return
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			q.RetryTask(task, attempt-1, time.Now())
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), policy.Timeout)
			defer cancel()
			err := w.Run(actx, task, attempt, policy.Attempts)
			switch {
			case err == nil, w.Abandon(task, attempt, policy.Attempts, err):
			default:
				log.Warn("payments: attempt failed; retrying", "task", task.String(), "attempt", attempt, "err", err)
				q.RetryTask(task, attempt, policy.NextRetry(attempt, time.Now()))
			}
		}()
	}
}
