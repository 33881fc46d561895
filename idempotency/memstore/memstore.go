// Package memory is an in-process store with the same semantics as the
// PostgreSQL one, for trying the API without a database. It passes the same
// conformance suite (internal/store/storetest). State lives in one process
// and is lost on exit; it is not for production.
package memory

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/internal/auth"
	"github.com/oncekey/oncekey/internal/idempotency"
	"github.com/oncekey/oncekey/internal/ledger"
	"github.com/oncekey/oncekey/internal/orders"
	"github.com/oncekey/oncekey/internal/payments"
)

// Store implements idempotency.Store, orders.Repository and auth.Store.
//
// Domain data has a transaction model as simple as it can be while matching
// PostgreSQL's guarantees: a lease takes the data write lock at its first
// domain write and holds it until Commit or Rollback, undoing its writes on
// Rollback. Readers take the read lock, so no one ever sees an uncommitted
// write.
type Store struct {
	now func() time.Time

	keysMu sync.Mutex
	keys   map[scope]*entry

	data          sync.RWMutex
	orders        map[uuid.UUID]map[uuid.UUID]orders.Order
	bonusBalances map[uuid.UUID]int64
	bonusEntries  map[uuid.UUID][]ledger.Entry
	payments      map[uuid.UUID]map[uuid.UUID]payments.Payment
	charges       chargeQueue

	// Accounts have their own lock: authentication must never wait for an
	// operation that holds the data lock.
	authMu   sync.RWMutex
	apiKeys  map[auth.KeyHash]uuid.UUID
	accounts map[uuid.UUID]string
}

type scope struct {
	account uuid.UUID
	key     string
}

// entry is a key's state: in flight (rec == nil, done open) or completed.
type entry struct {
	rec       *idempotency.Record
	done      chan struct{} // closed when the in-flight holder settles
	claimedAt time.Time
}

// New returns an empty store.
func New() *Store {
	return &Store{
		now:           time.Now,
		keys:          map[scope]*entry{},
		orders:        map[uuid.UUID]map[uuid.UUID]orders.Order{},
		bonusBalances: map[uuid.UUID]int64{},
		bonusEntries:  map[uuid.UUID][]ledger.Entry{},
		payments:      map[uuid.UUID]map[uuid.UUID]payments.Payment{},
		charges:       newChargeQueue(),
		apiKeys:       map[auth.KeyHash]uuid.UUID{},
		accounts:      map[uuid.UUID]string{},
	}
}

// Ping implements the readiness check; memory is always ready.
func (s *Store) Ping(context.Context) error { return nil }

