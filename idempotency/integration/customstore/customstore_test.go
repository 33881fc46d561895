// Package customstore_test is a store of one's own, written from the
// engine's documentation alone (idempotency.Store, Lease, ClaimRequest and
// storetest's Harness), over a map: the proof that the store contract is as
// small as the docs say. It implements Claim, and a lease's Unit, Ref,
// Commit and Rollback; it says that it does nothing else (it keeps no held
// records, nor pieces of bodies, its map is never purged, its keys are not
// counted) by returning errors.ErrUnsupported from Settle, Release,
// WritePiece (the store's and the lease's), PurgeExpired and KeyStats, and
// has no piece to read; and it passes storetest.
package customstore_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/storetest"
)

// mapStore keeps records in a map. A key is held by at most one lease;
// a claim waits for its end, up to the request's Wait.
type mapStore struct {
	mu   sync.Mutex
	keys map[[2]string]*entry
}

// entry is a key: held by a lease until done is closed, or completed.
type entry struct {
	done chan struct{}
	rec  *idempotency.Record
}

// unit is what an operation writes through: writes run at Commit.
type unit struct{ writes []func() }

// Settle is unsupported: mapStore keeps no held records (the held
// operations of a gateway need a store that does).
func (s *mapStore) Settle(context.Context, idempotency.Ref, idempotency.Response) (bool, error) {
	return false, errors.ErrUnsupported
}

// Release is unsupported, as Settle is.
func (s *mapStore) Release(context.Context, idempotency.Ref) (bool, error) {
	return false, errors.ErrUnsupported
}

// WritePiece is unsupported: pieces are of held records' bodies, and
// mapStore keeps no held records (large answers of held operations then
// pass through unstored).
func (s *mapStore) WritePiece(context.Context, idempotency.Ref, int, []byte) (bool, error) {
	return false, errors.ErrUnsupported
}

// ReadPiece finds no piece: no record of mapStore's has its body in
// pieces, since none is ever written.
func (s *mapStore) ReadPiece(context.Context, idempotency.Ref, int) ([]byte, error) {
	return nil, nil
}

// PurgeExpired is unsupported: an expired entry is replaced when its key
// is claimed again, and this map lives as long as a test.
func (s *mapStore) PurgeExpired(context.Context, int) (int64, error) {
	return 0, errors.ErrUnsupported
}

// KeyStats is unsupported: nobody scrapes this store's metrics.
func (s *mapStore) KeyStats(context.Context) (idempotency.Stats, error) {
	return idempotency.Stats{}, errors.ErrUnsupported
}

func (s *mapStore) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Lease[*unit], *idempotency.Record, error) {
	k := [2]string{req.Scope, req.Key}
	timeout := time.NewTimer(req.Wait)
	defer timeout.Stop()
	for {
		s.mu.Lock()
		e := s.keys[k]
		if e == nil || (e.rec != nil && !time.Now().Before(e.rec.ExpiresAt)) { // free, or expired: claim it
			e = &entry{done: make(chan struct{})}
			s.keys[k] = e
			s.mu.Unlock()
			ref := idempotency.Ref{Scope: req.Scope, Key: req.Key, ClaimedAt: time.Now()}
			return &lease{s: s, k: k, e: e, req: req, ref: ref, unit: &unit{}}, nil, nil
		}
		if e.rec != nil {
			rec := *e.rec // the caller's own copy, as Claim's doc asks
			rec.Response.Header, rec.Response.Body = rec.Response.Header.Clone(), append([]byte(nil), rec.Response.Body...)
			s.mu.Unlock()
			return nil, &rec, nil
		}
		s.mu.Unlock()
		select { // held: wait for its end
		case <-e.done:
		case <-timeout.C:
			return nil, nil, idempotency.ErrInFlight
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}

type lease struct {
	s     *mapStore
	k     [2]string
	e     *entry
	req   idempotency.ClaimRequest
	ref   idempotency.Ref
	unit  *unit
	ended bool
}

func (l *lease) Unit() *unit          { return l.unit }
func (l *lease) Ref() idempotency.Ref { return l.ref }

// WritePiece is unsupported: the lease keeps a body whole in its record
// (the engine then holds it in memory until the commit).
func (l *lease) WritePiece(context.Context, int, []byte) error { return errors.ErrUnsupported }

func (l *lease) Commit(_ context.Context, resp idempotency.Response) error {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if l.ended {
		return nil
	}
	l.ended = true
	for _, w := range l.unit.writes {
		w()
	}
	stored := idempotency.Response{Status: resp.Status, Header: resp.Header.Clone(), Body: append([]byte(nil), resp.Body...)}
	if stored.Header == nil {
		stored.Header = http.Header{}
	}
	l.e.rec = &idempotency.Record{Fingerprint: l.req.Fingerprint, Response: stored,
		CreatedAt: l.ref.ClaimedAt, ExpiresAt: l.ref.ClaimedAt.Add(l.req.TTL)}
	close(l.e.done)
	return nil
}

func (l *lease) Rollback(context.Context) error {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if l.ended {
		return nil
	}
	l.ended = true
	delete(l.s.keys, l.k)
	close(l.e.done)
	return nil
}

// TestMinimalStorePassesTheSuite runs storetest on the map store, with
// writes kept in a map of their own.
func TestMinimalStorePassesTheSuite(t *testing.T) {
	t.Parallel()
	store := &mapStore{keys: map[[2]string]*entry{}}
	var (
		mu   sync.Mutex
		rows = map[string]string{} // id → scope, committed
	)
	storetest.Run(t, storetest.Harness[*unit]{
		Open: func(*testing.T) idempotency.Store[*unit] { return store },
		Write: func(_ context.Context, u *unit, ref idempotency.Ref, id string) error {
			u.writes = append(u.writes, func() { mu.Lock(); rows[id] = ref.Scope; mu.Unlock() })
			return nil
		},
		Count: func(_ context.Context, _ *testing.T, scope string) int {
			mu.Lock()
			defer mu.Unlock()
			n := 0
			for _, s := range rows {
				if s == scope {
					n++
				}
			}
			return n
		},
		Queued: true, // writes run at Commit
	})
}
