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
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/internal/recordpack"
)

// Store implements idempotency.Store[*Tx].
type Store struct {
	now func() time.Time

	mu   sync.Mutex
	keys map[scopedKey]entry
	// pieces holds the bodies stored in pieces (Store.WritePiece), apart
	// from the entries, so that the entries stay free of pointers.
	pieces map[scopedKey]pieceSet
}

// pieceSet is the pieces of the body of the record claimed at claimedAt.
type pieceSet struct {
	claimedAt time.Time
	data      [][]byte
}

type scopedKey struct {
	scope string
	key   string
}

// entry is a key's state: in flight (holder set) or completed (rec set).
// Entries are kept by value and a completed one points at nothing but its
// packed record, which holds no pointers: however many keys the store
// keeps, the garbage collector walks little more than the map.
type entry struct {
	holder    *lease            // the lease running the key's operation; nil once completed
	rec       recordpack.Packed // the completed record
	claimedAt time.Time         // the record's CreatedAt once completed
	ttl       time.Duration     // the record's ExpiresAt is claimedAt + ttl
}

// expiresAt is when the completed record of e expires.
func (e entry) expiresAt() time.Time { return e.claimedAt.Add(e.ttl) }

// New returns an empty store.
func New() *Store {
	return &Store{now: time.Now, keys: map[scopedKey]entry{}, pieces: map[scopedKey]pieceSet{}}
}

// Claim implements idempotency.Store. Claims are never deferred: in memory
// there is no round trip to save.
func (s *Store) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Lease[*Tx], *idempotency.Record, error) {
	k := scopedKey{req.Scope, req.Key}
	// The timer is started by the first wait only: most claims never wait.
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		s.mu.Lock()
		e, ok := s.keys[k]
		if !ok || (e.holder == nil && !s.now().Before(e.expiresAt())) {
			l := &lease{s: s, k: k, fingerprint: req.Fingerprint, ttl: req.TTL, claimedAt: s.now()}
			s.keys[k] = entry{holder: l, claimedAt: l.claimedAt}
			delete(s.pieces, k)
			s.mu.Unlock()
			return l, nil, nil
		}
		if e.holder == nil {
			s.mu.Unlock()
			// A packed record never changes: it is unpacked out of the lock.
			return nil, e.rec.Record(e.claimedAt, e.expiresAt()), nil
		}
		done := e.holder.settled()
		s.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(req.Wait)
		}
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
	return s.replace(ref, http.StatusAccepted, final)
}

// Settle implements idempotency.Store: it replaces the held record
// stored under ref's claim with resp.
func (s *Store) Settle(_ context.Context, ref idempotency.Ref, resp idempotency.Response) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.replace(ref, idempotency.StatusHeld, resp), nil
}

// Release implements idempotency.Store: it deletes the held record
// stored under ref's claim.
func (s *Store) Release(_ context.Context, ref idempotency.Ref) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := scopedKey{ref.Scope, ref.Key}
	if _, ok := s.completed(k, ref, idempotency.StatusHeld); !ok {
		return false, nil
	}
	delete(s.keys, k)
	delete(s.pieces, k)
	return true, nil
}

// WritePiece implements idempotency.Store: it keeps a copy of p as piece
// n of the body of the held record under ref's claim.
func (s *Store) WritePiece(_ context.Context, ref idempotency.Ref, n int, p []byte) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := scopedKey{ref.Scope, ref.Key}
	if _, ok := s.completed(k, ref, idempotency.StatusHeld); !ok || n < 0 {
		return false, nil
	}
	if n == 0 {
		s.renew(k)
	}
	set := s.pieces[k]
	if !set.claimedAt.Equal(ref.ClaimedAt) {
		set = pieceSet{claimedAt: ref.ClaimedAt}
	}
	for len(set.data) <= n {
		set.data = append(set.data, nil)
	}
	set.data[n] = slices.Clone(p)
	if set.data[n] == nil {
		set.data[n] = []byte{}
	}
	s.pieces[k] = set
	return true, nil
}

// renew extends the running hold of k by its lease from now, as
// WritePiece of piece 0 does (see idempotency.Store); s.mu is held.
func (s *Store) renew(k scopedKey) {
	e := s.keys[k]
	resp := e.rec.Response()
	h, ok := idempotency.ParseHeld(resp, time.Time{})
	if !ok || h.State != idempotency.HeldRunning || h.Lease <= 0 {
		return
	}
	h.Until = s.now().Add(h.Lease)
	e.rec = recordpack.Pack(e.rec.Fingerprint(), h.Response())
	s.keys[k] = e
}

// ReadPiece implements idempotency.Store.
func (s *Store) ReadPiece(_ context.Context, ref idempotency.Ref, n int) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := scopedKey{ref.Scope, ref.Key}
	e, ok := s.keys[k]
	set := s.pieces[k]
	if !ok || !e.claimedAt.Equal(ref.ClaimedAt) || !set.claimedAt.Equal(ref.ClaimedAt) || n < 0 || n >= len(set.data) || set.data[n] == nil {
		return nil, nil
	}
	return slices.Clone(set.data[n]), nil
}

