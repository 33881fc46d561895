// Package memory is an in-process backend with the same semantics as the
// PostgreSQL one, for trying the API without a database: its keys are the
// idempotency engine's memstore, its domain data lives in maps. It passes
// the same conformance suites. State lives in one process and is lost on
// exit; it is not for production.
package memory

import (
	"context"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/ledger"
	"github.com/oncekey/oncekey/internal/service/orders"
	"github.com/oncekey/oncekey/internal/service/payments"
	"github.com/oncekey/oncekey/internal/service/store"
)

// Store implements store.Backend.
//
// Domain data has a transaction model as simple as it can be while matching
// PostgreSQL's guarantees: a unit of work takes the data write lock at its
// first write and holds it until its lease commits or rolls back, undoing
// its writes on rollback. Readers take the read lock, so no one ever sees an
// uncommitted write.
type Store struct {
	now  func() time.Time
	keys *memstore.Store
	tx   idempotency.Store[store.Tx]
	w    idempotency.Store[store.Deferred]

	data          sync.RWMutex
	orders        map[uuid.UUID]map[uuid.UUID]orders.Order
	bonusBalances map[uuid.UUID]int64
	bonusEntries  map[uuid.UUID][]ledger.Entry
	payments      map[uuid.UUID]map[uuid.UUID]payments.Payment
	refunds       map[uuid.UUID]map[uuid.UUID]payments.Refund
	tasks         taskQueue

	// Accounts have their own lock: authentication must never wait for an
	// operation that holds the data lock.
	authMu   sync.RWMutex
	apiKeys  map[auth.KeyHash]uuid.UUID
	accounts map[uuid.UUID]string
}

var _ store.Backend = (*Store)(nil)

// New returns an empty store.
func New() *Store {
	s := &Store{
		now:           time.Now,
		keys:          memstore.New(),
		orders:        map[uuid.UUID]map[uuid.UUID]orders.Order{},
		bonusBalances: map[uuid.UUID]int64{},
		bonusEntries:  map[uuid.UUID][]ledger.Entry{},
		payments:      map[uuid.UUID]map[uuid.UUID]payments.Payment{},
		refunds:       map[uuid.UUID]map[uuid.UUID]payments.Refund{},
		tasks:         newTaskQueue(),
		apiKeys:       map[auth.KeyHash]uuid.UUID{},
		accounts:      map[uuid.UUID]string{},
	}
	s.tx = idempotency.MapUnit(s.keys, func(tx *memstore.Tx, claim idempotency.Ref) store.Tx { return &unit{s: s, tx: tx, claim: claim} })
	s.w = idempotency.MapUnit(s.keys, func(tx *memstore.Tx, _ idempotency.Ref) store.Deferred { return &unit{s: s, tx: tx} })
	return s
}

// Keys implements store.Backend.
func (s *Store) Keys() idempotency.Store[store.Tx] { return s.tx }

// DeferredKeys implements store.Backend. In memory there is no round trip to
// save: write-only operations claim as the others do.
func (s *Store) DeferredKeys() idempotency.Store[store.Deferred] { return s.w }

// Ready implements store.Backend; memory is always ready.
func (s *Store) Ready(context.Context) error { return nil }

// PurgeExpired implements idempotency.Store.
func (s *Store) PurgeExpired(ctx context.Context, batch int) (int64, error) {
	return s.keys.PurgeExpired(ctx, batch)
}

// KeyStats implements idempotency.Store.
func (s *Store) KeyStats(ctx context.Context) (idempotency.Stats, error) {
	return s.keys.KeyStats(ctx)
}

// unit is a lease's unit of work on the domain data: store.Tx and
// store.Deferred.
type unit struct {
	s     *Store
	tx    *memstore.Tx
	claim idempotency.Ref

	mu     sync.Mutex
	locked bool     // holds s.data's write lock
	undo   []func() // in order of the writes
}

// Claim implements store.Tx: the claim whose unit of work u is.
func (u *unit) Claim() idempotency.Ref { return u.claim }

// write applies a domain write inside the unit, taking the data lock on the
// first one; the lock is held, and the undos kept, until the lease ends.
func (u *unit) write(apply, undo func()) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if !u.locked {
		u.s.data.Lock()
		u.locked = true
		u.tx.OnCommit(u.s.data.Unlock)
		u.tx.OnRollback(func() {
			u.mu.Lock()
			defer u.mu.Unlock()
			for i := len(u.undo) - 1; i >= 0; i-- {
				u.undo[i]()
			}
			u.s.data.Unlock()
		})
	}
	apply()
	u.undo = append(u.undo, undo)
}

// lock takes the data write lock for the rest of the unit of work, as a
// write would: what the unit reads next cannot change under it.
func (u *unit) lock() { u.write(func() {}, func() {}) }

// read runs fn under the read lock, unless the unit already holds the write
// lock (a read after a write in the same unit of work).
func (u *unit) read(fn func()) {
	u.mu.Lock()
	held := u.locked
	u.mu.Unlock()
	if held {
		fn()
		return
	}
	u.s.read(fn)
}

// write runs a domain write on its own, outside any unit of work.
func (s *Store) write(apply func()) {
	s.data.Lock()
	defer s.data.Unlock()
	apply()
}

// read runs fn under the read lock.
func (s *Store) read(fn func()) {
	s.data.RLock()
	defer s.data.RUnlock()
	fn()
}
