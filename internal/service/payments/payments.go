// Package payments is the payment domain: a long operation. Creating a
// payment stores it pending and enqueues its charge through the unit of
// work of the request that claimed the client's Idempotency-Key, so a
// payment never exists without its job, nor a job without its payment. A background worker
// then charges the external provider with an idempotency key of its own,
// derived from the payment id (never the client's key), and makes the payment
// final together with the response its client key replays from then on.
//
// It knows nothing about HTTP: the representation of the final response is
// given to it (Config.Render) by the HTTP layer.
package payments

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/orders"
	"github.com/oncekey/oncekey/internal/service/provider"
)

// Statuses of a payment. Pending is the only one that changes.
const (
	StatusPending   = "pending"
	StatusSucceeded = "succeeded"
	StatusFailed    = "failed"
)

// Why a payment failed.
const (
	// ReasonCardDeclined: the provider declined the charge; not retried.
	ReasonCardDeclined = "card_declined"
	// ReasonProviderUnavailable: the provider did not answer within the
	// attempt limit, and has no charge under the payment's key.
	ReasonProviderUnavailable = "provider_unavailable"
	// ReasonProviderRejected: the provider refused the request itself (a
	// permanent 4xx); retrying cannot help.
	ReasonProviderRejected = "provider_rejected"
)

// Errors the service returns; the HTTP layer maps each to one problem type.
var (
	// ErrNotFound: no such payment in the caller's account.
	ErrNotFound = errors.New("payment not found")
	// ErrUnknownOrder: the order to pay is not in the caller's account. A
	// business outcome (422), stored and replayed; nothing is charged.
	ErrUnknownOrder = errors.New("unknown order")
	// ErrOrderCancelled: the order to pay is cancelled. A business outcome
	// (409), stored and replayed; nothing is charged.
	ErrOrderCancelled = errors.New("order cancelled")
	// ErrOrderAlreadyPaid: the order to pay has a succeeded payment. A
	// business outcome (409), stored and replayed; nothing is charged.
	ErrOrderAlreadyPaid = errors.New("order already paid")
	// ErrPaymentInProgress: the order to pay has a pending payment,
	// accepted under another key. A business outcome (409), stored and
	// replayed; nothing is charged. A client that lost the key of its first
	// attempt so cannot pay twice.
	ErrPaymentInProgress = errors.New("a payment of the order is in progress")
	// ErrAmountMismatch: the payment's amount or currency is not the
	// order's. A business outcome (422), stored and replayed; nothing is
	// charged.
	ErrAmountMismatch = errors.New("the payment does not match the order")
	// ErrNoClaim: Create ran with a claim of another account. A wiring
	// bug: a payment or refund must be bound to the key it was accepted
	// under.
	ErrNoClaim = errors.New("payments: create under another account's claim")
)

// Payment is a payment of an order.
type Payment struct {
	AccountID uuid.UUID
	ID        uuid.UUID
	OrderID   uuid.UUID
	Amount    int64
	Currency  string
	Status    string
	// FailureReason is set when Status is failed.
	FailureReason string
	// ProviderChargeID is set when Status is succeeded.
	ProviderChargeID string
	// Key and KeyClaimedAt name the client's key record the payment was
	// accepted under (see idempotency.Ref); the final response replaces
	// that record's provisional 202 and no other.
	Key          string
	KeyClaimedAt time.Time
	CreatedAt    time.Time
	// CompletedAt is set once the payment is final.
	CompletedAt *time.Time
}

// Final reports whether the payment will never change again.
func (p Payment) Final() bool { return p.Status != StatusPending }

// Ref names a payment in a job: the account (every query is scoped to it)
// and the id.
type Ref struct {
	AccountID uuid.UUID `json:"account_id"`
	PaymentID uuid.UUID `json:"payment_id"`
}

// NewPayment is a request to pay an order; the HTTP layer has already
// checked its shape against openapi.yaml.
type NewPayment struct {
	OrderID  string
	Amount   int64
	Currency string
}

