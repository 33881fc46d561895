package postgres

import (
	"context"
	"errors"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/gen/db"
	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/payments"
)

// RefundTotals implements payments.RefundUnit.
func (u *txUnit) RefundTotals(ctx context.Context, account, paymentID uuid.UUID) (int64, int, error) {
	row, err := u.q.RefundTotals(ctx, db.RefundTotalsParams{AccountID: account, PaymentID: paymentID})
	return row.Refunded, int(row.Refunds), translate(err)
}

// CreateRefund implements payments.RefundUnit.
func (u *txUnit) CreateRefund(ctx context.Context, r payments.Refund) error {
	return translate(u.q.RefundCreate(ctx, db.RefundCreateParams{
		AccountID: r.AccountID, ID: r.ID, PaymentID: r.PaymentID, Amount: r.Amount, Currency: r.Currency, Reason: r.Reason,
		IdempotencyKey: r.Key, KeyCreatedAt: r.KeyClaimedAt, CreatedAt: r.CreatedAt,
	}))
}

// EnqueueRefund implements payments.RefundUnit: the job is inserted in the
// transaction that creates the refund.
func (u *txUnit) EnqueueRefund(ctx context.Context, ref payments.RefundRef) error {
	if u.s.jobs == nil {
		return errNoJobs
	}
	return translate(u.s.jobs.InsertRefund(ctx, u.tx, ref))
}

// GetRefund implements payments.Reads and payments.Settlements.
func (r reads) GetRefund(ctx context.Context, account, id uuid.UUID) (payments.Refund, error) {
	var row db.Refund
	err := r.route(ctx, func(ctx context.Context, q *db.Queries) (err error) {
		row, err = q.RefundGet(ctx, db.RefundGetParams{AccountID: account, ID: id})
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return payments.Refund{}, payments.ErrRefundNotFound
	}
	if err != nil {
		return payments.Refund{}, translate(err)
	}
	return refundFromRow(row), nil
}

// ListRefunds implements payments.Reads.
func (r reads) ListRefunds(ctx context.Context, account, paymentID uuid.UUID) ([]payments.Refund, error) {
	var rows []db.Refund
	err := r.route(ctx, func(ctx context.Context, q *db.Queries) error {
		// The payment first, where the refunds are read: a replica that
		// does not hold it yet holds none of its refunds either, and the
		// list then comes from the primary.
		if _, err := q.PaymentGet(ctx, db.PaymentGetParams{AccountID: account, ID: paymentID}); err != nil {
			return err
		}
		var err error
		rows, err = q.RefundList(ctx, db.RefundListParams{AccountID: account, PaymentID: paymentID})
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, payments.ErrNotFound
	}
	if err != nil {
		return nil, translate(err)
	}
	out := make([]payments.Refund, 0, len(rows))
	for _, row := range rows {
		out = append(out, refundFromRow(row))
	}
	return out, nil
}

// FinishRefund implements payments.Settlements, as FinishPayment does.
func (s *Store) FinishRefund(ctx context.Context, r payments.Refund, final idempotency.Response) (bool, error) {
	return s.finish(ctx, final, func(q *db.Queries) (idempotency.Ref, error) {
		row, err := q.RefundFinish(ctx, db.RefundFinishParams{
			AccountID:        r.AccountID,
			ID:               r.ID,
			Status:           r.Status,
			FailureReason:    optional(r.FailureReason),
			ProviderRefundID: optional(r.ProviderRefundID),
			CompletedAt:      r.CompletedAt,
		})
		return claimOf(row.AccountID, row.IdempotencyKey, row.KeyCreatedAt), err
	})
}

func refundFromRow(row db.Refund) payments.Refund {
	r := payments.Refund{
		AccountID:        row.AccountID,
		ID:               row.ID,
		PaymentID:        row.PaymentID,
		Amount:           row.Amount,
		Currency:         row.Currency,
		Reason:           row.Reason,
		Status:           row.Status,
		FailureReason:    row.FailureReason.String,
		ProviderRefundID: row.ProviderRefundID.String,
		Key:              row.IdempotencyKey,
		KeyClaimedAt:     row.KeyCreatedAt,
		CreatedAt:        row.CreatedAt.UTC(),
		CompletedAt:      utc(row.CompletedAt),
	}
	return r
}
