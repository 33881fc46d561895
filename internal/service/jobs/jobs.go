// Package jobs runs the service's background work on River, PostgreSQL's
// job queue: a payment's charge (or a refund) is inserted as a River job in
// the very transaction that creates the payment (or refund) and claims the
// client's key (transactional enqueue), so a crash can never leave a
// payment without its job or a job without its payment. River retries failed attempts with
// backoff and rescues the jobs of a worker that died mid-attempt.
package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/oncekey/oncekey/internal/service/payments"
)

// QueuePayments is the River queue charges and refunds run on.
const QueuePayments = "payments"

// Config configures the runner.
type Config struct {
	Policy payments.RetryPolicy
	// Workers is how many charges run at once in this process (default 10).
	Workers int
	// PollInterval is how often River looks for jobs that are due without
	// having been notified (retries, rescued jobs); default 250ms.
	PollInterval time.Duration
	Logger       *slog.Logger
}

// Runner inserts and works charge and refund jobs.
type Runner struct {
	client *river.Client[pgx.Tx]
	log    *slog.Logger
	policy payments.RetryPolicy
	worker atomic.Pointer[payments.Worker]
}

// chargeArgs is a charge job: the payment to charge.
type chargeArgs struct {
	payments.Ref
}

func (chargeArgs) Kind() string { return "charge_payment" }

// refundArgs is a refund job: the refund to make.
type refundArgs struct {
	payments.RefundRef
}

func (refundArgs) Kind() string { return "refund_payment" }

// New builds a runner on pool. Its River tables must exist (postgres.Migrate
// applies them). It works nothing until Start.
func New(pool *pgxpool.Pool, cfg Config) (*Runner, error) {
	cfg.Policy = cfg.Policy.WithDefaults()
	if cfg.Workers <= 0 {
		cfg.Workers = 10
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 250 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	r := &Runner{policy: cfg.Policy, log: cfg.Logger}
	workers := river.NewWorkers()
	if err := river.AddWorkerSafely(workers, &taskWorker[chargeArgs]{r: r, task: func(a chargeArgs) payments.Task { return payments.ChargeTask(a.Ref) }}); err != nil {
		return nil, fmt.Errorf("register charge worker: %w", err)
	}
	if err := river.AddWorkerSafely(workers, &taskWorker[refundArgs]{r: r, task: func(a refundArgs) payments.Task { return payments.RefundTask(a.RefundRef) }}); err != nil {
		return nil, fmt.Errorf("register refund worker: %w", err)
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:            map[string]river.QueueConfig{QueuePayments: {MaxWorkers: cfg.Workers}},
		Workers:           workers,
		FetchPollInterval: cfg.PollInterval,
		FetchCooldown:     min(cfg.PollInterval, river.FetchCooldownDefault),
		JobTimeout:        cfg.Policy.Timeout,
		// A job still running this long after it started belongs to a
		// worker that died (its process was killed, say): River hands it
		// to another worker. It must exceed the attempt timeout, or a slow
		// live attempt would be run twice at once (harmless: the charge
		// key is the same, and only one can finish the payment, but
		// wasteful).
		RescueStuckJobsAfter: 2*cfg.Policy.Timeout + time.Second,
		Logger:               cfg.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("create River client: %w", err)
	}
	r.client = client
	return r, nil
}

// InsertCharge inserts ref's charge job in tx, the transaction that creates
// the payment: a job inserted on its own could outlive a rolled-back
// payment.
func (r *Runner) InsertCharge(ctx context.Context, tx pgx.Tx, ref payments.Ref) error {
	return r.insert(ctx, tx, chargeArgs{Ref: ref})
}

// InsertRefund inserts ref's refund job in tx, the transaction that creates
// the refund.
func (r *Runner) InsertRefund(ctx context.Context, tx pgx.Tx, ref payments.RefundRef) error {
	return r.insert(ctx, tx, refundArgs{RefundRef: ref})
}

func (r *Runner) insert(ctx context.Context, tx pgx.Tx, args river.JobArgs) error {
	_, err := r.client.InsertTx(ctx, tx, args, &river.InsertOpts{
		Queue:       QueuePayments,
		MaxAttempts: r.policy.Attempts + spareAttempts,
	})
	if err != nil {
		return fmt.Errorf("insert %s job: %w", args.Kind(), err)
	}
	return nil
}

// GivenUp is a charge or refund job that will never run again: cancelled
// (its payment or refund not found, payments.Worker.Abandon) or discarded
// (out of attempts). Its payment stays pending until someone settles it.
type GivenUp struct {
	Task        payments.Task
	State       string
	Attempts    int
	FinalizedAt time.Time
	// Error is the last attempt's error.
	Error string
}

// GivenUp returns up to limit charge and refund jobs given up, the most
// recent first (`oncekey payments stuck`).
func (r *Runner) GivenUp(ctx context.Context, limit int) ([]GivenUp, error) {
	params := river.NewJobListParams().
		Kinds(chargeArgs{}.Kind(), refundArgs{}.Kind()).
		States(rivertype.JobStateCancelled, rivertype.JobStateDiscarded).
		OrderBy(river.JobListOrderByFinalizedAt, river.SortOrderDesc).
		First(limit)
	res, err := r.client.JobList(ctx, params)
	if err != nil {
		return nil, fmt.Errorf("list the jobs given up: %w", err)
	}
	out := make([]GivenUp, 0, len(res.Jobs))
	for _, job := range res.Jobs {
		g := GivenUp{State: string(job.State), Attempts: job.Attempt}
		if job.FinalizedAt != nil {
			g.FinalizedAt = *job.FinalizedAt
		}
		if n := len(job.Errors); n > 0 {
			g.Error = job.Errors[n-1].Error
		}
		switch job.Kind {
		case chargeArgs{}.Kind():
			var a chargeArgs
			err = json.Unmarshal(job.EncodedArgs, &a)
			g.Task = payments.ChargeTask(a.Ref)
		default:
			var a refundArgs
			err = json.Unmarshal(job.EncodedArgs, &a)
			g.Task = payments.RefundTask(a.RefundRef)
		}
		if err != nil {
			return nil, fmt.Errorf("decode job %d: %w", job.ID, err)
		}
		out = append(out, g)
	}
	return out, nil
}

// Start works jobs with w until Stop.
func (r *Runner) Start(ctx context.Context, w *payments.Worker) error {
	r.worker.Store(w)
	return r.client.Start(ctx)
}

// Stop lets the attempts under way finish (until ctx ends, when they are
// cancelled; River retries them later) and stops working jobs.
func (r *Runner) Stop(ctx context.Context) error {
	err := r.client.Stop(ctx)
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return r.client.StopAndCancel(context.WithoutCancel(ctx))
	}
	return err
}