// Unit is what accepting a payment writes through: the unit of work of the
// request that claimed its key, in which the order is locked, the payment
// stored and its charge enqueued, all or nothing. Implementations must pass
// the conformance suite in internal/service/store/storetest.
type Unit interface {
	// Claim is the key claim the unit of work runs under: the payment
	// records it, and it must be the paying account's.
	Claim() idempotency.Ref
	// LockOrder returns the account's order (or orders.ErrNotFound) and
	// holds it until the unit of work ends, as orders.Changer's does: a
	// payment and a change or cancellation of its order happen one at a
	// time. Row locks are taken in one order everywhere, an order's before
	// its payments' (refunds and settlement lock a payment, never its
	// order), so paying and changing an order cannot deadlock.
	LockOrder(ctx context.Context, account, id uuid.UUID) (orders.Order, error)
	// ActivePayment returns the locked order's pending or succeeded
	// payment, or ErrNotFound. An order has at most one: the database
	// refuses a second (payments_one_active_per_order).
	ActivePayment(ctx context.Context, account, orderID uuid.UUID) (Payment, error)
	// CreatePayment inserts p (pending).
	CreatePayment(ctx context.Context, p Payment) error
	// EnqueueCharge schedules the charge of ref: it is only ever run if
	// the unit of work commits.
	EnqueueCharge(ctx context.Context, ref Ref) error
}

// Reads is what clients' reads of payments and refunds go through. A
// store may serve them from a streaming replica that lags behind the
// primary (postgres.Replica): a client may read a payment a moment stale,
// and says Consistency: strong where it must not.
type Reads interface {
	// GetPayment returns the account's payment or ErrNotFound.
	GetPayment(ctx context.Context, account, id uuid.UUID) (Payment, error)
	// GetRefund returns the account's refund or ErrRefundNotFound.
	GetRefund(ctx context.Context, account, id uuid.UUID) (Refund, error)
	// ListRefunds returns the refunds of one of the account's payments,
	// oldest first, or ErrNotFound if there is no such payment.
	ListRefunds(ctx context.Context, account, paymentID uuid.UUID) ([]Refund, error)
}

// Settlements is what the worker settles payments and refunds through: the
// primary database, which holds every payment from the moment its request
// commits. No replica implements it, on purpose: a worker reading a
// lagging replica would find a payment just accepted missing, or one just
// charged without its charge, and give it up.
type Settlements interface {
	// GetPayment returns the account's payment or ErrNotFound.
	GetPayment(ctx context.Context, account, id uuid.UUID) (Payment, error)
	// GetRefund returns the account's refund or ErrRefundNotFound.
	GetRefund(ctx context.Context, account, id uuid.UUID) (Refund, error)
	// FinishPayment makes the pending payment final as p says and, in the
	// same transaction, replaces the provisional response stored under p's
	// key record with final. It reports false, changing nothing, if the
	// payment was already final (a concurrent worker settled it first).
	FinishPayment(ctx context.Context, p Payment, final idempotency.Response) (bool, error)
	// FinishRefund is FinishPayment for a refund.
	FinishRefund(ctx context.Context, r Refund, final idempotency.Response) (bool, error)
}

// PendingStats says how many payments and refunds are pending, and how
// long the oldest of each has been: one pending for much longer than its
// retries take is stuck, and operators must hear of it.
type PendingStats struct {
	Payments, Refunds Pending
}

// Pending is the count and oldest age of one kind of pending work.
type Pending struct {
	Count     int64
	OldestAge time.Duration
}

// Provider is the external payment provider (internal/service/provider's client).
type Provider interface {
	Charge(ctx context.Context, idempotencyKey string, req provider.ChargeRequest) (provider.Charge, error)
	Lookup(ctx context.Context, idempotencyKey string) (provider.Charge, error)
	Refund(ctx context.Context, idempotencyKey string, req provider.RefundRequest) (provider.Refund, error)
	LookupRefund(ctx context.Context, idempotencyKey string) (provider.Refund, error)
}

