package gateway

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/idempotency"
)

// LegacyScopes is a gateway's key store, for the time after an upgrade
// during which keys stored before namespaces may remain: those carry the
// caller's scope alone, and a retry that spans the upgrade must still find
// them (replay their answer, wait for them, or be unknown, as before). So
// each claim first looks its key up under the caller's bare scope, and
// answers from what is there; only a key free there is claimed under its
// namespaced scope. Refs of such keys are settled and released under
// their own scope.
//
// The look-up costs a claim: Check turns it off for good once no key of
// a bare scope remains unexpired. That holds only if nothing stores such
// keys any more, which is why the old gateways are stopped before the new
// ones start (docs/gateway.md, Upgrades).
//
// The Caddy module, another Go module, keeps a twin of it and of
// PostgresLegacyKeys (legacyScopes in idempotency/caddymodule/legacy.go):
// change both alike.
type LegacyScopes[U any] struct {
	next  idempotency.HeldStore[U]
	any   func(context.Context) (bool, error)
	ended atomic.Bool
}

// NewLegacyScopes wraps next, a gateway's store, whose keys of bare scopes
// anyLegacy reports, looking them up until Check finds none.
func NewLegacyScopes[U any](next idempotency.HeldStore[U], anyLegacy func(context.Context) (bool, error)) *LegacyScopes[U] {
	return &LegacyScopes[U]{next: next, any: anyLegacy}
}

// Check asks whether keys of bare scopes may remain, and ends the look-up
// for good when none do. Call it at start and after each cleanup run.
func (l *LegacyScopes[U]) Check(ctx context.Context) error {
	if l.ended.Load() {
		return nil
	}
	found, err := l.any(ctx)
	if err != nil {
		return fmt.Errorf("gateway: look for keys stored before namespaces: %w", err)
	}
	if !found {
		l.ended.Store(true)
	}
	return nil
}

// Active reports whether claims still look keys up under their bare
// scope.
func (l *LegacyScopes[U]) Active() bool { return !l.ended.Load() }

// Claim implements idempotency.Store.
func (l *LegacyScopes[U]) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Lease[U], *idempotency.Record, error) {
	return l.claim(ctx, req, l.next.Claim)
}

// ClaimNow implements idempotency.DeferringStore, claiming through the
// next store's ClaimNow.
func (l *LegacyScopes[U]) ClaimNow(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Lease[U], *idempotency.Record, error) {
	return l.claim(ctx, req, func(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Lease[U], *idempotency.Record, error) {
		return idempotency.ClaimNow(ctx, l.next, req)
	})
}

func (l *LegacyScopes[U]) claim(ctx context.Context, req idempotency.ClaimRequest,
	claim func(context.Context, idempotency.ClaimRequest) (idempotency.Lease[U], *idempotency.Record, error),
) (idempotency.Lease[U], *idempotency.Record, error) {
	if _, bare, ok := SplitScope(req.Scope); ok && l.Active() {
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
// or else, while keys of bare scopes remain, one stored before (a retry
// of an unknown outcome releases such a key).
func (l *LegacyScopes[U]) Settle(ctx context.Context, ref idempotency.Ref, resp idempotency.Response) (bool, error) {
	return l.settle(ref, func(ref idempotency.Ref) (bool, error) { return l.next.Settle(ctx, ref, resp) })
}

// Release implements idempotency.Settler, as Settle.
func (l *LegacyScopes[U]) Release(ctx context.Context, ref idempotency.Ref) (bool, error) {
	return l.settle(ref, func(ref idempotency.Ref) (bool, error) { return l.next.Release(ctx, ref) })
}

func (l *LegacyScopes[U]) settle(ref idempotency.Ref, settle func(idempotency.Ref) (bool, error)) (bool, error) {
	done, err := settle(ref)
	if done || err != nil || !l.Active() {
		return done, err
	}
	_, bare, ok := SplitScope(ref.Scope)
	if !ok {
		return false, nil
	}
	// The claim's time names the one record it made: a key of the bare
	// scope claimed at another time is not this ref's.
	ref.Scope = bare
	return settle(ref)
}

// PostgresLegacyKeys reports whether table (a pgstore key table with the
// default bytea scope) holds an unexpired key whose scope is not
// namespaced: one outside the range of scopes that start with "ns:" (two
// ranges of the primary key, which starts with the scope: cheap), or one
// inside it without the "|" that ends a namespace (a caller's own scope
// that starts so). The second reads the namespaced keys whole, and runs
// only when the first finds nothing: once, after which Check asks no more.
func PostgresLegacyKeys(db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, table string) func(context.Context) (bool, error) {
	t := pgx.Identifier{table}.Sanitize()
	query := fmt.Sprintf(`SELECT EXISTS (SELECT FROM %[1]s WHERE (scope < $1 OR scope >= $2) AND expires_at > now())
		OR EXISTS (SELECT FROM %[1]s WHERE scope >= $1 AND scope < $2 AND position($3 IN scope) = 0 AND expires_at > now())`, t)
	// Every namespaced scope starts with namespacePrefix, and sorts
	// before the prefix with its last byte raised.
	lo, hi := []byte(namespacePrefix), []byte(namespacePrefix)
	hi[len(hi)-1]++
	return func(ctx context.Context) (bool, error) {
		var found bool
		if err := db.QueryRow(ctx, query, lo, hi, []byte(namespaceEnd)).Scan(&found); err != nil {
			return false, err
		}
		return found, nil
	}
}

// Interface guards.
var (
	_ idempotency.HeldStore[any]      = (*LegacyScopes[any])(nil)
	_ idempotency.DeferringStore[any] = (*LegacyScopes[any])(nil)
)
