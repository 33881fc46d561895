// Package storetest is the conformance suite of idempotency stores: what the
// protocol relies on is pinned here once, and every store (pgstore,
// memstore, a store with redisstore or recordcache in front, or one of your
// own) runs it. It takes constructors, as River's driver suite does, and
// imports no store: a third-party store runs the same suite.
//
// Every case makes its own scope and keys, so the cases run in parallel and
// may share one database with other tests.
//
// A store needs no more than idempotency.Store asks: Claim, and a lease's
// Unit, Ref, Commit and Rollback. Settle, Release, WritePiece (the
// store's and the lease's), PurgeExpired and KeyStats may report
// errors.ErrUnsupported, and the cases that need them are then skipped. ClaimRequest.AtOnce and TakenError serve stores that make a
// claim at its commit; another store ignores the one and returns the other
// never. Oncekey's repository holds such a minimal store, over a map, that
// passes this suite (idempotency/integration/customstore).
package storetest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
)

// Harness is what the suite needs of a store: the store, and a way to write
// through its unit of work and see what was written.
type Harness[U any] struct {
	// Open returns the store under test. It is called once per case; the
	// stores may share state (one database), since every case works in
	// scopes of its own.
	Open func(t *testing.T) idempotency.Store[U]
	// Write makes one write named id (a row, say) through unit, inside the
	// lease whose claim is ref. It must be visible to Count once the lease
	// commits, and never if it rolls back. Two writes of one id must
	// conflict: the second waits while the first's lease is open (a
	// primary key, a lock), and fails or does nothing once it committed.
	Write func(ctx context.Context, unit U, ref idempotency.Ref, id string) error
	// Count returns how many committed writes scope has.
	Count func(ctx context.Context, t *testing.T, scope string) int
	// Read, if set, reports whether id is visible through unit: a lease
	// must read its own uncommitted writes.
	Read func(ctx context.Context, unit U, id string) (bool, error)
	// Queued says writes through the unit only run at Commit (a
	// pgstore.Batch): the cases about a write that waits on another lease
	// do not apply.
	Queued bool
	// Replace, if set, replaces the provisional response stored under ref
	// with final, as a long operation's background work does when it ends.
	Replace func(ctx context.Context, ref idempotency.Ref, final idempotency.Response) (bool, error)
	// NewScope, if set, returns a fresh scope of the kind the store holds
	// (a UUID's bytes, say, for a store whose scopes are UUIDs). By
	// default a case's scope is a random string, and a second scope of
	// the case has the first as its prefix.
	NewScope func() string
}

// clockSlack absorbs the difference between the test's clock and the
// store's (PostgreSQL stamps records with the database's now()).
const clockSlack = time.Second

// expiryTimeout bounds how long awaitExpiry polls for a record with a 1ms
// TTL to expire. A store that measures expiry on a database's clock needs
// room beyond the TTL itself.
const expiryTimeout = 10 * time.Second

// Run runs the suite against the harness's store.
func Run[U any](t *testing.T, h Harness[U]) {
	t.Helper()
	cases := []struct {
		name string
		run  func(t *testing.T, b *bundle[U])
		// needs is false where the harness lacks what the case needs.
		needs bool
	}{
		{"ClaimCommitReplay", testClaimCommitReplay[U], true},
		{"ReplayEmptyBody", testReplayEmptyBody[U], true},
		{"FingerprintMismatchReturnsOriginalRecord", testFingerprintMismatch[U], true},
		{"KeysAreScoped", testKeysScoped[U], true},
		{"RollbackFreesKeyAndDiscardsWrites", testRollback[U], true},
		{"ConcurrentClaimWaitsForHolder", testConcurrentClaimWaits[U], true},
		{"WaitIsBoundedAcrossHolders", testWaitBoundedAcrossHolders[U], true},
		{"LeaseWritesNotBoundByClaimWait", testLeaseWritesNotBoundByClaimWait[U], !h.Queued},
		{"ExpiredKeyIsAbsent", testExpiredKeyIsAbsent[U], true},
		{"PurgeExpired", testPurgeExpired[U], true},
		{"ConcurrentClaimsRunOnce", testConcurrentClaimsRunOnce[U], true},
		{"UncommittedWritesInvisible", testUncommittedWritesInvisible[U], !h.Queued},
		{"ClaimAtCommit", testClaimAtCommit[U], true},
		{"ReplaceProvisional", testReplaceProvisional[U], h.Replace != nil},
		{"SettleHeld", testSettleHeld[U], true},
		{"Pieces", testPieces[U], true},
		{"LeasePieces", testLeasePieces[U], true},
	}
	for _, tc := range cases {
		if !tc.needs {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t, &bundle[U]{Harness: h, ctx: t.Context()})
		})
	}
}

// bundle is what a case works with: the harness and a context ending with
// the test. Each case opens its stores with open.
type bundle[U any] struct {
	Harness[U]
	ctx context.Context
}

// open returns a store and a fresh scope.
func (b *bundle[U]) open(t *testing.T) (idempotency.Store[U], string) {
	t.Helper()
	return b.Open(t), b.newScope()
}

// newScope is a fresh scope of the kind the store holds.
func (b *bundle[U]) newScope() string {
	if b.NewScope != nil {
		return b.NewScope()
	}
	return "storetest-" + rand.Text()
}

