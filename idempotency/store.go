// Package idempotency makes an unsafe HTTP operation run at most once per
// (account, Idempotency-Key) and answers every repeat with the stored
// response of the first. It is plain net/http middleware and knows nothing
// about orders or any other domain: the operation joins the claim's
// transaction through the request context, so the domain write and the
// stored response commit together or not at all.
package idempotency

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/google/uuid"
)

// ErrInFlight reports that another request holds the key and did not finish
// within the wait budget. The client should retry later with the same key.
var ErrInFlight = errors.New("idempotency: a request with this key is still in progress")

// ErrUnavailable reports that the store could not be reached in time; the
// client should retry later with the same key. Stores wrap their driver
// errors with it where retrying is the right answer.
var ErrUnavailable = errors.New("idempotency: store unavailable")

// Store keeps idempotency records. Implementations must pass the conformance
// suite in internal/store/storetest, which pins down the semantics below.
type Store interface {
	// Claim reserves (Account, Key) for a new operation, or reports what is
	// already there. It returns exactly one of:
	//   - a Lease: the key was free (or expired); the caller runs the
	//     operation in lease.Context(ctx) and then calls Commit or Rollback;
	//   - a Record: the key holds a completed operation, which may have a
	//     different fingerprint (the caller decides between replay and 409);
	//   - ErrInFlight: another request held the key for all of ClaimRequest.Wait.
	// A request holding the key blocks others only while it runs: if it rolls
	// back (or its process dies) the key is free again.
	Claim(ctx context.Context, req ClaimRequest) (Lease, *Record, error)
}

// ClaimRequest says what is being claimed and for how long.
type ClaimRequest struct {
	Account     uuid.UUID
	Key         string
	Fingerprint Fingerprint
	// Method and Route are stored for operators (oncekey keys inspect); the
	// fingerprint already covers them.
	Method string
	Route  string
	// TTL is how long the completed record is kept and replayed.
	TTL time.Duration
	// Wait bounds how long Claim waits for a concurrent holder of the key to
	// finish before it returns ErrInFlight.
	Wait time.Duration
	// Deferred says the operation only writes: it reads nothing back through
	// its unit of work. A store may then hand out the lease without touching
	// the database and send the claim, the operation's writes and the
	// response together at Commit, in one round trip instead of a
	// transaction's several. Such a Commit reports a key that turned out not
	// to be free with a *TakenError or ErrInFlight, having written nothing.
	// Stores that cannot defer ignore it.
	Deferred bool
}

// TakenError is what the Commit of a deferred lease returns when the key was
// not free after all; nothing of the operation was written. Record is the
// completed record that holds the key (replay it, or answer 409), or nil
// when the key changed under the commit (a concurrent first request
// committed it): claim again, without deferring, to learn its outcome.
type TakenError struct {
	Record *Record
}

func (e *TakenError) Error() string {
	if e.Record == nil {
		return "idempotency: the key was claimed concurrently"
	}
	return "idempotency: the key already holds a completed operation"
}

// Lease is a claimed key with its open unit of work.
type Lease interface {
	// Context returns ctx carrying the unit of work, so that domain stores of
	// the same implementation write inside it.
	Context(ctx context.Context) context.Context
	// Commit stores resp as the key's outcome and commits the domain writes
	// made through Context, atomically. A deferred lease (see
	// ClaimRequest.Deferred) claims the key here too, and may find it taken.
	Commit(ctx context.Context, resp Response) error
	// Rollback discards the domain writes and frees the key. It is safe to call
	// after Commit (it then does nothing), so callers can defer it.
	Rollback(ctx context.Context) error
	// ClaimedAt is when the store claimed the key (the record's CreatedAt
	// once committed). With the account and key it names this one claim: a
	// key reused after it expired is claimed at another time, so a long
	// operation's late outcome can find the record it belongs to.
	ClaimedAt() time.Time
}

// Provisional reports whether a stored response is a long operation's
// "accepted, still running" answer (202), which the operation replaces with
// its final response when its background work ends. Every other stored
// response is final and never changes until it expires, so caches may keep
// it; a provisional one must be read from the durable store.
func Provisional(status int) bool { return status == http.StatusAccepted }

// Claim names the key an operation runs under. The middleware puts it in the
// operation's context, so that a long operation can bind its background work
// to the key and later replace the provisional response stored under it.
type Claim struct {
	Account   uuid.UUID
	Key       string
	ClaimedAt time.Time
}

type claimKey struct{}

// ClaimFrom returns the claim the operation in ctx runs under.
func ClaimFrom(ctx context.Context) (Claim, bool) {
	c, ok := ctx.Value(claimKey{}).(Claim)
	return c, ok
}

func withClaim(ctx context.Context, c Claim) context.Context {
	return context.WithValue(ctx, claimKey{}, c)
}

// Record is a completed operation as stored under its key.
type Record struct {
	Fingerprint Fingerprint
	Response    Response
	CreatedAt   time.Time
	ExpiresAt   time.Time
}

// Response is what is replayed: the status, the allow-listed headers and the
// exact body bytes.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}
