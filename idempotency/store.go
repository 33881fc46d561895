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
//
// Store is the one interface of a store: what a store cannot do it reports
// by returning an error that wraps errors.ErrUnsupported (a store that keeps
// no held records, from Settle and Release; one whose records expire by
// themselves, from PurgeExpired; one that cannot count its keys, from
// KeyStats). So a store that wraps another (a cache, a fast path, MapUnit)
// forwards every method and keeps every capability of the store it wraps,
// and no caller type-asserts a store to learn what it can do.
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
	//
	// A store may make the claim at its lease's Commit instead (pgstore's
	// ClaimAtCommit, to claim and write in one round trip), unless
	// req.AtOnce asks for it now; such a Commit may find the key taken
	// after all (*TakenError).
	Claim(ctx context.Context, req ClaimRequest) (Lease[U], *Record, error)
	// Settle replaces the held record stored under ref's claim with resp,
	// and reports false, changing nothing, when that record is gone
	// (purged, released, or claimed again after it expired) or holds an
	// outcome: what a held operation needs, its claim being committed
	// before it runs. A store that keeps no held records returns an error
	// wrapping errors.ErrUnsupported from Settle and Release, and a held
	// operation on it cannot settle its keys.
	Settle(ctx context.Context, ref Ref, resp Response) (bool, error)
	// Release deletes the held record stored under ref's claim, freeing
	// the key, and reports false, changing nothing, as Settle does.
	Release(ctx context.Context, ref Ref) (bool, error)
	// WritePiece stores piece n (counting from 0) of the body of the held
	// record under ref's claim, durably, before it returns: an answer too
	// large to hold in memory is stored piece by piece as it passes, and
	// its record is settled after the last (Response.Pieces). A piece
	// written again replaces itself. It reports false, writing nothing,
	// when that record is gone or no longer held. A store's pieces expire,
	// are purged and are released with their record, and a record settled
	// with fewer pieces (or none) loses the rest. A store that keeps no
	// pieces returns an error wrapping errors.ErrUnsupported, and its held
	// operations pass large answers through unstored, as before. Writing
	// piece 0 also renews a running held record's lease (Held.Lease from
	// now, as its hold did): its holder writes it again while a body
	// passes for longer than the lease, to show it is alive.
	WritePiece(ctx context.Context, ref Ref, n int, p []byte) (bool, error)
	// ReadPiece returns piece n of the body of the record under ref's
	// claim, the caller's own, or nil when the store has no such piece
	// (not yet written, or gone with its record). A cache in front of a
	// durable store forwards it: pieces are read from where they are kept.
	ReadPiece(ctx context.Context, ref Ref, n int) ([]byte, error)
	// PurgeExpired deletes expired records, at most batch (> 0) per
	// statement, until none is left or ctx ends, and returns how many it
	// deleted (Cleanup runs it). It returns ErrCleanupBusy, having deleted
	// nothing, while another process is purging; a store whose records
	// expire by themselves (a cache with a TTL) returns an error wrapping
	// errors.ErrUnsupported.
	PurgeExpired(ctx context.Context, batch int) (int64, error)
	// KeyStats reads the figures now; on a large table some are estimates.
	// A store that cannot count its keys returns an error wrapping
	// errors.ErrUnsupported.
	KeyStats(ctx context.Context) (Stats, error)
}

// ClaimRequest says what is being claimed and for how long. It is a struct
// so that it can gain fields (a retention time, the rule a fingerprint was
// made with) without a breaking change; a store that does not know a new
// field keeps working as before it.
type ClaimRequest struct {
	// Scope is whose key it is (a tenant, a user): the same key in two
	// scopes names two operations. Opaque to the store.
	Scope string
	Key   string
	// Fingerprint identifies the request's meaning (see Request.Fingerprint).
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
	// AtOnce asks a store that would make the claim at its lease's Commit
	// (pgstore's ClaimAtCommit) to make it in Claim, waiting for a holder's
	// outcome, as every other store does anyway. The engine sets it for a
	// request that saw another with its key just now (it queued behind one
	// on this process, or its claim at commit lost a race): a claim at
	// commit would run its operation for nothing.
	AtOnce bool
}

// TakenError is what the Commit of a lease whose claim was made at commit
// (see Store.Claim) returns when the key was not free after all; nothing of
// the operation was written. Record is the completed record that holds the
// key (replay it, or answer 409), or nil when the key changed under the
// commit (a concurrent first request committed it): claim again, AtOnce, to
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
	// WritePiece stores piece n (from 1) of the body of the response that
	// Commit will store, with the writes made through Unit: it commits
	// with them or not at all, so that a replay never shows an answer
	// whose writes rolled back. A piece written again replaces itself;
	// the response committed counts them (Response.Pieces, Size). An
	// operation's answer too large to hold in memory is stored so, piece
	// by piece as it is written, and sent from the store once committed.
	// An error wrapping errors.ErrUnsupported says the lease does not
	// take the piece now: its unit of work is busy (a handler reading
	// rows of its transaction as it writes them), or it takes no pieces
	// at all (a claim made at commit, a store that keeps none). The
	// engine then keeps the piece in memory and offers it again on the
	// handler's next write and once it returns; a body of which the
	// lease took no piece by then is kept whole in the record, as
	// before pieces were kept.
	WritePiece(ctx context.Context, n int, p []byte) error
	// Commit stores resp as the key's outcome and commits the writes made
	// through Unit, atomically. A lease whose claim is made at commit
	// claims the key here, and may find it taken (*TakenError, or
	// ErrInFlight), having written nothing.
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
// exact body bytes, in Body or, for a body too large to keep in the record,
// in Pieces pieces of Size bytes in all, which the store keeps apart
// (Store.WritePiece) and a replay streams one at a time.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
	// Pieces, when above zero, is how many pieces the body is stored in
	// apart from the record, and Body is empty; Size is their length in
	// all, which a replay sends as its Content-Length.
	Pieces int
	Size   int64
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
// bound to the store's transaction, say) instead of the store's. The store
// it returns does all that s does: it settles, purges and counts through s.
func MapUnit[U, V any](s Store[U], f func(unit U, ref Ref) V) Store[V] {
	return mappedStore[U, V]{Store: s, next: s, f: f}
}

// mappedStore is MapUnit's store: the embedded store settles, purges and
// counts; Claim, its own, maps the unit.
type mappedStore[U, V any] struct {
	Store[U]
	next Store[U]
	f    func(U, Ref) V
}

func (m mappedStore[U, V]) Claim(ctx context.Context, req ClaimRequest) (Lease[V], *Record, error) {
	lease, rec, err := m.next.Claim(ctx, req)
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