// 1. A fresh key gives a lease; after Commit the same request replays the
// exact stored response.
func testClaimCommitReplay[U any](t *testing.T, b *bundle[U]) {
	store, scope := b.open(t)
	req := claimRequest(scope, newKey(), fingerprint("POST /widgets x"))
	// Unsorted keys, odd spacing and a trailing newline: a store that
	// normalises JSON (jsonb would) fails here.
	body := []byte("{\"id\":\"x\",\"size\":1999, \"colour\":\"teal\",\"parts\":[{\"name\":\"b\",\"qty\":1}]}\n")
	header := http.Header{"Content-Type": {"application/json"}, "Location": {"/widgets/x"}}

	before := time.Now()
	lease := claimLease(t, b.ctx, store, req)
	require.Equal(t, scope, lease.Ref().Scope, "the lease's Ref names the scope")
	require.Equal(t, req.Key, lease.Ref().Key, "the lease's Ref names the key")
	resp := idempotency.Response{Status: http.StatusCreated, Header: header.Clone(), Body: slices.Clone(body)}
	require.NoError(t, lease.Commit(b.ctx, resp), "commit")
	after := time.Now()

	// The store keeps its own copy: a caller reusing its buffers must not
	// rewrite what is replayed.
	resp.Body[0] = 'X'
	resp.Header.Set("Location", "/elsewhere")

	rec := claimRecord(t, b.ctx, store, req)
	require.Equal(t, body, rec.Response.Body, "replayed body must be byte-identical")
	require.Equal(t, http.StatusCreated, rec.Response.Status, "replayed status")
	require.Equal(t, header, rec.Response.Header, "replayed header")
	require.Equal(t, req.Fingerprint, rec.Fingerprint, "stored fingerprint")
	require.WithinRange(t, rec.CreatedAt, before.Add(-clockSlack), after.Add(clockSlack), "record CreatedAt")
	require.WithinRange(t, rec.ExpiresAt, before.Add(req.TTL-clockSlack), after.Add(req.TTL+clockSlack),
		"record ExpiresAt must be about now+TTL")

	// Every replay is a copy too.
	rec.Response.Body[0] = 'X'
	rec.Response.Header.Set("Location", "/elsewhere")
	again := claimRecord(t, b.ctx, store, req)
	require.Equal(t, body, again.Response.Body, "second replay body after the first was mutated")
	require.Equal(t, header, again.Response.Header, "second replay header after the first was mutated")
}

// A stored response may have no body (204, or a handler that writes
// nothing: the middleware then commits a nil Body).
func testReplayEmptyBody[U any](t *testing.T, b *bundle[U]) {
	tests := []struct {
		name string
		body []byte
	}{
		{name: "nil body", body: nil},
		{name: "empty body", body: []byte{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			store, scope := b.open(t)
			req := claimRequest(scope, newKey(), fingerprint("DELETE /widgets/x"))
			lease := claimLease(t, b.ctx, store, req)
			resp := idempotency.Response{Status: http.StatusNoContent, Header: http.Header{}, Body: tt.body}
			require.NoError(t, lease.Commit(b.ctx, resp), "commit a response with an empty body")

			rec := claimRecord(t, b.ctx, store, req)
			require.Equal(t, http.StatusNoContent, rec.Response.Status, "replayed status")
			require.Empty(t, rec.Response.Body, "replayed body")
			require.Empty(t, rec.Response.Header, "replayed header")
		})
	}
}

// 2. Another fingerprint on a completed key gets the record as stored; the
// caller, not the store, turns the mismatch into a 409.
func testFingerprintMismatch[U any](t *testing.T, b *bundle[U]) {
	store, scope := b.open(t)
	req := claimRequest(scope, newKey(), fingerprint("POST /widgets size=1"))
	commitResponse(t, b.ctx, claimLease(t, b.ctx, store, req), "first\n")

	other := req
	other.Fingerprint = fingerprint("POST /widgets size=2")
	rec := claimRecord(t, b.ctx, store, other)
	require.Equal(t, req.Fingerprint, rec.Fingerprint, "the record must carry the ORIGINAL fingerprint")
	require.Equal(t, []byte("first\n"), rec.Response.Body, "the record must carry the original response")
}

// 3. The same key string in two scopes is two keys, whatever bytes the
// scopes hold.
func testKeysScoped[U any](t *testing.T, b *bundle[U]) {
	store, scopeA := b.open(t)
	scopeB := scopeA + "\x00b" // a prefix of the other must not collide with it
	if b.NewScope != nil {
		scopeB = b.NewScope()
	}
	key := newKey()
	reqA := claimRequest(scopeA, key, fingerprint("A"))
	reqB := claimRequest(scopeB, key, fingerprint("B"))
	// A short wait: if the key were shared, B would wait on A's open lease.
	reqB.Wait = 200 * time.Millisecond

	leaseA := claimLease(t, b.ctx, store, reqA)
	leaseB := claimLease(t, b.ctx, store, reqB)
	commitResponse(t, b.ctx, leaseA, "scope A\n")
	commitResponse(t, b.ctx, leaseB, "scope B\n")

	recA := claimRecord(t, b.ctx, store, reqA)
	recB := claimRecord(t, b.ctx, store, reqB)
	require.Equal(t, []byte("scope A\n"), recA.Response.Body, "scope A's replay")
	require.Equal(t, reqA.Fingerprint, recA.Fingerprint, "scope A's fingerprint")
	require.Equal(t, []byte("scope B\n"), recB.Response.Body, "scope B's replay")
	require.Equal(t, reqB.Fingerprint, recB.Fingerprint, "scope B's fingerprint")
}

// 4. Rollback frees the key and takes the lease's writes with it; Commit
// makes them visible; Rollback after Commit does nothing.
func testRollback[U any](t *testing.T, b *bundle[U]) {
	store, scope := b.open(t)
	ctx := b.ctx
	req := claimRequest(scope, newKey(), fingerprint("POST /widgets"))

	lease := claimLease(t, ctx, store, req)
	discarded := newKey()
	require.NoError(t, b.Write(ctx, lease.Unit(), lease.Ref(), discarded), "write in lease")
	if b.Read != nil {
		seen, err := b.Read(ctx, lease.Unit(), discarded)
		require.NoError(t, err, "read inside the lease")
		require.True(t, seen, "the lease must read its own uncommitted write")
	}
	require.NoError(t, lease.Rollback(ctx), "rollback")
	require.Zero(t, b.Count(ctx, t, scope), "a write in a rolled-back lease must be gone")

	lease = claimLease(t, ctx, store, req) // the key is free again
	require.NoError(t, b.Write(ctx, lease.Unit(), lease.Ref(), newKey()), "write in lease")
	commitResponse(t, ctx, lease, "created\n")
	require.NoError(t, lease.Rollback(ctx), "Rollback after Commit must be a no-op")

	require.Equal(t, 1, b.Count(ctx, t, scope), "a write in a committed lease must be visible")
	rec := claimRecord(t, ctx, store, req)
	require.Equal(t, []byte("created\n"), rec.Response.Body, "Rollback after Commit must keep the record")
}

