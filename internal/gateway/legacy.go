package gateway

import (
	"context"
	"fmt"
	"net/http"
	"sync"
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
	next idempotency.Store[U]
	any  func(context.Context) (bool, error)
	// olds is the scopes a claim of scope looks its key up under first.
	olds  func(ctx context.Context, scope string) []string
	ended atomic.Bool
}

// NewLegacyScopes wraps next, a gateway's store, whose keys of bare scopes
// anyLegacy reports, looking them up until Check finds none.
func NewLegacyScopes[U any](next idempotency.Store[U], anyLegacy func(context.Context) (bool, error)) *LegacyScopes[U] {
	return &LegacyScopes[U]{next: next, any: anyLegacy, olds: func(_ context.Context, scope string) []string {
		if _, bare, ok := SplitScope(scope); ok {
			return []string{bare}
		}
		return nil
	}}
}

// NewPreviousScopes wraps next, a gateway's store, for the time after
// its scope rule changed (Config.PreviousScopes: an upgrade, a rotated
// secret): each claim first looks its key up under the previous scopes
// of its request, as LegacyScopes does under bare ones, until
// anyPrevious (PostgresPreviousKeys) finds no key of them left.
func NewPreviousScopes[U any](next idempotency.Store[U], anyPrevious func(context.Context) (bool, error)) *LegacyScopes[U] {
	return &LegacyScopes[U]{next: next, any: anyPrevious, olds: func(ctx context.Context, _ string) []string {
		if previous, ok := ctx.Value(previousKey{}).(func() []string); ok {
			return previous()
		}
		return nil
	}}
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
	if !l.Active() {
		return l.next.Claim(ctx, req)
	}
	for _, scope := range l.olds(ctx, req.Scope) {
		old := req
		old.Scope = scope
		// At once: a claim at commit would look at nothing.
		old.AtOnce = true
		lease, rec, err := l.next.Claim(ctx, old)
		if lease == nil {
			// A record, a key in flight, or a failure: as before the
			// upgrade.
			return nil, rec, err
		}
		// Free under the old scope: the key is the new one's.
		if err := lease.Rollback(ctx); err != nil {
			return nil, nil, err
		}
	}
	return l.next.Claim(ctx, req)
}

// PurgeExpired implements idempotency.Store, purging the next store.
func (l *LegacyScopes[U]) PurgeExpired(ctx context.Context, batch int) (int64, error) {
	return l.next.PurgeExpired(ctx, batch)
}

// KeyStats implements idempotency.Store, counting the next store's
// keys.
func (l *LegacyScopes[U]) KeyStats(ctx context.Context) (idempotency.Stats, error) {
	return l.next.KeyStats(ctx)
}

// Settle implements idempotency.Store: ref's record is the namespace's,
// or else, while keys of bare scopes remain, one stored before (a retry
// of an unknown outcome releases such a key).
func (l *LegacyScopes[U]) Settle(ctx context.Context, ref idempotency.Ref, resp idempotency.Response) (bool, error) {
	return l.settle(ctx, ref, func(ref idempotency.Ref) (bool, error) { return l.next.Settle(ctx, ref, resp) })
}

// Release implements idempotency.Store, as Settle.
func (l *LegacyScopes[U]) Release(ctx context.Context, ref idempotency.Ref) (bool, error) {
	return l.settle(ctx, ref, func(ref idempotency.Ref) (bool, error) { return l.next.Release(ctx, ref) })
}

// WritePiece implements idempotency.Store, as Settle: the pieces of a
// held record's body are written under the scope it is stored under.
func (l *LegacyScopes[U]) WritePiece(ctx context.Context, ref idempotency.Ref, n int, p []byte) (bool, error) {
	return l.settle(ctx, ref, func(ref idempotency.Ref) (bool, error) { return l.next.WritePiece(ctx, ref, n, p) })
}

// ReadPiece implements idempotency.Store: a replay names its record by
// the request's scope and the record's claim, and a record found under an
// old scope (Claim) keeps its pieces there, so while keys of old scopes
// remain a piece not found under ref's scope is looked for under them.
func (l *LegacyScopes[U]) ReadPiece(ctx context.Context, ref idempotency.Ref, n int) ([]byte, error) {
	p, err := l.next.ReadPiece(ctx, ref, n)
	if p != nil || err != nil || !l.Active() {
		return p, err
	}
	for _, scope := range l.olds(ctx, ref.Scope) {
		old := ref
		old.Scope = scope
		if p, err := l.next.ReadPiece(ctx, old, n); p != nil || err != nil {
			return p, err
		}
	}
	return nil, nil
}

func (l *LegacyScopes[U]) settle(ctx context.Context, ref idempotency.Ref, settle func(idempotency.Ref) (bool, error)) (bool, error) {
	done, err := settle(ref)
	if done || err != nil || !l.Active() {
		return done, err
	}
	// The claim's time names the one record it made: a key of an old
	// scope claimed at another time is not this ref's.
	for _, scope := range l.olds(ctx, ref.Scope) {
		old := ref
		old.Scope = scope
		if done, err := settle(old); done || err != nil {
			return done, err
		}
	}
	return false, nil
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
	// Every namespaced scope starts with namespacePrefix.
	lo, hi := []byte(namespacePrefix), prefixEnd(namespacePrefix)
	return func(ctx context.Context) (bool, error) {
		var found bool
		if err := db.QueryRow(ctx, query, lo, hi, []byte(namespaceEnd)).Scan(&found); err != nil {
			return false, err
		}
		return found, nil
	}
}

// previousKey carries a request's previous scopes, namespaced, to
// NewPreviousScopes's claims: a func, so that they are computed only while
// keys of them may remain.
type previousKey struct{}

// withPrevious is r with its previous scopes, as cfg names them, in its
// context.
func withPrevious(r *http.Request, ns string, previous func(*http.Request) []string) *http.Request {
	once := sync.OnceValue(func() []string {
		scopes := previous(r)
		for i, s := range scopes {
			scopes[i] = NamespacedScope(ns, s)
		}
		return scopes
	})
	return r.WithContext(context.WithValue(r.Context(), previousKey{}, once))
}

// PostgresPreviousKeys reports whether table (a pgstore key table with the
// default bytea scope) holds an unexpired key of namespace ns whose
// caller's scope does not start with current (keyscope.Rule.Prefix): one
// stored under an earlier scope rule. Both ranges are of the primary key,
// which starts with the scope: cheap.
func PostgresPreviousKeys(db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, table, ns, current string) func(context.Context) (bool, error) {
	t := pgx.Identifier{table}.Sanitize()
	query := fmt.Sprintf(`SELECT EXISTS (SELECT FROM %[1]s WHERE ((scope >= $1 AND scope < $2) OR (scope >= $3 AND scope < $4)) AND expires_at > now())`, t)
	lo, cur := NamespacedScope(ns, ""), NamespacedScope(ns, current)
	args := []any{[]byte(lo), []byte(cur), prefixEnd(cur), prefixEnd(lo)}
	return func(ctx context.Context) (bool, error) {
		var found bool
		if err := db.QueryRow(ctx, query, args...).Scan(&found); err != nil {
			return false, err
		}
		return found, nil
	}
}

// prefixEnd is where the scopes that start with prefix end: they sort
// before the prefix with its last byte raised (none of the prefixes here
// ends in 0xff).
func prefixEnd(prefix string) []byte {
	b := []byte(prefix)
	b[len(b)-1]++
	return b
}

// Interface guards.
var (
	_ idempotency.Store[any] = (*LegacyScopes[any])(nil)
)
