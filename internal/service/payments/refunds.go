package payments

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/provider"
)

// ReasonRefundDeclined: the provider declined the refund; not retried.
const ReasonRefundDeclined = "refund_declined"

// MaxRefunds is how many refunds one payment takes, failed ones included:
// enough for any shop's returns, few enough that listing them needs no
// pages.
const MaxRefunds = 100

// Errors of refunds; the HTTP layer maps each to one problem type.
var (
	// ErrRefundNotFound: no such refund in the caller's account.
	ErrRefundNotFound = errors.New("refund not found")
	// ErrNotRefundable: the payment has not succeeded. A business outcome
	// (409), stored and replayed.
	ErrNotRefundable = errors.New("the payment cannot be refunded")
	// ErrRefundExceedsPayment: the refund is larger than what the
	// payment's other refunds (those that have not failed) left. A
	// business outcome (422), stored and replayed.
	ErrRefundExceedsPayment = errors.New("the refund exceeds what is left of the payment")
	// ErrTooManyRefunds: the payment has MaxRefunds refunds. A business
	// outcome (422), stored and replayed.
	ErrTooManyRefunds = errors.New("the payment has all the refunds it can take")
)

// Refund is a refund of part or all of a succeeded payment.
type Refund struct {
	AccountID uuid.UUID
	ID        uuid.UUID
	PaymentID uuid.UUID
	Amount    int64
	Currency  string
	Reason    string
	Status    string
	// FailureReason is set when Status is failed.
	FailureReason string
	// ProviderRefundID is set when Status is succeeded.
	ProviderRefundID string
	// Key and KeyClaimedAt name the client's key record, as a payment's do.
	Key          string
	KeyClaimedAt time.Time
	CreatedAt    time.Time
	// CompletedAt is set once the refund is final.
	CompletedAt *time.Time
}

// Final reports whether the refund will never change again.
func (r Refund) Final() bool { return r.Status != StatusPending }

// RefundRef names a refund in a job.
type RefundRef struct {
	AccountID uuid.UUID `json:"account_id"`
	RefundID  uuid.UUID `json:"refund_id"`
}

// NewRefund is a request to refund a payment; the HTTP layer has already
// checked its shape against openapi.yaml.
type NewRefund struct {
	Amount int64
	Reason string
}

// RefundUnit is what accepting a refund writes through: the unit of work of
// the request that claimed its key, in which the payment is locked, its
// refunds summed, the refund stored and enqueued, all or nothing.
// Implementations must pass the conformance suite in
// internal/service/store/storetest.
type RefundUnit interface {
	// Claim is the key claim the unit of work runs under: the refund
	// records it, and it must be the refunding account's.
	Claim() idempotency.Ref
	// LockPayment returns the account's payment (or ErrNotFound) and holds
	// it until the unit of work ends: refunds of one payment are accepted
	// one at a time, each after summing the ones before.
	LockPayment(ctx context.Context, account, id uuid.UUID) (Payment, error)
	// RefundTotals returns the sum of the payment's refunds that have not
	// failed, and how many refunds it has.
	RefundTotals(ctx context.Context, account, paymentID uuid.UUID) (refunded int64, refunds int, err error)
	// CreateRefund inserts r (pending).
	CreateRefund(ctx context.Context, r Refund) error
	// EnqueueRefund schedules ref's provider call: it is only ever run if
	// the unit of work commits.
	EnqueueRefund(ctx context.Context, ref RefundRef) error
}

// CreateRefund accepts a refund of one of account's payments under u's key
// claim, which must be that account's: it stores the refund pending and enqueues its
// provider call, both through u, unless the payment has not succeeded or
// the refund is larger than what is left of it.
func (s *Service) CreateRefund(ctx context.Context, u RefundUnit, account uuid.UUID, paymentID string, in NewRefund) (Refund, error) {
	claim := u.Claim()
	if claim.Scope != auth.Scope(account) {
		return Refund{}, ErrNoClaim
	}
	pid, err := uuid.Parse(paymentID)
	if err != nil {
		return Refund{}, ErrNotFound // not an id we could have issued
	}
	p, err := u.LockPayment(ctx, account, pid)
	if err != nil {
		return Refund{}, err
	}
	if p.Status != StatusSucceeded {
		return Refund{}, fmt.Errorf("%w: payment %s is %s; only a succeeded payment can be refunded", ErrNotRefundable, p.ID, p.Status)
	}
	refunded, refunds, err := u.RefundTotals(ctx, account, pid)
	if err != nil {
		return Refund{}, fmt.Errorf("sum the payment's refunds: %w", err)
	}
	if refunds >= MaxRefunds {
		return Refund{}, fmt.Errorf("%w: payment %s has %d refunds, the most it can take", ErrTooManyRefunds, p.ID, refunds)
	}
	if left := p.Amount - refunded; in.Amount > left {
		return Refund{}, fmt.Errorf("%w: the refund of %d exceeds the %d left of payment %s", ErrRefundExceedsPayment, in.Amount, left, p.ID)
	}
	id, err := uuid.NewV7()
	if err != nil {
		return Refund{}, fmt.Errorf("new refund id: %w", err)
	}
	r := Refund{
		AccountID: account, ID: id, PaymentID: pid, Amount: in.Amount, Currency: p.Currency, Reason: in.Reason,
		Status: StatusPending, Key: claim.Key, KeyClaimedAt: claim.ClaimedAt,
		CreatedAt: s.now().UTC().Truncate(time.Microsecond),
	}
	if err := u.CreateRefund(ctx, r); err != nil {
		return Refund{}, fmt.Errorf("store refund: %w", err)
	}
	if err := u.EnqueueRefund(ctx, RefundRef{AccountID: account, RefundID: id}); err != nil {
		return Refund{}, fmt.Errorf("enqueue refund: %w", err)
	}
	return r, nil
}