// 5. A claim on a key whose holder is still running waits for it, up to Wait.
func testConcurrentClaimWaits[U any](t *testing.T, b *bundle[U]) {
	tests := []struct {
		name string
		wait time.Duration
		// end ends the holder's lease while the waiter waits; nil leaves it
		// open for longer than the wait.
		end  func(ctx context.Context, lease idempotency.Lease[U]) error
		want func(t *testing.T, req idempotency.ClaimRequest, res claimResult[U])
	}{
		{
			name: "holder commits",
			wait: 5 * time.Second,
			end: func(ctx context.Context, lease idempotency.Lease[U]) error {
				return lease.Commit(ctx, response("holder\n"))
			},
			want: func(t *testing.T, req idempotency.ClaimRequest, res claimResult[U]) {
				require.NoError(t, res.err, "waiter's claim")
				require.Nil(t, res.lease, "waiter must not get a lease on a committed key")
				require.NotNil(t, res.rec, "waiter must get the holder's record")
				require.Equal(t, []byte("holder\n"), res.rec.Response.Body, "waiter's replay")
				require.Equal(t, req.Fingerprint, res.rec.Fingerprint, "waiter's record fingerprint")
			},
		},
		{
			name: "holder rolls back",
			wait: 5 * time.Second,
			end: func(ctx context.Context, lease idempotency.Lease[U]) error {
				return lease.Rollback(ctx)
			},
			want: func(t *testing.T, req idempotency.ClaimRequest, res claimResult[U]) {
				require.NoError(t, res.err, "waiter's claim")
				require.Nil(t, res.rec, "waiter must not get a record for a rolled-back key")
				require.NotNil(t, res.lease, "waiter must get the freed key")
			},
		},
		{
			name: "holder does not end within the wait",
			wait: 200 * time.Millisecond,
			want: func(t *testing.T, req idempotency.ClaimRequest, res claimResult[U]) {
				require.ErrorIs(t, res.err, idempotency.ErrInFlight, "waiter's claim (lease=%v, record=%v)", res.lease, res.rec)
				// Not at once (it must wait) and not much later (Wait bounds it).
				require.GreaterOrEqual(t, res.elapsed, 150*time.Millisecond, "ErrInFlight came before the wait was over")
				require.Less(t, res.elapsed, 5*time.Second, "ErrInFlight came long after the wait was over")
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			store, scope := b.open(t)
			req := claimRequest(scope, newKey(), fingerprint("POST /widgets"))
			req.Wait = tt.wait
			holder := claimLease(t, b.ctx, store, req)

			waiter := claimAsync(b.ctx, store, req)
			if tt.end != nil {
				requireNoReport(t, waiter, 100*time.Millisecond, "the waiter returned while the holder was still running")
				require.NoError(t, tt.end(b.ctx, holder), "end the holder")
			}
			res := receive(t, waiter, "the waiter's claim")
			if res.lease != nil {
				t.Cleanup(func() { _ = res.lease.Rollback(context.Background()) })
			}
			tt.want(t, req, res)
		})
	}
}

// The wait budget bounds a claim as a whole: a waiter that waits behind one
// holder, then behind the next one (who took over when the first rolled
// back), still returns within about Wait, not Wait per holder.
func testWaitBoundedAcrossHolders[U any](t *testing.T, b *bundle[U]) {
	store, scope := b.open(t)
	const wait = time.Second
	req := claimRequest(scope, newKey(), fingerprint("POST /widgets chain"))
	req.Wait = wait

	first := claimLease(t, b.ctx, store, req)

	// Two waiters: one takes the key over when the first holder rolls back
	// and keeps it; the other must give up at the budget's end.
	results := make(chan claimResult[U], 2)
	for range 2 {
		go func() { results <- <-claimAsync(b.ctx, store, req) }()
	}
	// pacing: the first holder runs for three quarters of the budget, so that
	// a budget per holder would show; nothing is waited for here.
	time.Sleep(wait * 3 / 4)
	require.NoError(t, first.Rollback(b.ctx))

	var takeover, gaveUp *claimResult[U]
	for range 2 {
		r := receive(t, results, "a waiter's claim")
		switch {
		case r.lease != nil:
			takeover = &r
			// A failure below must not leave the lease's connection held.
			t.Cleanup(func() { _ = r.lease.Rollback(context.Background()) })
		case errors.Is(r.err, idempotency.ErrInFlight):
			gaveUp = &r
		default:
			t.Fatalf("unexpected claim result: %+v", r)
		}
	}
	require.NotNil(t, takeover, "one waiter takes the freed key over")
	require.NotNil(t, gaveUp, "the other waits behind the new holder and gives up")
	// Per-holder budgets would make this wait*3/4 + wait (1.75 s); stores
	// may take some slack for the claim statement itself, and a busy
	// machine some more.
	require.Less(t, gaveUp.elapsed, wait+600*time.Millisecond, "the wait budget is for the whole claim, not per holder")
}

// Wait bounds the claim only: once a lease is granted, its writes may wait
// on other units of work for as long as they take (in PostgreSQL, the
// claim's lock_timeout must not outlive the claim).
func testLeaseWritesNotBoundByClaimWait[U any](t *testing.T, b *bundle[U]) {
	store, scope := b.open(t)
	ctx := b.ctx
	wait := 200 * time.Millisecond
	firstReq := claimRequest(scope, newKey(), fingerprint("first"))
	firstReq.Wait = wait
	secondReq := claimRequest(scope, newKey(), fingerprint("second"))
	secondReq.Wait = wait

	first := claimLease(t, ctx, store, firstReq)
	id := newKey()
	require.NoError(t, b.Write(ctx, first.Unit(), first.Ref(), id), "write in the first lease")

	second := claimLease(t, ctx, store, secondReq)
	done := make(chan error, 1)
	go func() { done <- b.Write(ctx, second.Unit(), second.Ref(), id) }()
	// Registered last, so it runs first if the test fails: the second lease
	// cannot end while its write waits on the first.
	t.Cleanup(func() { _ = first.Rollback(context.Background()) })

	requireNoReport(t, done, 3*wait, "the second lease's write returned while the first lease, writing the same id, was still open")
	require.NoError(t, first.Rollback(ctx), "roll back the first lease")
	require.NoError(t, receive(t, done, "the second lease's write"), "the second lease's write after the first rolled back")
	commitResponse(t, ctx, second, "second\n")
	require.Equal(t, 1, b.Count(ctx, t, scope), "the write committed by the second lease")
}

