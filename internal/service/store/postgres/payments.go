package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/oncekey/oncekey/gen/db"
	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/payments"
)

// ActivePayment implements payments.Unit.
func (u *txUnit) ActivePayment(ctx context.Context, account, orderID uuid.UUID) (payments.Payment, error) {
	return foundPayment(u.q.PaymentGetActiveForOrder(ctx, db.PaymentGetActiveForOrderParams{AccountID: account, OrderID: orderID}))
}

// foundPayment is the payment a query found, or payments.ErrNotFound.
func foundPayment(row db.Payment, err error) (payments.Payment, error) {
	if errors.Is(err, pgx.ErrNoRows) {
		return payments.Payment{}, payments.ErrNotFound
	}
	if err != nil {
		return payments.Payment{}, translate(err)
	}
	return paymentFromRow(row), nil
}

// CreatePayment implements payments.Unit. A second active payment of the
// order violates payments_one_active_per_order; payments.Service.Create
// checks for one under the order's lock first, so only a caller that
// skipped that check meets it, and the answer is to retry (the retry
// finds the first payment and is told so), not a 500.
func (u *txUnit) CreatePayment(ctx context.Context, p payments.Payment) error {
	err := u.q.PaymentCreate(ctx, db.PaymentCreateParams{
		AccountID:      p.AccountID,
		ID:             p.ID,
		OrderID:        p.OrderID,
		Amount:         p.Amount,
		Currency:       p.Currency,
		IdempotencyKey: p.Key,
		KeyCreatedAt:   p.KeyClaimedAt,
		CreatedAt:      p.CreatedAt,
	})
	var pgErr *pgconn.PgError
	// Named by its columns, not its name: each partition of a partitioned
	// payments table has an index of its own name.
	if errors.As(err, &pgErr) && pgErr.Code == "23505" && strings.HasPrefix(pgErr.Detail, "Key (account_id, order_id)=") {
		return fmt.Errorf("%w: order %s has another pending or succeeded payment: %w", idempotency.ErrUnavailable, p.OrderID, err)
	}
	return translate(err)
}

// EnqueueCharge implements payments.Unit: the job is inserted in the
// transaction that creates the payment.
func (u *txUnit) EnqueueCharge(ctx context.Context, ref payments.Ref) error {
	if u.s.jobs == nil {
		return errNoJobs
	}
	return translate(u.s.jobs.InsertCharge(ctx, u.tx, ref))
}

// errNoJobs: the store was made without a job queue (postgres.New's jobs).
var errNoJobs = errors.New("postgres: no job queue to enqueue a payment's charge or a refund in")

// LockPayment implements payments.RefundUnit.
func (u *txUnit) LockPayment(ctx context.Context, account, id uuid.UUID) (payments.Payment, error) {
	return foundPayment(u.q.PaymentGetForUpdate(ctx, db.PaymentGetForUpdateParams{AccountID: account, ID: id}))
}

// GetPayment implements payments.Reads and payments.Settlements.
func (r reads) GetPayment(ctx context.Context, account, id uuid.UUID) (payments.Payment, error) {
	var row db.Payment
	err := r.route(ctx, func(ctx context.Context, q *db.Queries) (err error) {
		row, err = q.PaymentGet(ctx, db.PaymentGetParams{AccountID: account, ID: id})
		return err
	})
	return foundPayment(row, err)
}

// FinishPayment implements payments.Settlements: the payment's final state
// and the response its key replays from now on commit in one transaction.
func (s *Store) FinishPayment(ctx context.Context, p payments.Payment, final idempotency.Response) (bool, error) {
	return s.finish(ctx, final, func(q *db.Queries) (idempotency.Ref, error) {
		row, err := q.PaymentFinish(ctx, db.PaymentFinishParams{
			AccountID:        p.AccountID,
			ID:               p.ID,
			Status:           p.Status,
			FailureReason:    optional(p.FailureReason),
			ProviderChargeID: optional(p.ProviderChargeID),
			CompletedAt:      p.CompletedAt,
		})
		return claimOf(row.AccountID, row.IdempotencyKey, row.KeyCreatedAt), err
	})
}

// finish makes a long operation final with settle, which returns the key
// record the operation answers for (pgx.ErrNoRows when it was final
// already), and replaces that record's provisional response with final, in
// one transaction.
func (s *Store) finish(ctx context.Context, final idempotency.Response, settle func(*db.Queries) (idempotency.Ref, error)) (bool, error) {
	changed := false
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		claim, err := settle(db.New(tx))
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // already final
		}
		if err != nil {
			return fmt.Errorf("make final: %w", err)
		}
		// The key row is named by the operation's own binding, not by the
		// caller, so it cannot point the outcome at another key. No row:
		// the key expired and was purged (or reused); the operation is
		// final anyway.
		if _, err := s.keys.ReplaceProvisional(ctx, tx, claim, final); err != nil {
			return fmt.Errorf("replace the key's provisional response: %w", err)
		}
		changed = true
		return nil
	})
	return changed, translate(err)
}

// claimOf is the key record a payment or refund was accepted under.
func claimOf(account uuid.UUID, key string, claimedAt time.Time) idempotency.Ref {
	return idempotency.Ref{Scope: auth.Scope(account), Key: key, ClaimedAt: claimedAt}
}

// optional is a text column that is NULL when s is empty.
func optional(s string) pgtype.Text { return pgtype.Text{String: s, Valid: s != ""} }

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
		CompletedAt:      utc(row.CompletedAt),
	}
	return p
}

// CountPayments returns how many payments the account has, for tests and
// operators checking that retries created no second one.
func (s *Store) CountPayments(ctx context.Context, account uuid.UUID) (int, error) {
	n, err := db.New(s.pool).PaymentCount(ctx, account)
	return int(n), translate(err)
}
