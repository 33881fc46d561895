// Package orders is the order domain: validating, creating, changing and
// cancelling orders and reading them back. It knows nothing about HTTP or
// idempotency: an order is written through the Writer or Changer it is
// handed (inside an idempotent request, the request's unit of work, so the
// order and the stored response commit together).
package orders

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"golang.org/x/text/currency"
)

// Statuses of an order. Cancelled is final.
const (
	StatusCreated   = "created"
	StatusCancelled = "cancelled"
)

// Errors the service returns; the HTTP layer maps each to one problem type.
var (
	// ErrNotFound: no such order in the caller's account. Another account's
	// order is not found either: existence must not leak across accounts.
	ErrNotFound = errors.New("order not found")
	// ErrUnknownCurrency: the code is well-formed but not an ISO 4217 currency.
	// It is a business outcome (422), stored and replayed under the key.
	ErrUnknownCurrency = errors.New("unknown currency")
	// ErrInvalidCursor: the pagination cursor was not issued by this service.
	ErrInvalidCursor = errors.New("invalid cursor")
	// ErrNotModifiable: the order is cancelled, or has a pending or
	// succeeded payment. A business outcome (409), stored and replayed.
	ErrNotModifiable = errors.New("the order cannot be changed")
	// ErrNotCancellable: the order has a pending or succeeded payment. A
	// business outcome (409), stored and replayed.
	ErrNotCancellable = errors.New("the order cannot be cancelled")
)

// Item is one order line.
type Item struct {
	SKU string `json:"sku"`
	Qty int32  `json:"qty"`
}

// Order is a created order.
type Order struct {
	AccountID uuid.UUID
	ID        uuid.UUID
	Status    string
	Amount    int64
	Currency  string
	Items     []Item
	CreatedAt time.Time
	// CancelledAt is set once the order is cancelled.
	CancelledAt *time.Time
}

// NewOrder is a request to create an order; the HTTP layer has already
// checked its shape against openapi.yaml.
type NewOrder struct {
	Items    []Item
	Amount   int64
	Currency string
}

// Writer creates orders. It only writes: creating an order reads nothing
// back, so a store may queue the write and send it with the request's
// claim, in one round trip.
type Writer interface {
	// CreateOrder inserts o.
	CreateOrder(ctx context.Context, o Order) error
}

// Patch is a change of an order (a JSON Merge Patch of it): nil fields keep
// their value, Items replaces the items as a whole.
type Patch struct {
	Items    *[]Item
	Amount   *int64
	Currency *string
}

// Changer is what changing or cancelling an order runs through: the unit of
// work of the request that claimed its key, so the change and the stored
// response commit together. Implementations must pass the conformance suite
// in internal/service/store/storetest.
type Changer interface {
	// LockOrder returns the account's order (or ErrNotFound) and holds it
	// until the unit of work ends: changes, cancellations and payments of
	// one order happen one at a time, each seeing what the last one did.
	LockOrder(ctx context.Context, account, id uuid.UUID) (Order, error)
	// HasActivePayment reports whether the order has a pending or
	// succeeded payment.
	HasActivePayment(ctx context.Context, account, id uuid.UUID) (bool, error)
	// UpdateOrder stores o's status, amount, currency, items and
	// cancellation time.
	UpdateOrder(ctx context.Context, o Order) error
}

// Repository reads orders. Implementations must pass the conformance suite
// in internal/service/store/storetest.
type Repository interface {
	// GetOrder returns the account's order or ErrNotFound.
	GetOrder(ctx context.Context, account, id uuid.UUID) (Order, error)
	// ListOrders returns up to limit orders of the account, newest first
	// (created_at, then id, descending), strictly after the cursor if given.
	ListOrders(ctx context.Context, account uuid.UUID, after *Cursor, limit int) ([]Order, error)
}

// Cursor is a position in the newest-first listing.
type Cursor struct {
	CreatedAt time.Time
	ID        uuid.UUID
}

// Service is the order use cases.
type Service struct {
	repo Repository
	now  func() time.Time
}

// NewService returns the service over repo.
func NewService(repo Repository) *Service {
	return &Service{repo: repo, now: time.Now}
}

// Create validates a new order for account and writes it through w.
func (s *Service) Create(ctx context.Context, w Writer, account uuid.UUID, in NewOrder) (Order, error) {
	if err := CheckCurrency(in.Currency); err != nil {
		return Order{}, err
	}
	id, err := uuid.NewV7()
	if err != nil {
		return Order{}, fmt.Errorf("new order id: %w", err)
	}
	o := Order{
		AccountID: account,
		ID:        id,
		Status:    StatusCreated,
		Amount:    in.Amount,
		Currency:  in.Currency,
		Items:     append([]Item(nil), in.Items...),
		// PostgreSQL keeps microseconds; truncating here makes the response
		// equal to what a later GET reads back.
		CreatedAt: s.now().UTC().Truncate(time.Microsecond),
	}
	if err := w.CreateOrder(ctx, o); err != nil {
		return Order{}, fmt.Errorf("store order: %w", err)
	}
	return o, nil
}