// 6. An expired record is absent: the key can be claimed again, whatever
// the fingerprint.
func testExpiredKeyIsAbsent[U any](t *testing.T, b *bundle[U]) {
	tests := []struct {
		name  string
		again string // fingerprint source of the claim after expiry
	}{
		{name: "same fingerprint", again: "original"},
		{name: "different fingerprint", again: "different"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			store, scope := b.open(t)
			req := claimRequest(scope, newKey(), fingerprint("original"))
			req.TTL = time.Millisecond
			commitResponse(t, b.ctx, claimLease(t, b.ctx, store, req), "old\n")
			awaitExpiry(t, b.ctx, store, scope, req.TTL)

			again := claimRequest(scope, req.Key, fingerprint(tt.again))
			commitResponse(t, b.ctx, claimLease(t, b.ctx, store, again), "new\n")
			rec := claimRecord(t, b.ctx, store, again)
			require.Equal(t, again.Fingerprint, rec.Fingerprint, "fingerprint of the record stored after expiry")
			require.Equal(t, []byte("new\n"), rec.Response.Body, "body of the record stored after expiry")
		})
	}
}

// 7. PurgeExpired deletes expired records, in batches, and keeps live ones
// and in-flight claims (skipped for a store whose records expire by
// themselves: its PurgeExpired reports errors.ErrUnsupported).
func testPurgeExpired[U any](t *testing.T, b *bundle[U]) {
	store, scope := b.open(t)
	ctx := b.ctx
	// No other case of the suite purges while this one counts what it
	// purged (see purges), the probe below included: a purge deletes every
	// expired record, another case's too.
	purges.Lock()
	defer purges.Unlock()
	if _, err := purgeWhenFree(t, ctx, store, 1); errors.Is(err, errors.ErrUnsupported) {
		t.Skip("the store's records expire by themselves")
	}
	const batch = 2
	expired := make([]idempotency.ClaimRequest, batch+1) // more than one batch
	for i := range expired {
		expired[i] = claimRequest(scope, newKey(), fingerprint("expired"))
		expired[i].TTL = time.Millisecond
		commitResponse(t, ctx, claimLease(t, ctx, store, expired[i]), "expired\n")
	}
	live := claimRequest(scope, newKey(), fingerprint("live"))
	commitResponse(t, ctx, claimLease(t, ctx, store, live), "live\n")
	inFlightReq := claimRequest(scope, newKey(), fingerprint("in flight"))
	inFlightReq.TTL = time.Millisecond
	inFlight := claimLease(t, ctx, store, inFlightReq)
	awaitExpiry(t, ctx, store, scope, time.Millisecond)

	n, err := purgeWhenFree(t, ctx, store, batch)
	require.NoError(t, err, "purge")
	// Other tests on the same database add expired keys of their own.
	require.GreaterOrEqual(t, n, int64(len(expired)), "purged count")

	rec := claimRecord(t, ctx, store, live)
	require.Equal(t, []byte("live\n"), rec.Response.Body, "a live record must survive the purge")
	require.NoError(t, inFlight.Commit(ctx, response("in flight\n")), "commit a claim that was in flight during the purge")
	for _, req := range expired {
		claimLease(t, ctx, store, req)
	}
}

// 10. Of many concurrent identical requests exactly one runs the operation;
// the others replay its outcome.
func testConcurrentClaimsRunOnce[U any](t *testing.T, b *bundle[U]) {
	tests := []struct {
		name    string
		expired bool // the key holds an expired record when the race starts
	}{
		{name: "fresh key"},
		{name: "expired key", expired: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			const claimers = 50
			store, scope := b.open(t)
			ctx := b.ctx
			req := claimRequest(scope, newKey(), fingerprint("POST /widgets"))
			req.Wait = 5 * time.Second // long enough that no one gets ErrInFlight
			if tt.expired {
				old := req
				old.TTL = time.Millisecond
				commitResponse(t, ctx, claimLease(t, ctx, store, old), "expired\n")
				awaitExpiry(t, ctx, store, scope, old.TTL)
			}

			start := make(chan struct{})
			results := make([]claimResult[U], claimers)
			var wg sync.WaitGroup
			for i := range claimers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					lease, rec, err := claimNow(ctx, store, req)
					results[i] = claimResult[U]{lease: lease, rec: rec, err: err}
					if err != nil || lease == nil {
						return
					}
					defer func() { _ = lease.Rollback(context.WithoutCancel(ctx)) }()
					if err := b.Write(ctx, lease.Unit(), lease.Ref(), newKey()); err != nil {
						results[i].err = err
						return
					}
					results[i].err = lease.Commit(ctx, response("the one\n"))
				}()
			}
			close(start)
			wg.Wait()

			leases := 0
			for i, res := range results {
				require.NoError(t, res.err, "claimer %d", i)
				if res.lease != nil {
					leases++
					continue
				}
				require.NotNil(t, res.rec, "claimer %d got neither a lease nor a record", i)
				require.Equal(t, []byte("the one\n"), res.rec.Response.Body, "claimer %d's replay", i)
				require.Equal(t, req.Fingerprint, res.rec.Fingerprint, "claimer %d's record fingerprint", i)
			}
			require.Equal(t, 1, leases, "leases granted among %d concurrent claims", claimers)
			require.Equal(t, 1, b.Count(ctx, t, scope), "writes made by %d concurrent identical requests", claimers)
		})
	}
}

// 11. A write inside an open lease is seen by no one else, and a rolled-back
// one never.
func testUncommittedWritesInvisible[U any](t *testing.T, b *bundle[U]) {
	store, scope := b.open(t)
	ctx := b.ctx
	lease := claimLease(t, ctx, store, claimRequest(scope, newKey(), fingerprint("POST /widgets")))
	require.NoError(t, b.Write(ctx, lease.Unit(), lease.Ref(), newKey()), "write in lease")
	require.Zero(t, b.Count(ctx, t, scope), "an uncommitted write seen outside its lease")
	require.NoError(t, lease.Rollback(ctx), "rollback")
	require.Zero(t, b.Count(ctx, t, scope), "a rolled-back write seen")
}

