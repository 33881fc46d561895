package idempotency

import (
	"context"
	"errors"
	"net/http"
	"time"
)

// ErrInFlight reports that another request holds the key and did not finish
// within the wait budget. The client should retry later with the same key.
var ErrInFlight = errors.New("idempotency: a request with this key is still in progress")

// ErrUnavailable reports that the store could not be reached in time; the
// client should retry later with the same key. Stores wrap their driver
// errors with it where retrying is the right answer.
var ErrUnavailable = errors.New("idempotency: store unavailable")

// Store keeps idempotency records and hands out the unit of work, of type U,
// that an operation writes through. Implementations must pass the suite in
// package storetest, which pins down the semantics below.
type Store[U any] interface {
	// Claim reserves (Scope, Key) for a new operation, or reports what is
	// already there. It returns exactly one of:
	//   - a Lease: the key was free (or expired); the caller runs the
	//     operation through lease.Unit() and then calls Commit or Rollback;
	//   - a Record: the key holds a completed operation, which may have a
	//     different fingerprint (the caller decides between replay and 409);
	//   - ErrInFlight: another request held the key for all of Wait.
	// A request holding the key blocks others only while it runs: if it rolls
	// back (or its process dies) the key is free again. A returned Record is
	// the caller's own: its Header and Body share no memory with the store's.
	Claim(ctx context.Context, req ClaimRequest) (Lease[U], *Record, error)
}

// ClaimRequest says what is being claimed and for how long.
type ClaimRequest struct {
	// Scope is whose key it is (a tenant, a user): the same key in two
	// scopes names two operations. Opaque to the store.
	Scope string
	Key   string
	// Fingerprint identifies the request's meaning (see ComputeFingerprint).
	Fingerprint Fingerprint
	// Method and Route are kept for operators; the fingerprint already
	// covers them.
	Method string
	Route  string
	// TTL is how long the completed record is kept and replayed.
	TTL time.Duration
	// Wait bounds how long Claim waits for a concurrent holder of the key to
	// finish before it returns ErrInFlight.
	Wait time.Duration
}

// DeferringStore is a Store that may defer a claim to its lease's Commit, as
// pgstore's store for deferred (write-only) operations does, to claim and
// write in one round trip. That Commit may find the key taken after all
// (*TakenError). A store that claims at Claim, as most do, does not
// implement it, and needs neither.
type DeferringStore[U any] interface {
	Store[U]
	// ClaimNow claims as a store that does not defer would: at once,
	// waiting for a holder's outcome. The engine claims so for a request
	// that saw another with its key just now (it queued behind one on this
	// process, or its deferred Commit lost a race), which a deferred claim
	// would run for nothing.
	ClaimNow(ctx context.Context, req ClaimRequest) (Lease[U], *Record, error)
}

// ClaimNow claims req on s at once: through DeferringStore.ClaimNow when s
// implements it, else through Claim, which claims at once already. Stores
// that wrap another (a cache, a fast path) claim through it to keep their
// next store's choice.
func ClaimNow[U any](ctx context.Context, s Store[U], req ClaimRequest) (Lease[U], *Record, error) {
	if d, ok := s.(DeferringStore[U]); ok {
		return d.ClaimNow(ctx, req)
	}
	return s.Claim(ctx, req)
}

// TakenError is what the Commit of a DeferringStore's lease, whose claim
// was deferred to its commit, returns when the key was not free after all;
// nothing of the operation was written. Record is the completed record that holds the key
// (replay it, or answer 409), or nil when the key changed under the commit
// (a concurrent first request committed it): claim again with ClaimNow, to
// learn its outcome.
type TakenError struct {
	Record *Record
}

// Error says the key was claimed concurrently or, when Record holds it,
// that it holds a completed operation.
func (e *TakenError) Error() string {
	if e.Record == nil {
		return "idempotency: the key was claimed concurrently"
	}
	return "idempotency: the key already holds a completed operation"
}

// Lease is a claimed key with its open unit of work.
type Lease[U any] interface {
	// Unit is what the operation writes through: a transaction, or writes
	// queued to go with the claim, as the store defines U. Writes made
	// through it commit with the stored response or not at all.
	Unit() U
	// Ref names this claim of the key.
	Ref() Ref
	// Commit stores resp as the key's outcome and commits the writes made
	// through Unit, atomically. A lease whose claim was deferred claims the
	// key here, and may find it taken (*TakenError, or ErrInFlight), having
	// written nothing.
	Commit(ctx context.Context, resp Response) error
	// Rollback discards the writes and frees the key. It is safe to call
	// after Commit (it then does nothing), so callers can defer it.
	Rollback(ctx context.Context) error
}

// Ref names one claim of a key: a key reused after it expired is claimed
// at another time, so a long operation's late outcome can find the record
// it belongs to, and no other.
type Ref struct {
	Scope string
	Key   string
	// ClaimedAt is when the store claimed the key (the record's CreatedAt
	// once committed).
	ClaimedAt time.Time
}

// Record is a completed operation as stored under its key.
type Record struct {
	Fingerprint Fingerprint
	Response    Response
	CreatedAt   time.Time
	ExpiresAt   time.Time
	// ReadAt is the time the store read the record, by the store's own
	// clock (a database's now()), for a store that keeps one; zero
	// otherwise. A held record's lease is compared with it, and such a
	// store sets a held record's Until on that clock (see Held.Lease), so
	// that two processes whose clocks disagree by more than a lease never
	// take a running operation for one whose holder is gone.
	ReadAt time.Time
}

// Response is what is replayed: the status, the allow-listed headers and the
// exact body bytes.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// Provisional reports whether a stored response may still change: a long
// operation's "accepted, still running" answer (202), which the operation
// replaces with its final response when its background work ends, or a
// held record (StatusHeld), which its operation settles. Every other
// stored response is final and never changes until it expires, so caches
// may keep it; a provisional one must be read from the durable store.
func Provisional(status int) bool { return status == http.StatusAccepted || status == StatusHeld }

// MapUnit returns s with each lease's unit passed through f, so that an
// application can hand its operations its own unit of work (repositories
// bound to the store's transaction, say) instead of the store's.
func MapUnit[U, V any](s Store[U], f func(unit U, ref Ref) V) Store[V] {
	return mappedStore[U, V]{next: s, f: f}
}

type mappedStore[U, V any] struct {
	next Store[U]
	f    func(U, Ref) V
}

func (m mappedStore[U, V]) Claim(ctx context.Context, req ClaimRequest) (Lease[V], *Record, error) {
	return m.claim(m.next.Claim(ctx, req))
}

// ClaimNow implements DeferringStore, claiming through the store it maps.
func (m mappedStore[U, V]) ClaimNow(ctx context.Context, req ClaimRequest) (Lease[V], *Record, error) {
	return m.claim(ClaimNow(ctx, m.next, req))
}

func (m mappedStore[U, V]) claim(lease Lease[U], rec *Record, err error) (Lease[V], *Record, error) {
	if lease == nil {
		return nil, rec, err
	}
	return mappedLease[U, V]{Lease: lease, unit: m.f(lease.Unit(), lease.Ref())}, nil, nil
}

type mappedLease[U, V any] struct {
	Lease[U]
	unit V
}

func (l mappedLease[U, V]) Unit() V { return l.unit }
