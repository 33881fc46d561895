package memory

import (
	"cmp"
	"context"
	"errors"
	"slices"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/orders"
	"github.com/oncekey/oncekey/internal/service/payments"
)

// CreateOrder implements orders.Writer.
func (u *unit) CreateOrder(_ context.Context, o orders.Order) error {
	s := u.s
	o.Items = slices.Clone(o.Items)
	u.write(func() { s.putOrder(o) }, func() {
		delete(s.orders[o.AccountID], o.ID)
	})
	return nil
}

// GetOrder implements orders.Repository.
func (s *Store) GetOrder(_ context.Context, account, id uuid.UUID) (orders.Order, error) {
	return s.getOrder(s.read, account, id)
}

// LockOrder implements orders.Changer and payments.Unit: the unit takes
// the data lock (as a first write would), so no other unit of work changes
// anything until it ends.
func (u *unit) LockOrder(_ context.Context, account, id uuid.UUID) (orders.Order, error) {
	u.lock()
	return u.s.getOrder(u.read, account, id)
}

// HasActivePayment implements orders.Changer.
func (u *unit) HasActivePayment(ctx context.Context, account, id uuid.UUID) (bool, error) {
	_, err := u.ActivePayment(ctx, account, id)
	if errors.Is(err, payments.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// ActivePayment implements payments.Unit.
func (u *unit) ActivePayment(_ context.Context, account, orderID uuid.UUID) (payments.Payment, error) {
	var (
		active payments.Payment
		found  bool
	)
	u.read(func() {
		for _, p := range u.s.payments[account] {
			if p.OrderID == orderID && p.Status != payments.StatusFailed {
				active, found = p, true
			}
		}
	})
	if !found {
		return payments.Payment{}, payments.ErrNotFound
	}
	return active, nil
}

// UpdateOrder implements orders.Changer.
func (u *unit) UpdateOrder(_ context.Context, o orders.Order) error {
	s := u.s
	var (
		old orders.Order
		ok  bool
	)
	o.Items = slices.Clone(o.Items)
	u.write(func() {
		if old, ok = s.orders[o.AccountID][o.ID]; ok {
			s.putOrder(o)
		}
	}, func() {
		if ok {
			s.putOrder(old)
		}
	})
	if !ok {
		return orders.ErrNotFound
	}
	return nil
}

func (s *Store) getOrder(read func(func()), account, id uuid.UUID) (orders.Order, error) {
	var (
		o  orders.Order
		ok bool
	)
	read(func() { o, ok = s.orders[account][id] })
	if !ok {
		return orders.Order{}, orders.ErrNotFound
	}
	o.Items = slices.Clone(o.Items)
	return o, nil
}

// ListOrders implements orders.Repository. It sorts the account's orders on
// every call: fine for a store meant for trying the API.
func (s *Store) ListOrders(_ context.Context, account uuid.UUID, after *orders.Cursor, limit int) ([]orders.Order, error) {
	var list []orders.Order
	s.read(func() {
		for _, o := range s.orders[account] {
			if after == nil || before(o, *after) {
				o.Items = slices.Clone(o.Items)
				list = append(list, o)
			}
		}
	})
	slices.SortFunc(list, func(a, b orders.Order) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return cmp.Compare(b.ID.String(), a.ID.String())
	})
	if len(list) > limit {
		list = list[:limit]
	}
	return list, nil
}

// before reports whether o sorts after the cursor in newest-first order,
// i.e. (created_at, id) < (cursor.created_at, cursor.id).
func before(o orders.Order, c orders.Cursor) bool {
	if !o.CreatedAt.Equal(c.CreatedAt) {
		return o.CreatedAt.Before(c.CreatedAt)
	}
	return o.ID.String() < c.ID.String()
}

// AccountByKeyHash implements auth.Store.
func (s *Store) AccountByKeyHash(_ context.Context, hash auth.KeyHash) (uuid.UUID, error) {
	s.authMu.RLock()
	defer s.authMu.RUnlock()
	id, ok := s.apiKeys[hash]
	if !ok {
		return uuid.UUID{}, auth.ErrUnknownKey
	}
	return id, nil
}

// CreateAccount implements auth.Store.
func (s *Store) CreateAccount(_ context.Context, id uuid.UUID, name string, hash auth.KeyHash) error {
	s.authMu.Lock()
	defer s.authMu.Unlock()
	s.accounts[id] = name
	s.apiKeys[hash] = id
	return nil
}

// AccountsNamed implements store.Backend.
func (s *Store) AccountsNamed(_ context.Context, name string) ([]uuid.UUID, error) {
	s.authMu.RLock()
	defer s.authMu.RUnlock()
	var ids []uuid.UUID
	for id, n := range s.accounts {
		if n == name && len(ids) < 10 {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// RevokeKey implements auth.Store.
func (s *Store) RevokeKey(_ context.Context, hash auth.KeyHash) (bool, error) {
	s.authMu.Lock()
	defer s.authMu.Unlock()
	_, ok := s.apiKeys[hash]
	delete(s.apiKeys, hash)
	return ok, nil
}

// CreateOrder creates o on its own, outside any idempotent operation
// (storetest's fixtures, and a writer that needs no key).
func (s *Store) CreateOrder(_ context.Context, o orders.Order) error {
	o.Items = slices.Clone(o.Items)
	s.write(func() { s.putOrder(o) })
	return nil
}

// putOrder stores o; the caller holds the data write lock.
func (s *Store) putOrder(o orders.Order) {
	byID := s.orders[o.AccountID]
	if byID == nil {
		byID = map[uuid.UUID]orders.Order{}
		s.orders[o.AccountID] = byID
	}
	byID[o.ID] = o
}