// A long operation's provisional response (202) is replaced by its final
// one under the claim it was accepted under, and no other: not a record
// that expired and was claimed again for something else.
func testReplaceProvisional[U any](t *testing.T, b *bundle[U]) {
	store, scope := b.open(t)
	ctx := b.ctx
	accept := func(req idempotency.ClaimRequest) idempotency.Ref {
		t.Helper()
		lease := claimLease(t, ctx, store, req)
		ref := lease.Ref()
		require.NoError(t, lease.Commit(ctx, idempotency.Response{
			Status: http.StatusAccepted, Header: http.Header{"Location": {"/jobs/1"}}, Body: []byte(`{"status":"pending"}`),
		}), "commit the provisional 202")
		return ref
	}
	final := func(body string) idempotency.Response {
		return idempotency.Response{Status: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(body)}
	}
	req := claimRequest(scope, newKey(), fingerprint("POST /jobs a"))
	ref := accept(req)
	rec := claimRecord(t, ctx, store, req)
	require.Equal(t, http.StatusAccepted, rec.Response.Status, "pending: the key replays the 202")

	replaced, err := b.Replace(ctx, ref, final(`{"status":"succeeded"}`))
	require.NoError(t, err, "replace")
	require.True(t, replaced, "the provisional response was there to replace")
	rec = claimRecord(t, ctx, store, req)
	require.Equal(t, http.StatusOK, rec.Response.Status, "final: the key replays the final response")
	require.Equal(t, `{"status":"succeeded"}`, string(rec.Response.Body))
	require.Equal(t, "application/json", rec.Response.Header.Get("Content-Type"))
	require.Equal(t, req.Fingerprint, rec.Fingerprint, "the fingerprint is the request's still")
	replaced, err = b.Replace(ctx, ref, final("again"))
	require.NoError(t, err, "replace a final response")
	require.False(t, replaced, "a final response is never replaced")

	// A key that expired while its operation was pending and was claimed again.
	short := claimRequest(scope, newKey(), fingerprint("POST /jobs b"))
	short.TTL = time.Millisecond
	old := accept(short)
	awaitExpiry(t, ctx, store, scope, short.TTL)
	short.TTL = time.Hour
	lease := claimLease(t, ctx, store, short)
	require.NoError(t, lease.Commit(ctx, idempotency.Response{Status: http.StatusAccepted, Header: http.Header{}, Body: []byte("new")}))
	replaced, err = b.Replace(ctx, old, final("old"))
	require.NoError(t, err, "replace under the old claim")
	require.False(t, replaced, "the old claim's record is gone")
	rec = claimRecord(t, ctx, store, short)
	require.Equal(t, "new", string(rec.Response.Body), "the old operation's outcome must not land on the key's new record")
}

// 13. A held record (committed before its operation runs outside the
// store) is settled or released under its own claim and no other, and is
// never taken for an outcome of its own.
//
// A store that keeps no held records says so: Settle and Release report
// errors.ErrUnsupported, and the case is skipped.
func testSettleHeld[U any](t *testing.T, b *bundle[U]) {
	store, scope := b.open(t)
	ctx := b.ctx
	nobody := idempotency.Ref{Scope: scope, Key: newKey(), ClaimedAt: time.Now()}
	if _, err := store.Release(ctx, nobody); errors.Is(err, errors.ErrUnsupported) {
		_, err := store.Settle(ctx, nobody, response("unsupported"))
		require.ErrorIs(t, err, errors.ErrUnsupported, "a store that cannot Release cannot Settle either")
		t.Skip("the store keeps no held records")
	}
	hold := func(req idempotency.ClaimRequest) idempotency.Ref {
		t.Helper()
		lease := claimLease(t, ctx, store, req)
		ref := lease.Ref()
		running := idempotency.Held{State: idempotency.HeldRunning, Until: time.Now().Add(time.Minute)}
		require.NoError(t, lease.Commit(ctx, running.Response()), "commit the held record")
		return ref
	}
	req := claimRequest(scope, newKey(), fingerprint("POST /held a"))
	ref := hold(req)
	rec := claimRecord(t, ctx, store, req)
	held, ok := idempotency.ParseHeld(rec.Response, time.Time{})
	require.True(t, ok, "the key holds the held record, not an outcome: %+v", rec.Response)
	require.Equal(t, idempotency.HeldRunning, held.State)

	// untouched: neither settling nor releasing ref changes anything.
	untouched := func(ref idempotency.Ref, why string) {
		t.Helper()
		settled, err := store.Settle(ctx, ref, response("not this one"))
		require.NoError(t, err, "settle: %s", why)
		require.False(t, settled, "settled: %s", why)
		released, err := store.Release(ctx, ref)
		require.NoError(t, err, "release: %s", why)
		require.False(t, released, "released: %s", why)
	}
	other := ref
	other.ClaimedAt = ref.ClaimedAt.Add(time.Millisecond)
	untouched(other, "a held record is settled or released under its own claim only")

	settled, err := store.Settle(ctx, ref, response("final"))
	require.NoError(t, err, "settle")
	require.True(t, settled, "the held record was there to settle")
	rec = claimRecord(t, ctx, store, req)
	require.Equal(t, "final", string(rec.Response.Body), "the key replays what it was settled with")
	untouched(ref, "an outcome is never settled again, nor released")

	freed := claimRequest(scope, newKey(), fingerprint("POST /held b"))
	ref = hold(freed)
	released, err := store.Release(ctx, ref)
	require.NoError(t, err, "release")
	require.True(t, released, "the held record was there to release")
	lease := claimLease(t, ctx, store, freed)
	require.NoError(t, lease.Rollback(ctx))

	// A key that expired while held, and was claimed again.
	short := claimRequest(scope, newKey(), fingerprint("POST /held c"))
	short.TTL = time.Millisecond
	old := hold(short)
	awaitExpiry(t, ctx, store, scope, short.TTL)
	short.TTL = time.Hour
	hold(short)
	untouched(old, "the old claim's record is gone")
	rec = claimRecord(t, ctx, store, short)
	_, ok = idempotency.ParseHeld(rec.Response, time.Time{})
	require.True(t, ok, "the key's new held record stays")
}

