package storetest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
)

// deferredOutcome is how one deferred attempt ended: it committed, or it
// found the key taken and learned the record there, or it failed.
type deferredOutcome struct {
	committed bool
	rec       *idempotency.Record
	err       error
}

// attemptDeferred plays what the middleware does for a write-only
// operation: a claim that may be deferred to its commit, one write through
// the lease, the commit, and on a lost claim the record that holds the key;
// when the commit could not say, it claims again, at once (AtOnce), and runs
// the operation again if that claim gets the key (it held an expired
// record).
func attemptDeferred[U any](ctx context.Context, b *bundle[U], store idempotency.Store[U], req idempotency.ClaimRequest, body string) deferredOutcome {
	out := attemptOnce(ctx, b, store.Claim, req, body)
	var taken *idempotency.TakenError
	if !errors.As(out.err, &taken) {
		return out
	}
	if taken.Record != nil {
		return deferredOutcome{rec: taken.Record}
	}
	req.AtOnce = true
	return attemptOnce(ctx, b, store.Claim, req, body)
}

// attemptOnce claims req with claim and, given a lease, writes and commits.
func attemptOnce[U any](ctx context.Context, b *bundle[U], claim func(context.Context, idempotency.ClaimRequest) (idempotency.Lease[U], *idempotency.Record, error), req idempotency.ClaimRequest, body string) deferredOutcome {
	lease, rec, err := claim(ctx, req)
	if err != nil || lease == nil {
		return deferredOutcome{rec: rec, err: err}
	}
	defer func() { _ = lease.Rollback(context.WithoutCancel(ctx)) }()
	if err := b.Write(ctx, lease.Unit(), lease.Ref(), newKey()); err != nil {
		return deferredOutcome{err: err}
	}
	if err := lease.Commit(ctx, response(body)); err != nil {
		return deferredOutcome{err: err}
	}
	return deferredOutcome{committed: true}
}