// spareAttempts are River attempts beyond the policy's charges: the
// reconciliation after the last charge, and room for workers that die
// during it (River counts a rescued attempt as failed, and discards a job
// out of attempts). A failed reconciliation snoozes instead, which River
// does not count, so a payment is never discarded pending.
const spareAttempts = 1 + 10

// taskWorker works one kind of job: each is a payments.Task.
type taskWorker[A river.JobArgs] struct {
	river.WorkerDefaults[A]
	r    *Runner
	task func(A) payments.Task
}

func (w *taskWorker[A]) Work(ctx context.Context, job *river.Job[A]) error {
	worker := w.r.worker.Load()
	if worker == nil {
		return errors.New("jobs: runner started without a payment worker")
	}
	task := w.task(job.Args)
	err := worker.Run(ctx, task, job.Attempt, w.r.policy.Attempts)
	switch {
	case err == nil:
		return nil
	case worker.Abandon(task, job.Attempt, w.r.policy.Attempts, err):
		// Cancelled, never retried: the worker has logged and counted it,
		// and `oncekey payments stuck` lists it.
		return river.JobCancel(err)
	case errors.Is(err, payments.ErrGone):
		// The primary does not hold the row (yet): retried with the
		// policy's backoff, like a failed charge.
		return err
	case job.Attempt > w.r.policy.Attempts:
		// Reconciling failed (the provider cannot say, or the attempt was
		// cut short): ask again later, without using up an attempt.
		w.r.log.Warn("payments: pending until the provider says whether it acted", "task", task.String(), "err", err)
		return river.JobSnooze(w.r.policy.Limit)
	}
	return err
}

func (w *taskWorker[A]) NextRetry(job *river.Job[A]) time.Time {
	return w.r.policy.NextRetry(job.Attempt, time.Now())
}

func (w *taskWorker[A]) Timeout(*river.Job[A]) time.Duration { return w.r.policy.Timeout }
