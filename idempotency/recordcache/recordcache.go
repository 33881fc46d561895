// Package recordcache keeps completed idempotency records in process, in
// front of the durable store (and of Redis, when there is one), so that a
// replay answered on the replica that saw the key before costs no round
// trip at all.
//
// A completed record never changes until it expires, so a copy can never
// disagree with the database about it, on this replica or any other; each
// copy is dropped when the record expires, no later than the durable one.
// The one record that does change, a long operation's provisional 202, is
// never kept. Only completed records are kept: whether a key is free or in
// flight is always asked of the store.
//
// The cache is bounded in entries and each entry in size, so a server's
// memory stays flat however many keys it serves. One Cache serves any number
// of stores through Wrap.
package recordcache

import (
	"context"
	"errors"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/internal/recordpack"
)

// Sizes.
const (
	// DefaultSize is a suggested size for New: how many records one
	// process keeps.
	DefaultSize = 10_000
	// MaxBody is the largest response body kept (16 KiB): bigger ones are
	// rare, and the bound keeps the cache's worst case at its size × MaxBody.
	MaxBody = 16 << 10
)

// Observer receives each look-up's result ("hit" or "miss"), for metrics.
type Observer interface {
	RecordCache(result string)
}

// Cache keeps completed records of this process, for the stores it wraps.
type Cache struct {
	records  *lru.Cache[entryKey, kept]
	observer Observer
}

// kept is a record as the cache keeps it: packed, so that the garbage
// collector, which walks every entry of a full cache at every cycle, finds
// nothing inside to follow.
type kept struct {
	rec                  recordpack.Packed
	createdAt, expiresAt time.Time
}

type entryKey struct {
	scope string
	key   string
}

// New returns a cache of up to size completed records. observer may be nil.
func New(size int, observer Observer) (*Cache, error) {
	records, err := lru.New[entryKey, kept](size)
	if err != nil {
		return nil, err
	}
	return &Cache{records: records, observer: observer}, nil
}

// Wrap puts c in front of next: replays of records c holds are answered
// from memory, and records next commits or reads are kept. The store it
// returns does all that next does: held records are settled and released,
// the pieces of large bodies written and read, expired records purged and
// keys counted by next (held records are provisional, so never kept; a
// record whose body is in pieces is kept without them, and its replay
// reads them from next).
func Wrap[U any](c *Cache, next idempotency.Store[U]) idempotency.Store[U] {
	return &cached[U]{Store: next, c: c, next: next}
}

// cached is a store with the cache in front.
type cached[U any] struct {
	// Store, next, settles, writes and reads pieces, purges and counts;
	// Claim is the wrapper's own.
	idempotency.Store[U]
	c    *Cache
	next idempotency.Store[U]
}

// Claim implements idempotency.Store: it answers req from the cache, or
// claims it with next (at once or at commit, as next and req say) and
// keeps what it commits or reads.
func (w *cached[U]) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Lease[U], *idempotency.Record, error) {
	s := w.c
	k := entryKey{req.Scope, req.Key}
	if rec, ok := s.records.Get(k); ok {
		if time.Now().Before(rec.expiresAt) {
			s.observe("hit")
			return nil, rec.record(), nil
		}
		// Expired: absent, as in the database; the store may hand the key
		// out again.
		s.records.Remove(k)
	}
	s.observe("miss")
	start := time.Now()
	lease, rec, err := w.next.Claim(ctx, req)
	if rec != nil {
		s.keep(k, rec)
	}
	if lease == nil {
		return nil, rec, err
	}
	return &keepingLease[U]{Lease: lease, s: s, k: k, fingerprint: req.Fingerprint, claimedAt: start, ttl: req.TTL}, nil, nil
}

func (s *Cache) observe(result string) {
	if s.observer != nil {
		s.observer.RecordCache(result)
	}
}

// keep remembers a copy of rec if it is final and small enough.
func (s *Cache) keep(k entryKey, rec *idempotency.Record) {
	if idempotency.Provisional(rec.Response.Status) || len(rec.Response.Body) > MaxBody || !time.Now().Before(rec.ExpiresAt) {
		return
	}
	// Packed, the copy is the cache's own: the committer may reuse its
	// buffers.
	s.records.Add(k, kept{rec: recordpack.Pack(rec.Fingerprint, rec.Response), createdAt: rec.CreatedAt, expiresAt: rec.ExpiresAt})
}

// record unpacks a kept record as the caller's own, as a store hands out
// records: a replay's caller may write to what it got.
func (k kept) record() *idempotency.Record {
	rec := k.rec.Record(k.createdAt, k.expiresAt)
	if rec.Response.Body == nil {
		rec.Response.Body = []byte{}
	}
	return rec
}

// keepingLease remembers the outcome it commits, or the record a deferred
// commit found in its way.
type keepingLease[U any] struct {
	idempotency.Lease[U]
	s           *Cache
	k           entryKey
	fingerprint idempotency.Fingerprint
	claimedAt   time.Time
	ttl         time.Duration
}

func (l *keepingLease[U]) Commit(ctx context.Context, resp idempotency.Response) error {
	err := l.Lease.Commit(ctx, resp)
	var taken *idempotency.TakenError
	switch {
	case err == nil:
		// The durable store counts the TTL from its own claim, made after
		// claimedAt (or at it, for a deferred claim): this copy expires no
		// later than the durable record. A body in pieces is read under
		// the claim that wrote it, which its CreatedAt names (a claim made
		// at commit takes no pieces: the lease's is the claim's).
		createdAt := l.claimedAt
		if resp.Pieces > 0 {
			createdAt = l.Ref().ClaimedAt
		}
		l.s.keep(l.k, &idempotency.Record{
			Fingerprint: l.fingerprint, Response: resp,
			CreatedAt: createdAt, ExpiresAt: l.claimedAt.Add(l.ttl),
		})
	case errors.As(err, &taken) && taken.Record != nil:
		l.s.keep(l.k, taken.Record)
	}
	return err
}