// GetRefund returns one of account's refunds.
func (s *Service) GetRefund(ctx context.Context, account uuid.UUID, id string) (Refund, error) {
	rid, err := uuid.Parse(id)
	if err != nil {
		return Refund{}, ErrRefundNotFound
	}
	return s.reads.GetRefund(ctx, account, rid)
}

// ListRefunds returns the refunds of one of account's payments, oldest
// first, or ErrNotFound if there is no such payment.
func (s *Service) ListRefunds(ctx context.Context, account uuid.UUID, paymentID string) ([]Refund, error) {
	pid, err := uuid.Parse(paymentID)
	if err != nil {
		return nil, ErrNotFound // not an id we could have issued
	}
	return s.reads.ListRefunds(ctx, account, pid)
}

// RefundKey is the Idempotency-Key the worker sends the provider for a
// refund: derived from the refund id alone, as ChargeKey is from the
// payment's.
func RefundKey(refundID uuid.UUID) string { return "oncekey-refund-" + refundID.String() }

// ProcessRefund runs attempt number attempt (from 1) of ref's provider
// call, as Process does a charge's: the same attempts, the same
// reconciliation once they ran out, the same refusal to settle without
// knowing.
func (w *Worker) ProcessRefund(ctx context.Context, ref RefundRef, attempt, maxAttempts int) error {
	r, err := w.cfg.Repo.GetRefund(ctx, ref.AccountID, ref.RefundID)
	if errors.Is(err, ErrRefundNotFound) {
		return fmt.Errorf("%w: refund %s", ErrGone, ref.RefundID)
	}
	if err != nil {
		return fmt.Errorf("read refund: %w", err)
	}
	if r.Final() {
		return nil
	}
	p, err := w.cfg.Repo.GetPayment(ctx, ref.AccountID, r.PaymentID)
	if err != nil {
		return fmt.Errorf("read the refund's payment: %w", err)
	}
	key := RefundKey(r.ID)
	return call[provider.Refund]{
		ask: func(ctx context.Context) (provider.Refund, error) {
			return w.cfg.Provider.Refund(ctx, key, provider.RefundRequest{ChargeID: p.ProviderChargeID, Amount: r.Amount, Reference: r.ID.String()})
		},
		lookup: func(ctx context.Context) (provider.Refund, error) { return w.cfg.Provider.LookupRefund(ctx, key) },
		settle: func(ctx context.Context, pr provider.Refund) error {
			if pr.Reference != r.ID.String() || pr.Amount != r.Amount || pr.ChargeID != p.ProviderChargeID || pr.Currency != r.Currency {
				return fmt.Errorf("%w: refund %s is %d %s of %s for %q; refund %s is %d %s of %s", ErrForeignAnswer,
					pr.ID, pr.Amount, pr.Currency, pr.ChargeID, pr.Reference, r.ID, r.Amount, r.Currency, p.ProviderChargeID)
			}
			if pr.Status == provider.StatusSucceeded {
				return w.finishRefund(ctx, r, StatusSucceeded, "", pr.ID)
			}
			return w.finishRefund(ctx, r, StatusFailed, ReasonRefundDeclined, "")
		},
		fail: func(ctx context.Context, reason string) error {
			return w.finishRefund(ctx, r, StatusFailed, reason, "")
		},
	}.attempt(ctx, attempt, maxAttempts)
}

func (w *Worker) finishRefund(ctx context.Context, r Refund, status, reason, refundID string) error {
	now := w.now().UTC().Truncate(time.Microsecond)
	r.Status, r.FailureReason, r.ProviderRefundID, r.CompletedAt = status, reason, refundID, &now
	final, err := w.cfg.RenderRefund(r)
	if err != nil {
		return fmt.Errorf("render final refund: %w", err)
	}
	if _, err := w.cfg.Repo.FinishRefund(ctx, r, final); err != nil {
		return fmt.Errorf("finish refund: %w", err)
	}
	return nil
}
