package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/oncekey/oncekey/gen/db"
	"github.com/oncekey/oncekey/internal/service/payments"
)

// PendingStats implements metrics.PendingSource.
func (s *Store) PendingStats(ctx context.Context) (payments.PendingStats, error) {
	q := db.New(s.pool)
	p, err := q.PaymentPendingStats(ctx)
	if err != nil {
		return payments.PendingStats{}, translate(fmt.Errorf("count pending payments: %w", err))
	}
	r, err := q.RefundPendingStats(ctx)
	if err != nil {
		return payments.PendingStats{}, translate(fmt.Errorf("count pending refunds: %w", err))
	}
	return payments.PendingStats{
		Payments: payments.Pending{Count: p.Pending, OldestAge: seconds(p.OldestAgeSeconds)},
		Refunds:  payments.Pending{Count: r.Pending, OldestAge: seconds(r.OldestAgeSeconds)},
	}, nil
}

// PendingOlderThan returns up to limit payments and up to limit refunds
// pending for longer than age, oldest first (`oncekey payments stuck`).
func (s *Store) PendingOlderThan(ctx context.Context, age time.Duration, limit int) ([]payments.Payment, []payments.Refund, error) {
	q := db.New(s.pool)
	prows, err := q.PaymentListPending(ctx, db.PaymentListPendingParams{OlderThanSeconds: age.Seconds(), MaxRows: int32(limit)})
	if err != nil {
		return nil, nil, translate(fmt.Errorf("list pending payments: %w", err))
	}
	rrows, err := q.RefundListPending(ctx, db.RefundListPendingParams{OlderThanSeconds: age.Seconds(), MaxRows: int32(limit)})
	if err != nil {
		return nil, nil, translate(fmt.Errorf("list pending refunds: %w", err))
	}
	ps := make([]payments.Payment, 0, len(prows))
	for _, row := range prows {
		ps = append(ps, paymentFromRow(row))
	}
	rs := make([]payments.Refund, 0, len(rrows))
	for _, row := range rrows {
		rs = append(rs, refundFromRow(row))
	}
	return ps, rs, nil
}

func seconds(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
