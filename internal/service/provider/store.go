package provider

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// ErrNotFound means nothing is stored under the idempotency key: no charge
// (Store.Get, Client.Lookup) or no refund (Store.GetRefund,
// Client.LookupRefund). To a caller reconciling after a lost answer it means
// "nothing was charged (or refunded), retry with the same key". It is not
// what a refund of an unknown charge gets: that is ErrChargeNotFound.
var ErrNotFound = errors.New("provider: nothing stored under this idempotency key")

// Record is a charge with what it is stored under: the key and the
// fingerprint of the request that made it, to tell a replay from key reuse.
type Record struct {
	Key         string
	Fingerprint string
	Charge      Charge
}

// RefundRecord is a refund with its key and the fingerprint of the request
// that made it, as Record is for a charge. Refund keys are a namespace of
// their own: a key that made a charge may make a refund too.
type RefundRecord struct {
	Key         string
	Fingerprint string
	Refund      Refund
}

// Store keeps charges and refunds by idempotency key. Its two writes,
// Insert and InsertRefund, are atomic per key, which is what makes the
// server charge and refund exactly once however many requests with one key
// arrive together; InsertRefund is also atomic per charge, which is what
// keeps a charge's refunds within its amount however many arrive together.
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

	// InsertRefund is Insert for refunds. When rec.Key already holds a
	// refund it returns that one (inserted false) without looking at the
	// charge, so a replay is answered even once the charge is used up.
	// Otherwise, in one atomic step with respect to every other refund of
	// the charge, it refuses with ErrChargeNotFound, ErrChargeNotRefundable
	// or ErrRefundExceedsCharge (wrapped, see checkRefundable), storing
	// nothing, or stores rec with its Currency set to the charge's.
	InsertRefund(ctx context.Context, rec RefundRecord) (stored RefundRecord, inserted bool, err error)
	// GetRefund returns the refund record stored under key, or ErrNotFound.
	GetRefund(ctx context.Context, key string) (RefundRecord, error)
	// ListRefundsByReference is ListByReference for refunds.
	ListRefundsByReference(ctx context.Context, reference string) ([]Refund, error)
}

// MemoryStore is the Store for tests and for running the sandbox without a
// database. One mutex guards everything: the sandbox is never the
// bottleneck, and a single lock makes Insert and InsertRefund trivially
// atomic.
type MemoryStore struct {
	mu      sync.Mutex
	byKey   map[string]Record
	keyByID map[string]string // charge id → its key, to find a refund's charge
	refunds map[string]RefundRecord
	// refunded is what each charge's succeeded refunds add up to.
	refunded map[string]int64
}

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{
		byKey:    map[string]Record{},
		keyByID:  map[string]string{},
		refunds:  map[string]RefundRecord{},
		refunded: map[string]int64{},
	}
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
	s.keyByID[rec.Charge.ID] = rec.Key
	return rec, true, nil
}

// Get implements Store.
func (s *MemoryStore) Get(ctx context.Context, key string) (Record, error) {
	return getLocked(ctx, s, s.byKey, key)
}

// ListByReference implements Store. It scans every charge: fine for a
// sandbox that holds a test run's worth.
func (s *MemoryStore) ListByReference(ctx context.Context, reference string) ([]Charge, error) {
	return listLocked(ctx, s, s.byKey, func(rec Record) (Charge, bool) {
		return rec.Charge, rec.Charge.Reference == reference
	}, compareCharges)
}

// InsertRefund implements Store. The mutex held throughout is what makes
// the check and the insert one step.
func (s *MemoryStore) InsertRefund(ctx context.Context, rec RefundRecord) (RefundRecord, bool, error) {
	if err := ctx.Err(); err != nil {
		return RefundRecord{}, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.refunds[rec.Key]; ok {
		return old, false, nil
	}
	chargeKey, ok := s.keyByID[rec.Refund.ChargeID]
	if !ok {
		return RefundRecord{}, false, chargeNotFound(rec.Refund.ChargeID)
	}
	ch := s.byKey[chargeKey].Charge
	if err := checkRefundable(ch, s.refunded[ch.ID], rec.Refund.Amount); err != nil {
		return RefundRecord{}, false, err
	}
	rec.Refund.Currency = ch.Currency
	s.refunds[rec.Key] = rec
	if rec.Refund.Status == StatusSucceeded {
		s.refunded[ch.ID] += rec.Refund.Amount
	}
	return rec, true, nil
}

// GetRefund implements Store.
func (s *MemoryStore) GetRefund(ctx context.Context, key string) (RefundRecord, error) {
	return getLocked(ctx, s, s.refunds, key)
}

// ListRefundsByReference implements Store, scanning as ListByReference does.
func (s *MemoryStore) ListRefundsByReference(ctx context.Context, reference string) ([]Refund, error) {
	return listLocked(ctx, s, s.refunds, func(rec RefundRecord) (Refund, bool) {
		return rec.Refund, rec.Refund.Reference == reference
	}, compareRefunds)
}

// getLocked reads byKey[key] under s's mutex, or ErrNotFound.
func getLocked[R any](ctx context.Context, s *MemoryStore, byKey map[string]R, key string) (R, error) {
	var zero R
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := byKey[key]
	if !ok {
		return zero, ErrNotFound
	}
	return rec, nil
}

// listLocked collects what pick keeps of byKey under s's mutex, sorted by
// compare; an empty, non-nil slice when it keeps nothing.
func listLocked[R, T any](ctx context.Context, s *MemoryStore, byKey map[string]R, pick func(R) (T, bool), compare func(a, b T) int) ([]T, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	list := []T{}
	for _, rec := range byKey {
		if v, ok := pick(rec); ok {
			list = append(list, v)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(list, compare)
	return list, nil
}

// compareCharges orders charges oldest first, then by id, the order both
// stores list in.
func compareCharges(a, b Charge) int { return compareCreated(a.CreatedAt, a.ID, b.CreatedAt, b.ID) }

// compareRefunds orders refunds as compareCharges orders charges.
func compareRefunds(a, b Refund) int { return compareCreated(a.CreatedAt, a.ID, b.CreatedAt, b.ID) }

func compareCreated(aAt time.Time, aID string, bAt time.Time, bID string) int {
	if c := aAt.Compare(bAt); c != 0 {
		return c
	}
	return cmp.Compare(aID, bID)
}
