package provider

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
)

// ErrNotFound means no charge is stored under the key. The store returns it
// from Get and the client from Lookup: to a caller reconciling after a lost
// answer it means "nothing was charged, retry with the same key".
var ErrNotFound = errors.New("provider: no charge under this idempotency key")

// Record is a charge with what it is stored under: the key and the
// fingerprint of the request that made it, to tell a replay from key reuse.
type Record struct {
	Key         string
	Fingerprint string
	Charge      Charge
}

// Store keeps charges by idempotency key. Its one write, Insert, is atomic
// per key, which is what makes the server charge exactly once however many
// requests with one key arrive together.
type Store interface {
	// Insert stores rec unless rec.Key already holds a record, and returns
	// the record the key holds afterwards: rec with inserted true, or the
	// earlier record (whatever its fingerprint) with inserted false.
	Insert(ctx context.Context, rec Record) (stored Record, inserted bool, err error)
	// Get returns the record stored under key, or ErrNotFound.
	Get(ctx context.Context, key string) (Record, error)
	// ListByReference returns every charge with that reference, whatever its
	// key, oldest first (ties by id); an empty, non-nil slice when none.
	ListByReference(ctx context.Context, reference string) ([]Charge, error)
}

// MemoryStore is the Store for tests and for running the sandbox without a
// database. One mutex guards everything: the sandbox is never the
// bottleneck, and a single lock makes Insert trivially atomic.
type MemoryStore struct {
	mu    sync.Mutex
	byKey map[string]Record
}

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{byKey: map[string]Record{}}
}

// Insert implements Store.
func (s *MemoryStore) Insert(ctx context.Context, rec Record) (Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.byKey[rec.Key]; ok {
		return old, false, nil
	}
	s.byKey[rec.Key] = rec
	return rec, true, nil
}

// Get implements Store.
func (s *MemoryStore) Get(ctx context.Context, key string) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.byKey[key]
	if !ok {
		return Record{}, ErrNotFound
	}
	return rec, nil
}

// ListByReference implements Store. It scans every charge: fine for a
// sandbox that holds a test run's worth.
func (s *MemoryStore) ListByReference(ctx context.Context, reference string) ([]Charge, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	list := []Charge{}
	for _, rec := range s.byKey {
		if rec.Charge.Reference == reference {
			list = append(list, rec.Charge)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(list, compareCharges)
	return list, nil
}

// compareCharges orders charges oldest first, then by id, the order both
// stores list in.
func compareCharges(a, b Charge) int {
	if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
		return c
	}
	return cmp.Compare(a.ID, b.ID)
}
