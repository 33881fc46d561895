package caddymodule

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore"
)

// legacyScopes is a site's key store for the time after an upgrade during
// which keys stored before namespaces may remain: those carry the caller's
// scope alone, and a retry that spans the upgrade must still find them
// (replay their answer, wait for them, or be unknown, as before). So each
// claim first looks its key up under the caller's bare scope, and answers
// from what is there; only a key free there is claimed under its
// namespaced scope. Refs of such keys are settled and released under
// their own scope.
//
// It is the twin of LegacyScopes in internal/gateway/legacy.go (oncekey
// proxy), which this module, another Go module, cannot import; a public
// home in the engine's modules would add to an API kept small, for what
// only the two front doors need. Change both alike.
//
// The look-up costs a claim: check turns it off for good once no key of a
// bare scope remains unexpired. That holds only if nothing stores such
// keys any more, which is why the old Caddies are stopped before the new
// ones start (docs/gateway.md, Upgrades).
type legacyScopes struct {
	next  idempotency.HeldStore[*pgstore.Batch]
	any   func(context.Context) (bool, error)
	ended atomic.Bool
}

// check asks whether keys of bare scopes may remain, and ends the look-up
// for good when none do.
func (l *legacyScopes) check(ctx context.Context) error {
	if l.ended.Load() {
		return nil
	}
	found, err := l.any(ctx)
	if err != nil {
		return fmt.Errorf("idempotency: look for keys stored before namespaces: %w", err)
	}
	if !found {
		l.ended.Store(true)
	}
	return nil
}

// active reports whether claims still look keys up under their bare scope.
func (l *legacyScopes) active() bool { return !l.ended.Load() }

// Claim implements idempotency.Store.
func (l *legacyScopes) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Lease[*pgstore.Batch], *idempotency.Record, error) {
	return l.claim(ctx, req, l.next.Claim)
}

// ClaimNow implements idempotency.DeferringStore, claiming through the
// next store's ClaimNow.
func (l *legacyScopes) ClaimNow(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Lease[*pgstore.Batch], *idempotency.Record, error) {
	return l.claim(ctx, req, func(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Lease[*pgstore.Batch], *idempotency.Record, error) {
		return idempotency.ClaimNow(ctx, l.next, req)
	})
}

func (l *legacyScopes) claim(ctx context.Context, req idempotency.ClaimRequest,
	claim func(context.Context, idempotency.ClaimRequest) (idempotency.Lease[*pgstore.Batch], *idempotency.Record, error),
) (idempotency.Lease[*pgstore.Batch], *idempotency.Record, error) {
	if bare, ok := bareScope(req.Scope); ok && l.active() {
		old := req
		old.Scope = bare
		// At once: a deferring store's Claim would look at nothing.
		lease, rec, err := idempotency.ClaimNow(ctx, l.next, old)
		if lease == nil {
			// A record, a key in flight, or a failure: as before the
			// upgrade.
			return nil, rec, err
		}
		// Free under the bare scope: the key is the namespace's.
		if err := lease.Rollback(ctx); err != nil {
			return nil, nil, err
		}
	}
	return claim(ctx, req)
}

// Settle implements idempotency.Settler: ref's record is the namespace's,
// or else, while keys of bare scopes remain, one stored before (a retry of
// an unknown outcome releases such a key).
func (l *legacyScopes) Settle(ctx context.Context, ref idempotency.Ref, resp idempotency.Response) (bool, error) {
	return l.settle(ref, func(ref idempotency.Ref) (bool, error) { return l.next.Settle(ctx, ref, resp) })
}

// Release implements idempotency.Settler, as Settle.
func (l *legacyScopes) Release(ctx context.Context, ref idempotency.Ref) (bool, error) {
	return l.settle(ref, func(ref idempotency.Ref) (bool, error) { return l.next.Release(ctx, ref) })
}

func (l *legacyScopes) settle(ref idempotency.Ref, settle func(idempotency.Ref) (bool, error)) (bool, error) {
	done, err := settle(ref)
	if done || err != nil || !l.active() {
		return done, err
	}
	bare, ok := bareScope(ref.Scope)
	if !ok {
		return false, nil
	}
	// The claim's time names the one record it made: a key of the bare
	// scope claimed at another time is not this ref's.
	ref.Scope = bare
	return settle(ref)
}

// legacyCheckEvery is how often a site asks again whether keys stored
// before namespaces remain: Caddy runs no cleanup of the key table, after
// which oncekey proxy asks.
const legacyCheckEvery = 5 * time.Minute

// watch asks every so often (legacyCheckEvery) whether keys of bare
// scopes remain, until none do or stop is called (at Cleanup), which
// returns once it has stopped asking.
func (l *legacyScopes) watch(log *slog.Logger, every time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for l.active() {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if err := l.check(ctx); err != nil && ctx.Err() == nil {
				log.WarnContext(ctx, "idempotency: could not look for keys stored before namespaces; still looking them up", "err", err)
			}
		}
		log.InfoContext(ctx, "idempotency: no key stored before namespaces remains; claims no longer look keys up under the bare scope")
	}()
	return func() { cancel(); <-done }
}

// postgresLegacyKeys reports whether pgstore's default key table holds an
// unexpired key whose scope is not namespaced: one outside the range of
// scopes that start with "ns:" (two ranges of the primary key, which
// starts with the scope: cheap), or one inside it without the "|" that
// ends a namespace (a caller's own scope that starts so). The second reads
// the namespaced keys whole, and runs only when the first finds nothing:
// once, after which check asks no more. The twin of PostgresLegacyKeys in
// internal/gateway/legacy.go.
func postgresLegacyKeys(pool *pgxpool.Pool) func(context.Context) (bool, error) {
	query := fmt.Sprintf(`SELECT EXISTS (SELECT FROM %[1]s WHERE (scope < $1 OR scope >= $2) AND expires_at > now())
		OR EXISTS (SELECT FROM %[1]s WHERE scope >= $1 AND scope < $2 AND position($3 IN scope) = 0 AND expires_at > now())`,
		pgx.Identifier{pgstore.DefaultTable}.Sanitize())
	// Every namespaced scope starts with namespacePrefix, and sorts
	// before the prefix with its last byte raised.
	lo, hi := []byte(namespacePrefix), []byte(namespacePrefix)
	hi[len(hi)-1]++
	return func(ctx context.Context) (bool, error) {
		var found bool
		if err := pool.QueryRow(ctx, query, lo, hi, []byte(namespaceEnd)).Scan(&found); err != nil {
			return false, err
		}
		return found, nil
	}
}

// Interface guards.
var (
	_ idempotency.HeldStore[*pgstore.Batch]      = (*legacyScopes)(nil)
	_ idempotency.DeferringStore[*pgstore.Batch] = (*legacyScopes)(nil)
)
