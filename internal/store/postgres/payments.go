package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/oncekey/oncekey/gen/db"
	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/auth"
	"github.com/oncekey/oncekey/internal/payments"
)

// CreatePayment implements payments.Unit.
func (u *txUnit) CreatePayment(ctx context.Context, p payments.Payment) error {
	return translate(u.q.PaymentCreate(ctx, db.PaymentCreateParams{
		AccountID:      p.AccountID,
		ID:             p.ID,
		OrderID:        p.OrderID,
		Amount:         p.Amount,
		Currency:       p.Currency,
		IdempotencyKey: p.Key,
		KeyCreatedAt:   p.KeyClaimedAt,
		CreatedAt:      p.CreatedAt,
	}))
}

// EnqueueCharge implements payments.Unit: the job is inserted in the
// transaction that creates the payment.
func (u *txUnit) EnqueueCharge(ctx context.Context, ref payments.Ref) error {
	if u.s.charges == nil {
		return errors.New("postgres: no charge queue to enqueue a payment's charge in")
	}
	return translate(u.s.charges.InsertCharge(ctx, u.tx, ref))
}

// GetPayment implements payments.Repository.
func (s *Store) GetPayment(ctx context.Context, account, id uuid.UUID) (payments.Payment, error) {
	row, err := db.New(s.pool).PaymentGet(ctx, db.PaymentGetParams{AccountID: account, ID: id})
	if errors.Is(err, pgx.ErrNoRows) {
		return payments.Payment{}, payments.ErrNotFound
	}
	if err != nil {
		return payments.Payment{}, translate(err)
	}
	return paymentFromRow(row), nil
}

// FinishPayment implements payments.Repository: the payment's final state
// and the response its key replays from now on commit in one transaction.
func (s *Store) FinishPayment(ctx context.Context, p payments.Payment, final idempotency.Response) (bool, error) {
	changed := false
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		q := db.New(tx)
		row, err := q.PaymentFinish(ctx, db.PaymentFinishParams{
			AccountID:        p.AccountID,
			ID:               p.ID,
			Status:           p.Status,
			FailureReason:    pgtype.Text{String: p.FailureReason, Valid: p.FailureReason != ""},
			ProviderChargeID: pgtype.Text{String: p.ProviderChargeID, Valid: p.ProviderChargeID != ""},
			CompletedAt:      p.CompletedAt,
		})
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // already final
		}
		if err != nil {
			return fmt.Errorf("finish payment: %w", err)
		}
		// The key row is named by the payment's own binding, not by p, so
		// a caller cannot point the outcome at another key. No row: the key
		// expired and was purged (or reused); the payment is final anyway.
		claim := idempotency.Ref{Scope: auth.Scope(row.AccountID), Key: row.IdempotencyKey, ClaimedAt: row.KeyCreatedAt}
		if _, err := s.keys.ReplaceProvisional(ctx, tx, claim, final); err != nil {
			return fmt.Errorf("replace the key's provisional response: %w", err)
		}
		changed = true
		return nil
	})
	return changed, translate(err)
}

func paymentFromRow(row db.Payment) payments.Payment {
	p := payments.Payment{
		AccountID:        row.AccountID,
		ID:               row.ID,
		OrderID:          row.OrderID,
		Amount:           row.Amount,
		Currency:         row.Currency,
		Status:           row.Status,
		FailureReason:    row.FailureReason.String,
		ProviderChargeID: row.ProviderChargeID.String,
		Key:              row.IdempotencyKey,
		KeyClaimedAt:     row.KeyCreatedAt,
		CreatedAt:        row.CreatedAt.UTC(),
	}
	if row.CompletedAt != nil {
		t := row.CompletedAt.UTC()
		p.CompletedAt = &t
	}
	return p
}

// CountPayments returns how many payments the account has, for tests and
// operators checking that retries created no second one.
func (s *Store) CountPayments(ctx context.Context, account uuid.UUID) (int, error) {
	n, err := db.New(s.pool).PaymentCount(ctx, account)
	return int(n), translate(err)
}
