package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/gen/db"
	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/orders"
)

// CreateOrder implements orders.Writer for a write-only operation: the
// order is written only if its claim is.
func (w *deferredWrites) CreateOrder(ctx context.Context, o orders.Order) error {
	items, err := json.Marshal(o.Items)
	if err != nil {
		return fmt.Errorf("encode items: %w", err)
	}
	if w.claim.Scope != auth.Scope(o.AccountID) {
		return fmt.Errorf("order of account %s under another account's key", o.AccountID)
	}
	return translate(w.q.OrderCreateGuarded(ctx, db.OrderCreateGuardedParams{
		AccountID: o.AccountID, ID: o.ID, Status: o.Status, Amount: o.Amount,
		Currency: o.Currency, Items: items, CreatedAt: o.CreatedAt,
	}))
}

// CreateOrder creates o on its own, outside any idempotent operation
// (storetest's fixtures, and a writer that needs no key).
func (s *Store) CreateOrder(ctx context.Context, o orders.Order) error {
	items, err := json.Marshal(o.Items)
	if err != nil {
		return fmt.Errorf("encode items: %w", err)
	}
	err = db.New(s.pool).OrderCreate(ctx, db.OrderCreateParams{
		AccountID: o.AccountID,
		ID:        o.ID,
		Status:    o.Status,
		Amount:    o.Amount,
		Currency:  o.Currency,
		Items:     items,
		CreatedAt: o.CreatedAt,
	})
	return translate(err)
}

// GetOrder implements orders.Repository.
func (r reads) GetOrder(ctx context.Context, account, id uuid.UUID) (orders.Order, error) {
	var row db.Order
	err := r.route(ctx, func(ctx context.Context, q *db.Queries) (err error) {
		row, err = q.OrderGet(ctx, db.OrderGetParams{AccountID: account, ID: id})
		return err
	})
	return foundOrder(row, err)
}

// LockOrder implements orders.Changer and payments.Unit: SELECT … FOR
// UPDATE in the unit's transaction.
func (u *txUnit) LockOrder(ctx context.Context, account, id uuid.UUID) (orders.Order, error) {
	return foundOrder(u.q.OrderGetForUpdate(ctx, db.OrderGetForUpdateParams{AccountID: account, ID: id}))
}

// foundOrder is the order a query found, or orders.ErrNotFound.
func foundOrder(row db.Order, err error) (orders.Order, error) {
	if errors.Is(err, pgx.ErrNoRows) {
		return orders.Order{}, orders.ErrNotFound
	}
	if err != nil {
		return orders.Order{}, translate(err)
	}
	return orderFromRow(row)
}

// HasActivePayment implements orders.Changer.
func (u *txUnit) HasActivePayment(ctx context.Context, account, id uuid.UUID) (bool, error) {
	active, err := u.q.OrderHasActivePayment(ctx, db.OrderHasActivePaymentParams{AccountID: account, OrderID: id})
	return active, translate(err)
}

// UpdateOrder implements orders.Changer.
func (u *txUnit) UpdateOrder(ctx context.Context, o orders.Order) error {
	items, err := json.Marshal(o.Items)
	if err != nil {
		return fmt.Errorf("encode items: %w", err)
	}
	n, err := u.q.OrderUpdate(ctx, db.OrderUpdateParams{
		AccountID: o.AccountID, ID: o.ID, Status: o.Status, Amount: o.Amount, Currency: o.Currency,
		Items: items, CancelledAt: o.CancelledAt,
	})
	if err == nil && n == 0 {
		return orders.ErrNotFound
	}
	return translate(err)
}

// ListOrders implements orders.Repository.
func (r reads) ListOrders(ctx context.Context, account uuid.UUID, after *orders.Cursor, limit int) ([]orders.Order, error) {
	var rows []db.Order
	err := r.route(ctx, func(ctx context.Context, q *db.Queries) (err error) {
		if after == nil {
			rows, err = q.OrderListFirst(ctx, db.OrderListFirstParams{AccountID: account, Limit: int32(limit)})
			return err
		}
		rows, err = q.OrderListAfter(ctx, db.OrderListAfterParams{
			AccountID: account, CursorCreatedAt: after.CreatedAt, CursorID: after.ID, PageSize: int32(limit),
		})
		return err
	})
	if err != nil {
		return nil, translate(err)
	}
	out := make([]orders.Order, 0, len(rows))
	for _, row := range rows {
		o, err := orderFromRow(row)
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, nil
}

func orderFromRow(row db.Order) (orders.Order, error) {
	o := orders.Order{
		AccountID:   row.AccountID,
		ID:          row.ID,
		Status:      row.Status,
		Amount:      row.Amount,
		Currency:    row.Currency,
		CreatedAt:   row.CreatedAt.UTC(),
		CancelledAt: utc(row.CancelledAt),
	}
	if err := json.Unmarshal(row.Items, &o.Items); err != nil {
		return orders.Order{}, fmt.Errorf("decode items of order %s: %w", row.ID, err)
	}
	return o, nil
}