// 14. The body of a held operation's answer too large to keep in its
// record is stored in pieces under the record's claim: each written
// durably and kept as the store's own copy, a piece written again
// replacing itself, none written to a record gone or not held; the
// record settled with their count and size, read back by a replay under
// the claim its CreatedAt names; the pieces beyond the count a record is
// settled with, and all of a released or purged record's, gone; and none
// of them readable under a later claim of the key.
//
// A store that keeps no pieces says so: WritePiece reports
// errors.ErrUnsupported, ReadPiece finds nothing (or reports it too), and
// the case is skipped. A store that keeps no held records keeps no pieces.
func testPieces[U any](t *testing.T, b *bundle[U]) {
	store, scope := b.open(t)
	ctx := b.ctx
	nobody := idempotency.Ref{Scope: scope, Key: newKey(), ClaimedAt: time.Now()}
	written, err := store.WritePiece(ctx, nobody, 0, []byte("nobody's"))
	if errors.Is(err, errors.ErrUnsupported) {
		p, err := store.ReadPiece(ctx, nobody, 0)
		if !errors.Is(err, errors.ErrUnsupported) {
			require.NoError(t, err, "read a piece from a store that keeps none")
		}
		require.Nil(t, p, "a store that keeps no pieces has none to read")
		t.Skip("the store keeps no pieces")
	}
	require.NoError(t, err, "write a piece of no record")
	require.False(t, written, "a piece of no record is written nowhere")
	if _, err := store.Release(ctx, nobody); errors.Is(err, errors.ErrUnsupported) {
		require.Fail(t, "a store that keeps no held records must report WritePiece unsupported: pieces are of held records' bodies")
	}

	// hold commits a held record for req and returns its claim.
	hold := func(t *testing.T, req idempotency.ClaimRequest) idempotency.Ref {
		t.Helper()
		lease := claimLease(t, ctx, store, req)
		ref := lease.Ref()
		running := idempotency.Held{State: idempotency.HeldRunning, Until: time.Now().Add(time.Minute)}
		require.NoError(t, lease.Commit(ctx, running.Response()), "commit the held record")
		return ref
	}
	// write writes the pieces under ref as pieces from, from+1, ...,
	// requiring each to be written.
	write := func(t *testing.T, ref idempotency.Ref, from int, pieces ...string) {
		t.Helper()
		for i, p := range pieces {
			written, err := store.WritePiece(ctx, ref, from+i, []byte(p))
			require.NoError(t, err, "write piece %d", from+i)
			require.True(t, written, "piece %d of a held record is written", from+i)
		}
	}
	// want requires the pieces read under ref to be want, each, and the
	// next one to be absent; a nil want is a piece absent.
	want := func(t *testing.T, ref idempotency.Ref, want []*string, why string) {
		t.Helper()
		for n, w := range append(want, nil) {
			p, err := store.ReadPiece(ctx, ref, n)
			require.NoError(t, err, "read piece %d: %s", n, why)
			if w == nil {
				require.Nil(t, p, "piece %d is absent: %s", n, why)
				continue
			}
			require.Equal(t, *w, string(p), "piece %d: %s", n, why)
		}
	}
	some := func(pieces ...string) []*string {
		out := make([]*string, len(pieces))
		for i := range pieces {
			out[i] = &pieces[i]
		}
		return out
	}
	// expiringTTL is the TTL of a record that is to expire: long enough
	// that its pieces are written before it has (a store may take an
	// expired record for gone), short enough not to be waited for long.
	const expiringTTL = time.Second
	settle := func(t *testing.T, ref idempotency.Ref, pieces int, size int64) {
		t.Helper()
		settled, err := store.Settle(ctx, ref, idempotency.Response{
			Status: http.StatusOK, Header: http.Header{"Content-Type": {"application/octet-stream"}}, Pieces: pieces, Size: size,
		})
		require.NoError(t, err, "settle with %d pieces", pieces)
		require.True(t, settled, "the held record was there to settle")
	}

	t.Run("written, replaced and replayed", func(t *testing.T) {
		t.Parallel()
		req := claimRequest(scope, newKey(), fingerprint("GET /export a"))
		ref := hold(t, req)
		want(t, ref, nil, "nothing written yet")

		first := []byte("first piece ")
		written, err := store.WritePiece(ctx, ref, 0, first)
		require.NoError(t, err, "write piece 0")
		require.True(t, written, "piece 0 of a held record is written")
		first[0] = 'X' // the store keeps its own copy: the writer may reuse its buffer
		write(t, ref, 1, "second, soon replaced ", "third")
		want(t, ref, some("first piece ", "second, soon replaced ", "third"), "the held record's pieces, as written")
		write(t, ref, 1, "second piece ")
		want(t, ref, some("first piece ", "second piece ", "third"), "a piece written again replaces itself")

		read, err := store.ReadPiece(ctx, ref, 0)
		require.NoError(t, err, "read piece 0")
		read[0] = 'X' // every read is the caller's own copy
		want(t, ref, some("first piece ", "second piece ", "third"), "after a read piece was changed")

		const size = int64(len("first piece second piece third"))
		settle(t, ref, 3, size)
		// Twice: the second may be answered by a cache in front of the
		// store, which must keep the count and size, and the CreatedAt by
		// which a replay names the claim the pieces are under.
		for _, replay := range []string{"first replay", "second replay"} {
			rec := claimRecord(t, ctx, store, req)
			require.Equal(t, http.StatusOK, rec.Response.Status, "%s: status", replay)
			require.Equal(t, 3, rec.Response.Pieces, "%s: the record's body is in 3 pieces", replay)
			require.Equal(t, size, rec.Response.Size, "%s: the pieces' size in all", replay)
			require.Empty(t, rec.Response.Body, "%s: a body in pieces is not in the record", replay)
			require.Equal(t, "application/octet-stream", rec.Response.Header.Get("Content-Type"), "%s: header", replay)
			require.True(t, rec.CreatedAt.Equal(ref.ClaimedAt), "%s: CreatedAt %s names the claim %s", replay, rec.CreatedAt, ref.ClaimedAt)
			want(t, idempotency.Ref{Scope: scope, Key: req.Key, ClaimedAt: rec.CreatedAt}, some("first piece ", "second piece ", "third"),
				replay+": read under the claim the record's CreatedAt names")
		}

		written, err = store.WritePiece(ctx, ref, 0, []byte("late"))
		require.NoError(t, err, "write a piece of a settled record")
		require.False(t, written, "no piece is written to a record no longer held")
		written, err = store.WritePiece(ctx, ref, 3, []byte("late"))
		require.NoError(t, err, "write a piece past the last of a settled record")
		require.False(t, written, "no piece is written to a record no longer held")
		want(t, ref, some("first piece ", "second piece ", "third"), "after writes to the settled record")
	})

	t.Run("settled with fewer pieces", func(t *testing.T) {
		t.Parallel()
		for _, kept := range []int{2, 0} {
			ref := hold(t, claimRequest(scope, newKey(), fingerprint("GET /export b")))
			write(t, ref, 0, "a", "b", "c")
			settle(t, ref, kept, int64(kept))
			want(t, ref, some("a", "b", "c")[:kept], "a record settled with fewer pieces than were written loses the rest")
		}
	})

	t.Run("released", func(t *testing.T) {
		t.Parallel()
		ref := hold(t, claimRequest(scope, newKey(), fingerprint("GET /export c")))
		write(t, ref, 0, "a", "b")
		released, err := store.Release(ctx, ref)
		require.NoError(t, err, "release")
		require.True(t, released, "the held record was there to release")
		want(t, ref, nil, "a released record's pieces go with it")
		written, err := store.WritePiece(ctx, ref, 2, []byte("late"))
		require.NoError(t, err, "write a piece of a released record")
		require.False(t, written, "no piece is written to a record gone")
		want(t, ref, nil, "after a write to the released record")
	})

	t.Run("not held", func(t *testing.T) {
		t.Parallel()
		req := claimRequest(scope, newKey(), fingerprint("POST /widgets d"))
		lease := claimLease(t, ctx, store, req)
		ref := lease.Ref()
		commitResponse(t, ctx, lease, "an outcome\n")
		written, err := store.WritePiece(ctx, ref, 0, []byte("x"))
		require.NoError(t, err, "write a piece of a completed record")
		require.False(t, written, "no piece is written to a record that holds an outcome")
		want(t, ref, nil, "a record that holds an outcome")

		ref = hold(t, claimRequest(scope, newKey(), fingerprint("GET /export d")))
		other := ref
		other.ClaimedAt = ref.ClaimedAt.Add(time.Millisecond)
		written, err = store.WritePiece(ctx, other, 0, []byte("x"))
		require.NoError(t, err, "write a piece under another claim")
		require.False(t, written, "a piece is written under its record's own claim only")
		want(t, ref, nil, "after a write under another claim")
		want(t, nobody, nil, "no record at all")
	})

	t.Run("key claimed again after expiry", func(t *testing.T) {
		t.Parallel()
		short := claimRequest(scope, newKey(), fingerprint("GET /export e"))
		short.TTL = expiringTTL
		old := hold(t, short)
		write(t, old, 0, "old a", "old b")
		awaitExpiry(t, ctx, store, scope, short.TTL)
		short.TTL = time.Hour
		ref := hold(t, short)
		want(t, ref, nil, "the old claim's pieces are not the new claim's")
		written, err := store.WritePiece(ctx, old, 2, []byte("late"))
		require.NoError(t, err, "write a piece under the old claim")
		require.False(t, written, "the old claim's record is gone")
		write(t, ref, 0, "new a")
		want(t, ref, some("new a"), "the new claim's own piece")
		want(t, old, nil, "nothing under the old claim")
	})

	// Not in parallel with the others: the parallel ones run once it has
	// purged, so that its purge does not take the expired record of "key
	// claimed again after expiry" (whose pieces must not reach the new
	// claim) before that case claims its key again.
	t.Run("purged", func(t *testing.T) {
		purges.Lock()
		_, err := purgeWhenFree(t, ctx, store, 1) // a purge, as every other: under purges
		purges.Unlock()
		if errors.Is(err, errors.ErrUnsupported) {
			t.Skip("the store's records expire by themselves")
		}
		short := claimRequest(scope, newKey(), fingerprint("GET /export f"))
		short.TTL = expiringTTL
		ref := hold(t, short)
		write(t, ref, 0, "a", "b")
		settle(t, ref, 2, 2)
		awaitExpiry(t, ctx, store, scope, short.TTL)
		purges.Lock()
		_, err = purgeWhenFree(t, ctx, store, 100)
		purges.Unlock()
		require.NoError(t, err, "purge")
		want(t, ref, nil, "a purged record's pieces go with it")
	})
}

