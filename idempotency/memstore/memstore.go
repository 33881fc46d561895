// Package memstore keeps idempotency records in process memory, with the
// same semantics as package pgstore: for trying a service without a
// database, and for tests. State lives in one process and is lost on exit.
//
// Its unit of work is a *Tx: an operation registers what undoes its writes
// (OnRollback) and what ends them (OnCommit), and memstore runs those hooks
// when the lease settles, before any request waiting for the key is woken.
package memstore

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/oncekey/oncekey/idempotency"
)

// Store implements idempotency.Store[*Tx].
type Store struct {
	now func() time.Time

	mu   sync.Mutex
	keys map[scopedKey]*entry
}

type scopedKey struct {
	scope string
	key   string
}

// entry is a key's state: in flight (rec == nil, done open) or completed.
type entry struct {
	rec       *idempotency.Record
	done      chan struct{} // closed when the in-flight holder settles
	claimedAt time.Time
}

// New returns an empty store.
func New() *Store {
	return &Store{now: time.Now, keys: map[scopedKey]*entry{}}
}

// Claim implements idempotency.Store. Claims are never deferred: in memory
// there is no round trip to save.
func (s *Store) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Lease[*Tx], *idempotency.Record, error) {
	k := scopedKey{req.Scope, req.Key}
	timer := time.NewTimer(req.Wait)
	defer timer.Stop()
	for {
		s.mu.Lock()
		e := s.keys[k]
		if e == nil || (e.rec != nil && !s.now().Before(e.rec.ExpiresAt)) {
			e = &entry{done: make(chan struct{}), claimedAt: s.now()}
			s.keys[k] = e
			s.mu.Unlock()
			return &lease{s: s, k: k, entry: e, fingerprint: req.Fingerprint, ttl: req.TTL, tx: &Tx{}}, nil, nil
		}
		if e.rec != nil {
			rec := copyRecord(*e.rec)
			s.mu.Unlock()
			return nil, &rec, nil
		}
		done := e.done
		s.mu.Unlock()
		select {
		case <-done: // settled: look again
		case <-timer.C:
			return nil, nil, idempotency.ErrInFlight
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}

// ReplaceProvisional replaces the provisional response (a long operation's
// 202) stored under ref's claim with final, and reports whether there was
// one. A record purged or claimed again since is left alone. Call it in
// the same critical section as the operation's own final writes, so that
// both change together.
func (s *Store) ReplaceProvisional(ref idempotency.Ref, final idempotency.Response) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.keys[scopedKey{ref.Scope, ref.Key}]
	if e == nil || e.rec == nil || !e.claimedAt.Equal(ref.ClaimedAt) || e.rec.Response.Status != http.StatusAccepted {
		return false
	}
	rec := copyRecord(idempotency.Record{Fingerprint: e.rec.Fingerprint, Response: final, CreatedAt: e.rec.CreatedAt, ExpiresAt: e.rec.ExpiresAt})
	e.rec = &rec
	return true
}

// Settle implements idempotency.Settler: it replaces the held record
// stored under ref's claim with resp.
func (s *Store) Settle(_ context.Context, ref idempotency.Ref, resp idempotency.Response) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.heldEntry(ref)
	if e == nil {
		return false, nil
	}
	rec := copyRecord(idempotency.Record{Fingerprint: e.rec.Fingerprint, Response: resp, CreatedAt: e.rec.CreatedAt, ExpiresAt: e.rec.ExpiresAt})
	e.rec = &rec
	return true, nil
}

// Release implements idempotency.Settler: it deletes the held record
// stored under ref's claim.
func (s *Store) Release(_ context.Context, ref idempotency.Ref) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.heldEntry(ref) == nil {
		return false, nil
	}
	delete(s.keys, scopedKey{ref.Scope, ref.Key})
	return true, nil
}

// heldEntry is the entry holding ref's held record, or nil; s.mu is held.
func (s *Store) heldEntry(ref idempotency.Ref) *entry {
	e := s.keys[scopedKey{ref.Scope, ref.Key}]
	if e == nil || e.rec == nil || !e.claimedAt.Equal(ref.ClaimedAt) || e.rec.Response.Status != idempotency.StatusHeld {
		return nil
	}
	return e
}

// PurgeExpired implements idempotency.Purger. Batching is moot in memory.
func (s *Store) PurgeExpired(context.Context, int) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
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

// KeyStats implements idempotency.StatsSource.
func (s *Store) KeyStats(context.Context) (idempotency.Stats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
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
			continue
		}
		if h, ok := idempotency.ParseHeld(e.rec.Response); ok {
			switch h.At(now) {
			case idempotency.HeldRunning:
				st.Held++
			case idempotency.HeldUnknown:
				st.Unknown++
			}
		}
	}
	return st, nil
}

// Tx is the unit of work of a memstore lease: the hooks that end an
// operation's writes when its lease commits or rolls back.
type Tx struct {
	mu         sync.Mutex
	onCommit   []func()
	onRollback []func()
}

// OnCommit registers f to run when the lease commits, after the record is
// stored and before waiting duplicates are woken (releasing the lock that
// kept the operation's writes invisible, say).
func (t *Tx) OnCommit(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.onCommit = append(t.onCommit, f)
}

// OnRollback registers f to run if the lease rolls back (undoing a write,
// say); such hooks run in reverse order of registration, like defers.
func (t *Tx) OnRollback(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.onRollback = append(t.onRollback, f)
}

// lease is a claimed key plus its unit of work.
type lease struct {
	s           *Store
	k           scopedKey
	entry       *entry
	fingerprint idempotency.Fingerprint
	ttl         time.Duration
	tx          *Tx

	mu    sync.Mutex
	ended bool
}

func (l *lease) Unit() *Tx { return l.tx }

func (l *lease) Ref() idempotency.Ref {
	// Expiry counts from the claim, as in PostgreSQL.
	return idempotency.Ref{Scope: l.k.scope, Key: l.k.key, ClaimedAt: l.entry.claimedAt}
}

func (l *lease) Commit(_ context.Context, resp idempotency.Response) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return errEnded
	}
	l.ended = true
	claimed := l.entry.claimedAt
	rec := copyRecord(idempotency.Record{
		Fingerprint: l.fingerprint, Response: resp, CreatedAt: claimed, ExpiresAt: claimed.Add(l.ttl),
	})
	l.s.mu.Lock()
	l.entry.rec = &rec
	l.s.mu.Unlock()
	l.tx.mu.Lock()
	hooks := l.tx.onCommit
	l.tx.mu.Unlock()
	for _, f := range hooks {
		f()
	}
	close(l.entry.done)
	return nil
}

func (l *lease) Rollback(context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return nil
	}
	l.ended = true
	l.tx.mu.Lock()
	hooks := l.tx.onRollback
	l.tx.mu.Unlock()
	for _, f := range slices.Backward(hooks) {
		f()
	}
	l.s.mu.Lock()
	if l.s.keys[l.k] == l.entry {
		delete(l.s.keys, l.k)
	}
	l.s.mu.Unlock()
	close(l.entry.done)
	return nil
}

var errEnded = errors.New("memstore: lease already committed or rolled back")

// copyRecord copies a record in and out of the store: the committer may
// reuse its buffers, and a replay's caller may write to what it got.
func copyRecord(r idempotency.Record) idempotency.Record {
	r.Response.Header = r.Response.Header.Clone()
	if r.Response.Header == nil {
		r.Response.Header = http.Header{}
	}
	r.Response.Body = slices.Clone(r.Response.Body)
	return r
}