// Claim implements idempotency.Store.
func (s *Store) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Lease, *idempotency.Record, error) {
	k := scope{req.Account, req.Key}
	timer := time.NewTimer(req.Wait)
	defer timer.Stop()
	for {
		s.keysMu.Lock()
		e := s.keys[k]
		if e == nil || (e.rec != nil && !s.now().Before(e.rec.ExpiresAt)) {
			e = &entry{done: make(chan struct{}), claimedAt: s.now()}
			s.keys[k] = e
			s.keysMu.Unlock()
			return &lease{s: s, scope: k, entry: e, fingerprint: req.Fingerprint, ttl: req.TTL, claimedAt: e.claimedAt}, nil, nil
		}
		if e.rec != nil {
			rec := copyRecord(*e.rec)
			s.keysMu.Unlock()
			return nil, &rec, nil
		}
		done := e.done
		s.keysMu.Unlock()
		select {
		case <-done: // settled: look again
		case <-timer.C:
			return nil, nil, idempotency.ErrInFlight
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}

// PurgeExpired deletes expired records. Batching is moot in memory; the
// parameter keeps the signature of the PostgreSQL store.
func (s *Store) PurgeExpired(_ context.Context, _ int) (int64, error) {
	s.keysMu.Lock()
	defer s.keysMu.Unlock()
	now := s.now()
	var n int64
	for k, e := range s.keys {
		if e.rec != nil && !now.Before(e.rec.ExpiresAt) {
			delete(s.keys, k)
			n++
		}
	}
	return n, nil
}

type leaseKey struct{}

// lease is a claimed key plus its unit of work on the domain data.
type lease struct {
	s           *Store
	scope       scope
	entry       *entry
	fingerprint idempotency.Fingerprint
	ttl         time.Duration
	claimedAt   time.Time // expiry counts from the claim, as in PostgreSQL

	mu      sync.Mutex
	locked  bool     // holds s.data's write lock
	undo    []func() // in order of the writes
	settled bool
}

func (l *lease) Context(ctx context.Context) context.Context {
	return context.WithValue(ctx, leaseKey{}, l)
}

func (l *lease) ClaimedAt() time.Time { return l.claimedAt }

// write applies a domain write inside the lease, taking the data lock on
// the first one.
func (l *lease) write(apply, undo func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.locked {
		l.s.data.Lock()
		l.locked = true
	}
	apply()
	l.undo = append(l.undo, undo)
}

func (l *lease) Commit(_ context.Context, resp idempotency.Response) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.settled {
		return errSettled
	}
	l.settled = true
	rec := copyRecord(idempotency.Record{
		Fingerprint: l.fingerprint, Response: resp, CreatedAt: l.claimedAt, ExpiresAt: l.claimedAt.Add(l.ttl),
	})
	l.s.keysMu.Lock()
	l.entry.rec = &rec
	l.s.keysMu.Unlock()
	l.release()
	return nil
}

func (l *lease) Rollback(context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.settled {
		return nil
	}
	l.settled = true
	for _, undo := range slices.Backward(l.undo) {
		undo()
	}
	l.s.keysMu.Lock()
	if l.s.keys[l.scope] == l.entry {
		delete(l.s.keys, l.scope)
	}
	l.s.keysMu.Unlock()
	l.release()
	return nil
}

// release ends the unit of work: data visible, waiters woken.
func (l *lease) release() {
	if l.locked {
		l.s.data.Unlock()
		l.locked = false
	}
	close(l.entry.done)
}

// write runs a domain write inside ctx's lease or, outside one, on its own.
func (s *Store) write(ctx context.Context, apply, undo func()) {
	if l, ok := ctx.Value(leaseKey{}).(*lease); ok && l.s == s {
		l.write(apply, undo)
		return
	}
	s.data.Lock()
	defer s.data.Unlock()
	apply()
}

// read runs fn under the read lock, unless ctx's lease already holds the
// write lock (a read after a write in the same unit of work).
func (s *Store) read(ctx context.Context, fn func()) {
	if l, ok := ctx.Value(leaseKey{}).(*lease); ok && l.s == s {
		l.mu.Lock()
		held := l.locked
		l.mu.Unlock()
		if held {
			fn()
			return
		}
	}
	s.data.RLock()
	defer s.data.RUnlock()
	fn()
}

func copyRecord(r idempotency.Record) idempotency.Record {
	r.Response.Header = r.Response.Header.Clone()
	if r.Response.Header == nil {
		r.Response.Header = http.Header{}
	}
	r.Response.Body = slices.Clone(r.Response.Body)
	return r
}

var errSettled = errors.New("memory: lease already settled")

// KeyStats implements idempotency.StatsSource.
func (s *Store) KeyStats(context.Context) (idempotency.Stats, error) {
	s.keysMu.Lock()
	defer s.keysMu.Unlock()
	now := s.now()
	var st idempotency.Stats
	for _, e := range s.keys {
		if e.rec == nil {
			st.Processing++
			st.OldestProcessingAge = max(st.OldestProcessingAge, now.Sub(e.claimedAt))
			continue
		}
		st.Completed++
		if !now.Before(e.rec.ExpiresAt) {
			st.CleanupLag = max(st.CleanupLag, now.Sub(e.rec.ExpiresAt))
		}
	}
	return st, nil
}