// purges keeps the suite's purges apart: the stores of one harness share
// their records (one table), and a purge by one case would take the
// expired records that another counts its purge by.
var purges sync.Mutex

// purgeWhenFree purges store's expired records once no other purge of it
// runs (another process's, or a cleanup's of another test on the same
// table: ErrCleanupBusy).
func purgeWhenFree[U any](t *testing.T, ctx context.Context, store idempotency.Store[U], batch int) (int64, error) {
	t.Helper()
	var n int64
	var err error
	require.Eventually(t, func() bool {
		n, err = store.PurgeExpired(ctx, batch)
		return !errors.Is(err, idempotency.ErrCleanupBusy)
	}, 30*time.Second, 10*time.Millisecond, "another purge of the store ends")
	return n, err
}

// claimNow claims req at once (AtOnce), as every store claims in Claim
// unless it makes its claims at commit.
// testLeasePieces pins a body stored in pieces through a lease
// (Lease.WritePiece): nothing of it is read before its commit, all of it
// after, from 1, under the record's CreatedAt; a rollback takes it along;
// a lease that takes no pieces says so before any is written.
func testLeasePieces[U any](t *testing.T, b *bundle[U]) {
	store, scope := b.open(t)
	ctx := b.ctx
	req := claimRequest(scope, newKey(), fingerprint("POST /exports a"))
	lease := claimLease(t, ctx, store, req)
	ref := lease.Ref()
	first := []byte("first piece ")
	err := lease.WritePiece(ctx, 1, first)
	if errors.Is(err, errors.ErrUnsupported) {
		commitResponse(t, ctx, lease, "kept whole")
		rec := claimRecord(t, ctx, store, req)
		require.Equal(t, "kept whole", string(rec.Response.Body), "a lease that takes no pieces keeps the body in the record")
		t.Skip("the store's leases take no pieces")
	}
	require.NoError(t, err, "write piece 1 through the lease")
	first[0] = 'X' // the store keeps its own copy: the writer may reuse its buffer
	require.NoError(t, lease.WritePiece(ctx, 2, []byte("second, soon replaced")), "write piece 2")
	require.NoError(t, lease.WritePiece(ctx, 2, []byte("second")), "write piece 2 again")
	p, err := store.ReadPiece(ctx, ref, 1)
	require.NoError(t, err, "read a piece before its claim commits")
	require.Nil(t, p, "no piece is read before its claim commits")
	const size = int64(len("first piece second"))
	require.NoError(t, lease.Commit(ctx, idempotency.Response{
		Status: http.StatusCreated, Header: http.Header{"Content-Type": {"text/csv"}}, Pieces: 3, Size: size,
	}), "commit a response in pieces")
	// Twice: the second may be answered by a cache in front of the store.
	for _, replay := range []string{"first replay", "second replay"} {
		rec := claimRecord(t, ctx, store, req)
		require.Equal(t, http.StatusCreated, rec.Response.Status, "%s: status", replay)
		require.Equal(t, 3, rec.Response.Pieces, "%s: pieces", replay)
		require.Equal(t, size, rec.Response.Size, "%s: size", replay)
		require.Equal(t, "text/csv", rec.Response.Header.Get("Content-Type"), "%s: header", replay)
		at := idempotency.Ref{Scope: scope, Key: req.Key, ClaimedAt: rec.CreatedAt}
		for n, want := range []string{"first piece ", "second"} {
			p, err := store.ReadPiece(ctx, at, n+1)
			require.NoError(t, err, "%s: read piece %d", replay, n+1)
			require.Equal(t, want, string(p), "%s: piece %d", replay, n+1)
		}
		p, err := store.ReadPiece(ctx, at, 3)
		require.NoError(t, err, "%s: read past the last piece", replay)
		require.Nil(t, p, "%s: no piece past the last", replay)
	}

	// A rollback takes the pieces along, and frees the key.
	req = claimRequest(scope, newKey(), fingerprint("POST /exports b"))
	lease = claimLease(t, ctx, store, req)
	ref = lease.Ref()
	require.NoError(t, lease.WritePiece(ctx, 1, []byte("rolled back")), "write a piece to roll back")
	require.NoError(t, lease.Rollback(ctx))
	p, err = store.ReadPiece(ctx, ref, 1)
	require.NoError(t, err, "read a rolled-back piece")
	require.Nil(t, p, "a rolled-back claim's piece is gone")
	lease = claimLease(t, ctx, store, req)
	commitResponse(t, ctx, lease, "small")
	rec := claimRecord(t, ctx, store, req)
	require.Zero(t, rec.Response.Pieces, "the key claimed again, its body in the record")
	require.Equal(t, "small", string(rec.Response.Body))
}