// Update applies p to one of account's orders through c, unless the order
// can no longer change (ErrNotModifiable).
func (s *Service) Update(ctx context.Context, c Changer, account uuid.UUID, id string, p Patch) (Order, error) {
	if p.Currency != nil {
		if err := CheckCurrency(*p.Currency); err != nil {
			return Order{}, err
		}
	}
	o, err := s.change(ctx, c, account, id, ErrNotModifiable, func(o *Order) {
		if p.Items != nil {
			o.Items = append([]Item(nil), (*p.Items)...)
		}
		if p.Amount != nil {
			o.Amount = *p.Amount
		}
		if p.Currency != nil {
			o.Currency = *p.Currency
		}
	})
	if errors.Is(err, errCancelled) {
		return Order{}, fmt.Errorf("%w: order %s is cancelled", ErrNotModifiable, o.ID)
	}
	return o, err
}

// Cancel cancels one of account's orders through c, unless it has a pending
// or succeeded payment (ErrNotCancellable). An order cancelled before is
// returned as it is: the cancellation the caller asked for holds.
func (s *Service) Cancel(ctx context.Context, c Changer, account uuid.UUID, id string) (Order, error) {
	o, err := s.change(ctx, c, account, id, ErrNotCancellable, func(o *Order) {
		now := s.now().UTC().Truncate(time.Microsecond)
		o.Status, o.CancelledAt = StatusCancelled, &now
	})
	if errors.Is(err, errCancelled) {
		return o, nil
	}
	return o, err
}

// errCancelled is change's answer for an order cancelled before, which it
// returns as well.
var errCancelled = errors.New("the order is cancelled")

// change locks the order; refuses it with errCancelled if it is cancelled,
// or with paid if it has a pending or succeeded payment; and otherwise
// applies apply and stores the result.
func (s *Service) change(ctx context.Context, c Changer, account uuid.UUID, id string, paid error, apply func(*Order)) (Order, error) {
	oid, err := uuid.Parse(id)
	if err != nil {
		return Order{}, ErrNotFound // not an id we could have issued
	}
	o, err := c.LockOrder(ctx, account, oid)
	if err != nil {
		return Order{}, err
	}
	if o.Status == StatusCancelled {
		return o, errCancelled
	}
	active, err := c.HasActivePayment(ctx, account, oid)
	if err != nil {
		return Order{}, fmt.Errorf("read the order's payments: %w", err)
	}
	if active {
		return Order{}, fmt.Errorf("%w: order %s has a pending or succeeded payment", paid, o.ID)
	}
	apply(&o)
	if err := c.UpdateOrder(ctx, o); err != nil {
		return Order{}, fmt.Errorf("store order: %w", err)
	}
	return o, nil
}

// CheckCurrency returns ErrUnknownCurrency (wrapped, naming the code) unless
// code is an upper-case ISO 4217 currency code. Payments check theirs with
// it too, so both refuse the same codes.
func CheckCurrency(code string) error {
	if _, err := currency.ParseISO(code); err != nil || strings.ToUpper(code) != code {
		return fmt.Errorf("%w: %q is not an ISO 4217 currency code", ErrUnknownCurrency, code)
	}
	return nil
}

// Get returns one of account's orders.
func (s *Service) Get(ctx context.Context, account uuid.UUID, id string) (Order, error) {
	oid, err := uuid.Parse(id)
	if err != nil {
		return Order{}, ErrNotFound // not an id we could have issued
	}
	return s.repo.GetOrder(ctx, account, oid)
}

// Page is one page of a listing.
type Page struct {
	Orders []Order
	// Next is the cursor of the following page, empty on the last page.
	Next string
}

// List returns a page of account's orders, newest first.
func (s *Service) List(ctx context.Context, account uuid.UUID, cursor string, limit int) (Page, error) {
	var after *Cursor
	if cursor != "" {
		c, err := decodeCursor(cursor)
		if err != nil {
			return Page{}, err
		}
		after = &c
	}
	// One extra row tells whether another page exists without a count query.
	list, err := s.repo.ListOrders(ctx, account, after, limit+1)
	if err != nil {
		return Page{}, fmt.Errorf("list orders: %w", err)
	}
	page := Page{Orders: list}
	if len(list) > limit {
		page.Orders = list[:limit]
		last := page.Orders[limit-1]
		page.Next = encodeCursor(Cursor{CreatedAt: last.CreatedAt, ID: last.ID})
	}
	return page, nil
}

// Cursors are opaque to clients: base64url of "<unix micros>.<uuid>".
func encodeCursor(c Cursor) string {
	raw := fmt.Sprintf("%d.%s", c.CreatedAt.UnixMicro(), c.ID)
	return base64.RawURLEncoding.EncodeToString([]byte(raw))
}

func decodeCursor(s string) (Cursor, error) {
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return Cursor{}, ErrInvalidCursor
	}
	micros, id, ok := strings.Cut(string(raw), ".")
	if !ok {
		return Cursor{}, ErrInvalidCursor
	}
	us, err := strconv.ParseInt(micros, 10, 64)
	if err != nil {
		return Cursor{}, ErrInvalidCursor
	}
	oid, err := uuid.Parse(id)
	if err != nil {
		return Cursor{}, ErrInvalidCursor
	}
	return Cursor{CreatedAt: time.UnixMicro(us).UTC(), ID: oid}, nil
}