// Service is the payment use cases clients call: accepting payments and
// refunds, and reading them.
type Service struct {
	reads Reads
	now   func() time.Time
}

// NewService returns the service reading through reads.
func NewService(reads Reads) *Service {
	return &Service{reads: reads, now: time.Now}
}

// WorkerConfig is what the worker is built from. All fields but Observer
// are required.
type WorkerConfig struct {
	// Repo is the primary store (see Settlements).
	Repo     Settlements
	Provider Provider
	// Render turns a final payment into the response its client key
	// replays from then on (the HTTP layer's 200 with the payment).
	Render func(Payment) (idempotency.Response, error)
	// RenderRefund does the same for a final refund.
	RenderRefund func(Refund) (idempotency.Response, error)
	// Observer is told of tasks given up (default: nobody).
	Observer Observer
	// Logger receives the tasks given up (default slog.Default()).
	Logger *slog.Logger
}

// Observer is told what operators must hear of the worker.
type Observer interface {
	// TaskAbandoned: a task's payment or refund could not be found on the
	// primary for all of its attempts, and the task was given up.
	TaskAbandoned(kind string)
}

type noObserver struct{}

func (noObserver) TaskAbandoned(string) {}

// Worker is the background half of payments: it charges the provider for
// accepted payments, refunds accepted refunds, and makes each final. Both
// job queues (River's, and RunLocal in memory) run its tasks.
type Worker struct {
	cfg WorkerConfig
	now func() time.Time
}

