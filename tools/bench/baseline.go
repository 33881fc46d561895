package main

import (
	"context"
	"errors"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/orders"
	"github.com/oncekey/oncekey/internal/service/store"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
)

// keepNothing is the key store the baseline's server is built with, from
// the service's exported pieces (httpapi.Config.DeferredKeys): every claim
// is a lease whose order goes to the database on its own, one INSERT as
// the service's would be without a key (postgres.Store.CreateOrder), and
// whose commit stores no record. The service has no switch that turns its
// protocol off; on this store it runs POST /orders exactly as on the real
// one, less everything the key costs in PostgreSQL: the claim, the key
// row, its index entries and the round trip they share with the order.
type keepNothing struct{ db *postgres.Store }

// Claim implements idempotency.Store: the key is always free.
func (s keepNothing) Claim(_ context.Context, req idempotency.ClaimRequest) (idempotency.Lease[store.Deferred], *idempotency.Record, error) {
	return keptNothing{db: s.db, ref: idempotency.Ref{Scope: req.Scope, Key: req.Key}}, nil, nil
}

// Settle, Release, PurgeExpired and KeyStats implement idempotency.Store:
// a store that keeps nothing has nothing to settle, purge or count.
func (keepNothing) Settle(context.Context, idempotency.Ref, idempotency.Response) (bool, error) {
	return false, errors.ErrUnsupported
}

func (keepNothing) Release(context.Context, idempotency.Ref) (bool, error) {
	return false, errors.ErrUnsupported
}

func (keepNothing) PurgeExpired(context.Context, int) (int64, error) { return 0, errors.ErrUnsupported }

func (keepNothing) KeyStats(context.Context) (idempotency.Stats, error) {
	return idempotency.Stats{}, errors.ErrUnsupported
}

// keptNothing is keepNothing's lease, and its unit of work: the order is
// written when the operation writes it, committed on its own.
type keptNothing struct {
	db  *postgres.Store
	ref idempotency.Ref
}

func (l keptNothing) Unit() store.Deferred                             { return l }
func (l keptNothing) Ref() idempotency.Ref                             { return l.ref }
func (keptNothing) Commit(context.Context, idempotency.Response) error { return nil }
func (keptNothing) Rollback(context.Context) error                     { return nil }

// CreateOrder implements orders.Writer.
func (l keptNothing) CreateOrder(ctx context.Context, o orders.Order) error {
	return l.db.CreateOrder(ctx, o)
}