// replace replaces the response of the record of status stored under
// ref's claim with resp, keeping its fingerprint and times, and reports
// whether there was one; s.mu is held.
func (s *Store) replace(ref idempotency.Ref, status int, resp idempotency.Response) bool {
	k := scopedKey{ref.Scope, ref.Key}
	e, ok := s.completed(k, ref, status)
	if !ok {
		return false
	}
	e.rec = recordpack.Pack(e.rec.Fingerprint(), resp)
	s.keys[k] = e
	// A record settled with fewer pieces than were written loses the rest.
	if set, ok := s.pieces[k]; ok && len(set.data) > resp.Pieces {
		if resp.Pieces == 0 {
			delete(s.pieces, k)
		} else {
			set.data = slices.Clip(set.data[:resp.Pieces])
			s.pieces[k] = set
		}
	}
	return true
}

// completed is the entry of k if it holds a completed record of status
// under ref's claim; s.mu is held.
func (s *Store) completed(k scopedKey, ref idempotency.Ref, status int) (entry, bool) {
	e, ok := s.keys[k]
	if !ok || e.holder != nil || !e.claimedAt.Equal(ref.ClaimedAt) || e.rec.Status() != status {
		return entry{}, false
	}
	return e, true
}

// PurgeExpired implements idempotency.Store. Batching is moot in memory.
func (s *Store) PurgeExpired(context.Context, int) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var n int64
	for k, e := range s.keys {
		if e.holder == nil && !now.Before(e.expiresAt()) {
			delete(s.keys, k)
			delete(s.pieces, k)
			n++
		}
	}
	return n, nil
}

// KeyStats implements idempotency.Store.
func (s *Store) KeyStats(context.Context) (idempotency.Stats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var st idempotency.Stats
	for _, e := range s.keys {
		if e.holder != nil {
			st.Processing++
			st.OldestProcessingAge = max(st.OldestProcessingAge, now.Sub(e.claimedAt))
			continue
		}
		st.Completed++
		if !now.Before(e.expiresAt()) {
			st.CleanupLag = max(st.CleanupLag, now.Sub(e.expiresAt()))
			continue
		}
		if h, ok := idempotency.ParseHeld(idempotency.Response{Status: e.rec.Status(), Body: e.rec.Body()}, now); ok {
			switch h.State {
			case idempotency.HeldRunning:
				st.Held++
			case idempotency.HeldUnknown:
				st.Unknown++
			}
		}
	}
	for _, set := range s.pieces {
		for _, p := range set.data {
			st.PiecesBytes += int64(len(p))
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
	fingerprint idempotency.Fingerprint
	ttl         time.Duration
	claimedAt   time.Time
	tx          Tx

	mu    sync.Mutex
	ended bool
	// pieces is the body of the response to commit, in pieces
	// (Lease.WritePiece), stored with it.
	pieces [][]byte
	// done is closed when the lease settles, for the claims waiting on it;
	// made by the first of them, under the store's lock, as most keys are
	// never waited on.
	done chan struct{}
}

// settled returns the channel closed when l settles; s.mu is held.
func (l *lease) settled() <-chan struct{} {
	if l.done == nil {
		l.done = make(chan struct{})
	}
	return l.done
}

func (l *lease) Unit() *Tx { return &l.tx }

func (l *lease) Ref() idempotency.Ref {
	// Expiry counts from the claim, as in PostgreSQL.
	return idempotency.Ref{Scope: l.k.scope, Key: l.k.key, ClaimedAt: l.claimedAt}
}

// WritePiece implements idempotency.Lease: the piece is kept with the
// lease, and stored with its response at Commit.
func (l *lease) WritePiece(_ context.Context, n int, p []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return errEnded
	}
	if n < 1 {
		return fmt.Errorf("memstore: a lease's pieces count from 1, got %d", n)
	}
	for len(l.pieces) <= n {
		l.pieces = append(l.pieces, nil)
	}
	l.pieces[n] = append([]byte{}, p...)
	return nil
}

func (l *lease) Commit(_ context.Context, resp idempotency.Response) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return errEnded
	}
	l.ended = true
	// Packed, the record is the store's own: the committer may reuse its
	// buffers.
	rec := recordpack.Pack(l.fingerprint, resp)
	l.s.mu.Lock()
	if e, ok := l.s.keys[l.k]; ok && e.holder == l {
		l.s.keys[l.k] = entry{rec: rec, claimedAt: l.claimedAt, ttl: l.ttl}
		if resp.Pieces > 0 {
			l.s.pieces[l.k] = pieceSet{claimedAt: l.claimedAt, data: slices.Clip(l.pieces[:min(resp.Pieces, len(l.pieces))])}
		}
	}
	l.pieces = nil
	// Claims from now on find the record; those that wait already are woken
	// once the hooks have run.
	done := l.done
	l.s.mu.Unlock()
	l.tx.mu.Lock()
	hooks := l.tx.onCommit
	l.tx.mu.Unlock()
	for _, f := range hooks {
		f()
	}
	if done != nil {
		close(done)
	}
	return nil
}

func (l *lease) Rollback(context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return nil
	}
	l.ended, l.pieces = true, nil
	l.tx.mu.Lock()
	hooks := l.tx.onRollback
	l.tx.mu.Unlock()
	for _, f := range slices.Backward(hooks) {
		f()
	}
	l.s.mu.Lock()
	if e, ok := l.s.keys[l.k]; ok && e.holder == l {
		delete(l.s.keys, l.k)
	}
	done := l.done
	l.s.mu.Unlock()
	if done != nil {
		close(done)
	}
	return nil
}

var errEnded = errors.New("memstore: lease already committed or rolled back")