// NewWorker returns the worker for cfg.
func NewWorker(cfg WorkerConfig) *Worker {
	if cfg.Observer == nil {
		cfg.Observer = noObserver{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Worker{cfg: cfg, now: time.Now}
}

// Create accepts a payment of one of account's orders under u's key claim,
// which must be that account's: it stores the payment pending and enqueues
// its charge, both through u, the unit of work of the request that made
// the claim.
// The order is locked first, as changing or cancelling it locks it, so
// that an order is paid at most once (ErrPaymentInProgress,
// ErrOrderAlreadyPaid), and for exactly its amount and currency
// (ErrAmountMismatch) even while a change of it races the payment.
func (s *Service) Create(ctx context.Context, u Unit, account uuid.UUID, in NewPayment) (Payment, error) {
	claim := u.Claim()
	if claim.Scope != auth.Scope(account) {
		return Payment{}, ErrNoClaim
	}
	if err := orders.CheckCurrency(in.Currency); err != nil {
		return Payment{}, err
	}
	orderID, err := uuid.Parse(in.OrderID)
	if err != nil {
		return Payment{}, fmt.Errorf("%w: %q is not an order id", ErrUnknownOrder, in.OrderID)
	}
	order, err := u.LockOrder(ctx, account, orderID)
	switch {
	case errors.Is(err, orders.ErrNotFound):
		return Payment{}, fmt.Errorf("%w: order %s does not exist in this account", ErrUnknownOrder, orderID)
	case err != nil:
		return Payment{}, fmt.Errorf("read order: %w", err)
	case order.Status == orders.StatusCancelled:
		return Payment{}, fmt.Errorf("%w: order %s was cancelled; a cancelled order cannot be paid", ErrOrderCancelled, orderID)
	}
	active, err := u.ActivePayment(ctx, account, orderID)
	switch {
	case err == nil && active.Status == StatusSucceeded:
		return Payment{}, fmt.Errorf("%w: order %s was paid by payment %s", ErrOrderAlreadyPaid, orderID, active.ID)
	case err == nil:
		return Payment{}, fmt.Errorf("%w: payment %s of order %s is pending; poll it at /payments/%s", ErrPaymentInProgress, active.ID, orderID, active.ID)
	case !errors.Is(err, ErrNotFound):
		return Payment{}, fmt.Errorf("read the order's payments: %w", err)
	}
	if in.Amount != order.Amount || in.Currency != order.Currency {
		return Payment{}, fmt.Errorf("%w: order %s is %d %s; the payment is %d %s", ErrAmountMismatch, orderID, order.Amount, order.Currency, in.Amount, in.Currency)
	}
	id, err := uuid.NewV7()
	if err != nil {
		return Payment{}, fmt.Errorf("new payment id: %w", err)
	}
	p := Payment{
		AccountID: account, ID: id, OrderID: orderID, Amount: in.Amount, Currency: in.Currency,
		Status: StatusPending, Key: claim.Key, KeyClaimedAt: claim.ClaimedAt,
		// PostgreSQL keeps microseconds; the response equals what a GET reads.
		CreatedAt: s.now().UTC().Truncate(time.Microsecond),
	}
	if err := u.CreatePayment(ctx, p); err != nil {
		return Payment{}, fmt.Errorf("store payment: %w", err)
	}
	if err := u.EnqueueCharge(ctx, Ref{AccountID: account, PaymentID: id}); err != nil {
		return Payment{}, fmt.Errorf("enqueue charge: %w", err)
	}
	return p, nil
}

// Get returns one of account's payments.
func (s *Service) Get(ctx context.Context, account uuid.UUID, id string) (Payment, error) {
	pid, err := uuid.Parse(id)
	if err != nil {
		return Payment{}, ErrNotFound // not an id we could have issued
	}
	return s.reads.GetPayment(ctx, account, pid)
}

// ChargeKey is the Idempotency-Key the worker sends the provider for a
// payment: derived from the payment id alone, so every attempt, on any
// replica, after any crash, asks for the same one charge. The client's key
// is never passed on: it is scoped to the client's account here, not to
// the provider, and one client key could (after it expires) name another
// payment.
func ChargeKey(paymentID uuid.UUID) string { return "oncekey-payment-" + paymentID.String() }

// ErrGone: the job names a payment (or refund) that the primary does not
// hold. Transactional enqueue makes this impossible short of someone
// deleting rows, so the task is retried with the policy's backoff for all
// of its attempts, then given up loudly (Worker.Abandon), never silently.
var ErrGone = errors.New("payments: the job's payment does not exist")

// ErrForeignAnswer: the provider answered with a charge (or refund) other
// than the one asked for: another reference, amount or currency. Nothing is
// settled from such an answer; the payment stays pending, asked about again
// like a provider that cannot say, until an operator looks (`oncekey
// payments stuck`).
var ErrForeignAnswer = errors.New("payments: the provider answered for something else than was asked")

// ErrUnsettled: after the attempts ran out, the provider could not say
// whether it holds a charge for the payment (or the refund). The payment stays pending and
// the worker asks again later, for as long as it takes: settling it failed
// without knowing could hide money that moved.
var ErrUnsettled = errors.New("payments: the provider could not say whether it charged")

// Process runs attempt number attempt (from 1) of ref's charge. Attempts 1
// to maxAttempts ask the provider to charge; each returns nil once the
// payment is final (now, or already), or an error the worker retries after
// a backoff. Every later attempt only reconciles: it asks the provider what
// it holds under the payment's key (a charge whose answer a timeout lost,
// say) and settles from that, succeeded if there is a charge and failed if
// there is none; if the provider cannot say, it returns ErrUnsettled and the
// worker asks again later.
//
// Every attempt sends the same charge key, so the provider charges at most
// once however many attempts, workers or crashes there are.
func (w *Worker) Process(ctx context.Context, ref Ref, attempt, maxAttempts int) error {
	p, err := w.cfg.Repo.GetPayment(ctx, ref.AccountID, ref.PaymentID)
	if errors.Is(err, ErrNotFound) {
		return fmt.Errorf("%w: %s", ErrGone, ref.PaymentID)
	}
	if err != nil {
		return fmt.Errorf("read payment: %w", err)
	}
	if p.Final() {
		return nil
	}
	key := ChargeKey(p.ID)
	return call[provider.Charge]{
		ask: func(ctx context.Context) (provider.Charge, error) {
			return w.cfg.Provider.Charge(ctx, key, provider.ChargeRequest{Amount: p.Amount, Currency: p.Currency, Reference: p.ID.String()})
		},
		lookup: func(ctx context.Context) (provider.Charge, error) { return w.cfg.Provider.Lookup(ctx, key) },
		settle: func(ctx context.Context, c provider.Charge) error {
			if c.Reference != p.ID.String() || c.Amount != p.Amount || c.Currency != p.Currency {
				return fmt.Errorf("%w: charge %s is %d %s for %q; payment %s is %d %s", ErrForeignAnswer,
					c.ID, c.Amount, c.Currency, c.Reference, p.ID, p.Amount, p.Currency)
			}
			if c.Status == provider.StatusSucceeded {
				return w.finish(ctx, p, StatusSucceeded, "", c.ID)
			}
			return w.finish(ctx, p, StatusFailed, ReasonCardDeclined, "")
		},
		fail: func(ctx context.Context, reason string) error { return w.finish(ctx, p, StatusFailed, reason, "") },
	}.attempt(ctx, attempt, maxAttempts)
}

// call is one provider call the worker makes with a key of its own (a
// charge, a refund): asking for it, looking up what the provider holds
// under the key, and settling from the provider's answer or failing for
// lack of one.
type call[A any] struct {
	ask    func(context.Context) (A, error)
	lookup func(context.Context) (A, error)
	settle func(context.Context, A) error
	fail   func(ctx context.Context, reason string) error
}

// attempt makes attempt number attempt (from 1) of maxAttempts: asking while
// attempts last, reconciling after (see Service.Process).
func (c call[A]) attempt(ctx context.Context, attempt, maxAttempts int) error {
	if attempt > maxAttempts {
		return c.reconcile(ctx, ReasonProviderUnavailable)
	}
	answer, err := c.ask(ctx)
	switch {
	case err == nil:
		return c.settle(ctx, answer)
	case errors.Is(err, provider.ErrRejected):
		// Some providers refuse a repeat while the first request with the
		// key is still being processed (409): the call may have happened.
		return c.reconcile(ctx, ReasonProviderRejected)
	default:
		return fmt.Errorf("attempt %d of %d: %w", attempt, maxAttempts, err)
	}
}

// reconcile settles from what the provider holds under the call's key, or
// fails with reason if it holds nothing.
func (c call[A]) reconcile(ctx context.Context, reason string) error {
	answer, err := c.lookup(ctx)
	switch {
	case err == nil:
		return c.settle(ctx, answer)
	case errors.Is(err, provider.ErrNotFound):
		return c.fail(ctx, reason)
	default:
		return fmt.Errorf("%w: %w", ErrUnsettled, err)
	}
}

func (w *Worker) finish(ctx context.Context, p Payment, status, reason, chargeID string) error {
	now := w.now().UTC().Truncate(time.Microsecond)
	p.Status, p.FailureReason, p.ProviderChargeID, p.CompletedAt = status, reason, chargeID, &now
	final, err := w.cfg.Render(p)
	if err != nil {
		return fmt.Errorf("render final payment: %w", err)
	}
	// false means another worker settled it first, with the same charge
	// key and so the same outcome: nothing left to do.
	if _, err := w.cfg.Repo.FinishPayment(ctx, p, final); err != nil {
		return fmt.Errorf("finish payment: %w", err)
	}
	return nil
}

// Backoff is the wait before attempt number attempt+1 after attempt failed:
// base doubling per attempt, capped at limit, with up to a quarter of
// jitter subtracted so that payments failing together do not retry
// together. Both workers (River's and the in-process one) use it.
func Backoff(attempt int, base, limit time.Duration, jitter func(n int64) int64) time.Duration {
	d := base
	for i := 1; i < attempt && d < limit; i++ {
		d *= 2
	}
	d = min(d, limit)
	if q := int64(d / 4); q > 0 && jitter != nil {
		d -= time.Duration(jitter(q))
	}
	return d
}