func claimNow[U any](ctx context.Context, store idempotency.Store[U], req idempotency.ClaimRequest) (idempotency.Lease[U], *idempotency.Record, error) {
	req.AtOnce = true
	return store.Claim(ctx, req)
}

func newKey() string { return "storetest-" + rand.Text() }

func fingerprint(s string) idempotency.Fingerprint { return sha256.Sum256([]byte(s)) }

// claimRequest is a request for the cases' claims, which claim at once
// (claimNow); the cases about claims at commit claim through Claim
// themselves.
func claimRequest(scope, key string, fp idempotency.Fingerprint) idempotency.ClaimRequest {
	return idempotency.ClaimRequest{
		Scope:       scope,
		Key:         key,
		Fingerprint: fp,
		Method:      http.MethodPost,
		Route:       "/widgets",
		TTL:         time.Hour,
		Wait:        5 * time.Second,
	}
}

func response(body string) idempotency.Response {
	return idempotency.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   []byte(body),
	}
}

// claimLease claims req and requires a lease, which is rolled back when the
// test ends (a no-op once it ended).
func claimLease[U any](t *testing.T, ctx context.Context, store idempotency.Store[U], req idempotency.ClaimRequest) idempotency.Lease[U] {
	t.Helper()
	lease, rec, err := claimNow(ctx, store, req)
	require.NoError(t, err, "claim key %q", req.Key)
	require.Nil(t, rec, "claim key %q: want a lease, got a record", req.Key)
	require.NotNil(t, lease, "claim key %q: want a lease, got nothing", req.Key)
	t.Cleanup(func() { _ = lease.Rollback(context.Background()) })
	return lease
}

// claimRecord claims req and requires a completed record.
func claimRecord[U any](t *testing.T, ctx context.Context, store idempotency.Store[U], req idempotency.ClaimRequest) *idempotency.Record {
	t.Helper()
	lease, rec, err := claimNow(ctx, store, req)
	if lease != nil {
		t.Cleanup(func() { _ = lease.Rollback(context.Background()) })
	}
	require.NoError(t, err, "claim key %q", req.Key)
	require.Nil(t, lease, "claim key %q: want a record, got a lease", req.Key)
	require.NotNil(t, rec, "claim key %q: want a record, got nothing", req.Key)
	return rec
}

func commitResponse[U any](t *testing.T, ctx context.Context, lease idempotency.Lease[U], body string) {
	t.Helper()
	require.NoError(t, lease.Commit(ctx, response(body)), "commit %q", body)
}

type claimResult[U any] struct {
	lease   idempotency.Lease[U]
	rec     *idempotency.Record
	err     error
	elapsed time.Duration
}

func claimAsync[U any](ctx context.Context, store idempotency.Store[U], req idempotency.ClaimRequest) <-chan claimResult[U] {
	ch := make(chan claimResult[U], 1)
	go func() {
		start := time.Now()
		lease, rec, err := claimNow(ctx, store, req)
		ch <- claimResult[U]{lease: lease, rec: rec, err: err, elapsed: time.Since(start)}
	}()
	return ch
}

// awaitExpiry returns once the records committed so far in scope with a
// TTL of ttl have expired in store. It commits a sentinel key with that TTL
// and polls it with a claim, so that the store's clock decides
// (PostgreSQL's now(), not the test's) and the case's own records are not
// touched: a claim that gets the sentinel's lease found it expired, and so
// are the records committed before it.
func awaitExpiry[U any](t *testing.T, ctx context.Context, store idempotency.Store[U], scope string, ttl time.Duration) {
	t.Helper()
	sentinel := claimRequest(scope, newKey(), fingerprint("expiry sentinel"))
	sentinel.TTL = ttl
	commitResponse(t, ctx, claimLease(t, ctx, store, sentinel), "sentinel\n")
	sentinel.AtOnce = true // a store that claims at commit would not look now
	require.Eventually(t, func() bool {
		lease, _, err := store.Claim(ctx, sentinel)
		if err != nil || lease == nil {
			return false
		}
		return lease.Rollback(ctx) == nil
	}, expiryTimeout, 5*time.Millisecond, "a record of scope %s with a TTL of %s did not expire", scope, ttl)
}

// requireNoReport fails if ch reports within d: a goroutine that must be
// waiting (behind a holder, a lock) has not returned. It watches the whole
// of d rather than sleeping through it, so a goroutine that returns early
// fails the case at once.
func requireNoReport[T any](t *testing.T, ch <-chan T, d time.Duration, what string) {
	t.Helper()
	require.Never(t, func() bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}, d, 5*time.Millisecond, what)
}

// receive waits for what a goroutine reports, failing rather than hanging
// the whole test binary if a store never answers.
func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		require.FailNow(t, "timed out waiting for "+what)
		var zero T
		return zero
	}
}
