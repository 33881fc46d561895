package memory

import (
	"cmp"
	"context"
	"slices"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/payments"
)

// RefundTotals implements payments.RefundUnit.
func (u *unit) RefundTotals(_ context.Context, account, paymentID uuid.UUID) (int64, int, error) {
	var (
		refunded int64
		n        int
	)
	u.read(func() {
		for _, r := range u.s.refunds[account] {
			if r.PaymentID != paymentID {
				continue
			}
			n++
			if r.Status != payments.StatusFailed {
				refunded += r.Amount
			}
		}
	})
	return refunded, n, nil
}

// CreateRefund implements payments.RefundUnit. Like PostgreSQL's foreign
// key, it refuses a refund of a payment that does not exist.
func (u *unit) CreateRefund(_ context.Context, r payments.Refund) error {
	s := u.s
	var err error
	u.write(func() {
		if _, ok := s.payments[r.AccountID][r.PaymentID]; !ok {
			err = payments.ErrNotFound
			return
		}
		byID := s.refunds[r.AccountID]
		if byID == nil {
			byID = map[uuid.UUID]payments.Refund{}
			s.refunds[r.AccountID] = byID
		}
		byID[r.ID] = r
	}, func() {
		delete(s.refunds[r.AccountID], r.ID)
	})
	return err
}

// GetRefund implements payments.Reads and payments.Settlements.
func (s *Store) GetRefund(_ context.Context, account, id uuid.UUID) (payments.Refund, error) {
	var (
		r  payments.Refund
		ok bool
	)
	s.read(func() { r, ok = s.refunds[account][id] })
	if !ok {
		return payments.Refund{}, payments.ErrRefundNotFound
	}
	return r, nil
}

// ListRefunds implements payments.Reads.
func (s *Store) ListRefunds(_ context.Context, account, paymentID uuid.UUID) ([]payments.Refund, error) {
	list := []payments.Refund{}
	found := false
	s.read(func() {
		_, found = s.payments[account][paymentID]
		for _, r := range s.refunds[account] {
			if r.PaymentID == paymentID {
				list = append(list, r)
			}
		}
	})
	slices.SortFunc(list, func(a, b payments.Refund) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return cmp.Compare(a.ID.String(), b.ID.String())
	})
	if !found {
		return nil, payments.ErrNotFound
	}
	return list, nil
}

// FinishRefund implements payments.Settlements, as FinishPayment does.
func (s *Store) FinishRefund(_ context.Context, r payments.Refund, final idempotency.Response) (bool, error) {
	var changed bool
	s.write(func() {
		cur, ok := s.refunds[r.AccountID][r.ID]
		if !ok || cur.Final() {
			return
		}
		cur.Status, cur.FailureReason, cur.ProviderRefundID, cur.CompletedAt = r.Status, r.FailureReason, r.ProviderRefundID, r.CompletedAt
		s.refunds[r.AccountID][r.ID] = cur
		s.keys.ReplaceProvisional(idempotency.Ref{Scope: auth.Scope(cur.AccountID), Key: cur.Key, ClaimedAt: cur.KeyClaimedAt}, final)
		changed = true
	})
	return changed, nil
}