// 12. Claims that may be made at their commit (through Claim, for
// write-only operations) keep every promise of the others: a replay or a
// mismatch writes nothing, an expired key is free, a rollback leaves
// nothing, a holder in flight is waited for within Wait, and concurrent
// first requests run once. Stores that claim at once pass by claiming as
// usual.
func testClaimAtCommit[U any](t *testing.T, b *bundle[U]) {
	t.Run("replay and mismatch write nothing", func(t *testing.T) {
		t.Parallel()
		store, scope := b.open(t)
		req := claimRequest(scope, newKey(), fingerprint("POST /widgets a"))
		first := attemptDeferred(b.ctx, b, store, req, "first\n")
		require.NoError(t, first.err, "first request")
		require.True(t, first.committed, "the first request must commit")

		again := attemptDeferred(b.ctx, b, store, req, "again\n")
		require.NoError(t, again.err, "replay")
		require.False(t, again.committed, "a replay must not commit")
		require.NotNil(t, again.rec, "a replay must get the record")
		require.Equal(t, []byte("first\n"), again.rec.Response.Body, "replayed body")
		require.Equal(t, req.Fingerprint, again.rec.Fingerprint, "replayed fingerprint")

		other := req
		other.Fingerprint = fingerprint("POST /widgets b")
		mismatch := attemptDeferred(b.ctx, b, store, other, "other\n")
		require.NoError(t, mismatch.err, "mismatch")
		require.False(t, mismatch.committed, "a mismatch must not commit")
		require.NotNil(t, mismatch.rec, "a mismatch must get the original record")
		require.Equal(t, req.Fingerprint, mismatch.rec.Fingerprint, "the record keeps the first fingerprint")
		require.Equal(t, 1, b.Count(b.ctx, t, scope), "writes after a first request, a replay and a mismatch")
	})

	t.Run("expired key is free", func(t *testing.T) {
		t.Parallel()
		store, scope := b.open(t)
		req := claimRequest(scope, newKey(), fingerprint("POST /widgets"))
		short := req
		short.TTL = time.Millisecond
		require.True(t, attemptDeferred(b.ctx, b, store, short, "old\n").committed, "first, short-lived request")
		awaitExpiry(t, b.ctx, store, scope, short.TTL)
		out := attemptDeferred(b.ctx, b, store, req, "new\n")
		require.NoError(t, out.err, "request after expiry")
		require.True(t, out.committed, "the expired key must be claimed again")
		require.Equal(t, []byte("new\n"), claimRecord(t, b.ctx, store, req).Response.Body, "the record after expiry")
		require.Equal(t, 2, b.Count(b.ctx, t, scope), "one write per claim")
	})

	t.Run("rollback leaves nothing", func(t *testing.T) {
		t.Parallel()
		store, scope := b.open(t)
		req := claimRequest(scope, newKey(), fingerprint("POST /widgets"))
		lease, _, err := store.Claim(b.ctx, req) // deferred, where the store defers
		require.NoError(t, err, "claim")
		t.Cleanup(func() { _ = lease.Rollback(context.Background()) })
		require.NoError(t, b.Write(b.ctx, lease.Unit(), lease.Ref(), newKey()), "write")
		require.NoError(t, lease.Rollback(b.ctx), "rollback")
		require.Zero(t, b.Count(b.ctx, t, scope), "writes after a rollback")
		require.True(t, attemptDeferred(b.ctx, b, store, req, "after\n").committed, "the key must be free after a rollback")
	})

	t.Run("a holder in flight is waited for", func(t *testing.T) {
		t.Parallel()
		store, scope := b.open(t)
		req := claimRequest(scope, newKey(), fingerprint("POST /widgets"))
		holder := claimLease(t, b.ctx, store, req) // claimed at once, uncommitted

		short := req
		short.Wait = 200 * time.Millisecond
		start := time.Now()
		out := attemptDeferred(b.ctx, b, store, short, "waiter\n")
		elapsed := time.Since(start)
		require.ErrorIs(t, out.err, idempotency.ErrInFlight, "a deferred attempt behind an open holder (committed=%v)", out.committed)
		require.GreaterOrEqual(t, elapsed, 150*time.Millisecond, "ErrInFlight came before the wait was over")
		require.Less(t, elapsed, 5*time.Second, "ErrInFlight came long after the wait was over")

		// A waiter that outlasts the holder gets its record.
		waiter := make(chan deferredOutcome, 1)
		go func() { waiter <- attemptDeferred(b.ctx, b, store, req, "waiter\n") }()
		requireNoReport(t, waiter, 100*time.Millisecond, "the deferred waiter returned while the holder was still open")
		commitResponse(t, b.ctx, holder, "holder\n")
		res := receive(t, waiter, "the deferred waiter")
		require.NoError(t, res.err, "waiter")
		require.False(t, res.committed, "the waiter must not commit over the holder")
		require.NotNil(t, res.rec, "the waiter must get the holder's record")
		require.Equal(t, []byte("holder\n"), res.rec.Response.Body, "waiter's replay")
		require.Zero(t, b.Count(b.ctx, t, scope), "the holder wrote nothing; the waiters must not have either")
	})

	t.Run("concurrent first requests run once", func(t *testing.T) {
		t.Parallel()
		const claimers = 50
		store, scope := b.open(t)
		req := claimRequest(scope, newKey(), fingerprint("POST /widgets"))
		start := make(chan struct{})
		results := make([]deferredOutcome, claimers)
		var wg sync.WaitGroup
		for i := range claimers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				results[i] = attemptDeferred(b.ctx, b, store, req, "the one\n")
			}()
		}
		close(start)
		wg.Wait()
		committed := 0
		for i, res := range results {
			require.NoError(t, res.err, "claimer %d", i)
			if res.committed {
				committed++
				continue
			}
			require.NotNil(t, res.rec, "claimer %d neither committed nor got a record", i)
			require.Equal(t, []byte("the one\n"), res.rec.Response.Body, "claimer %d's replay", i)
		}
		require.Equal(t, 1, committed, "commits among %d concurrent deferred first requests", claimers)
		require.Equal(t, 1, b.Count(b.ctx, t, scope), "writes made by %d concurrent identical requests", claimers)
	})

	t.Run("concurrent requests for many keys run once per key", func(t *testing.T) {
		// A store may merge concurrent deferred commits (the PostgreSQL
		// store sends them as one transaction): every key still runs once,
		// and every other request for it gets its record.
		t.Parallel()
		const keys, perKey = 20, 5
		store, scope := b.open(t)
		reqs := make([]idempotency.ClaimRequest, keys)
		for i := range reqs {
			reqs[i] = claimRequest(scope, newKey(), fingerprint("POST /widgets"))
		}
		start := make(chan struct{})
		results := make([]deferredOutcome, keys*perKey)
		var wg sync.WaitGroup
		for i := range results {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				req := reqs[i%keys]
				results[i] = attemptDeferred(b.ctx, b, store, req, req.Key)
			}()
		}
		close(start)
		wg.Wait()
		committed := make([]int, keys)
		for i, res := range results {
			require.NoError(t, res.err, "request %d", i)
			if res.committed {
				committed[i%keys]++
				continue
			}
			require.NotNil(t, res.rec, "request %d neither committed nor got a record", i)
			require.Equal(t, reqs[i%keys].Key, string(res.rec.Response.Body), "request %d replayed another key's record", i)
		}
		for k, n := range committed {
			require.Equal(t, 1, n, "commits of key %d among %d concurrent requests", k, perKey)
		}
		require.Equal(t, keys, b.Count(b.ctx, t, scope), "writes made by %d keys", keys)
	})
}
