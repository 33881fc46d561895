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
// With a scope_secret it also looks keys up under the scopes the site
// stored them under before: the resolved scope as it was, before the
// secret, and its HMAC under each scope_secret_previous (oldScopes), for
// as long as prevAny finds keys of the namespace stored otherwise than
// under the secret (postgresPreviousKeys), as NewPreviousScopes does for
// oncekey proxy.
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
	next  idempotency.Store[*pgstore.Batch]
	any   func(context.Context) (bool, error)
	ended atomic.Bool
	// prevAny, if set, reports keys of the site's earlier scope rules.
	prevAny   func(context.Context) (bool, error)
	prevEnded atomic.Bool
}

// check asks whether keys of bare scopes may remain, and ends the look-up
// for good when none do.
func (l *legacyScopes) check(ctx context.Context) error {
	if err := lookFor(ctx, l.any, &l.ended); err != nil {
		return fmt.Errorf("idempotency: look for keys stored before namespaces: %w", err)
	}
	if err := lookFor(ctx, l.prevAny, &l.prevEnded); err != nil {
		return fmt.Errorf("idempotency: look for keys stored before scope_secret (or under scope_secret_previous): %w", err)
	}
	return nil
}

// lookFor asks any whether keys remain, and sets ended for good when none
// do (or nothing is to be asked).
func lookFor(ctx context.Context, any func(context.Context) (bool, error), ended *atomic.Bool) error {
	if ended.Load() {
		return nil
	}
	if any == nil {
		ended.Store(true)
		return nil
	}
	found, err := any(ctx)
	if err != nil {
		return err
	}
	if !found {
		ended.Store(true)
	}
	return nil
}

// active reports whether claims still look keys up under their bare scope.
func (l *legacyScopes) active() bool { return !l.ended.Load() }

// previousActive reports whether claims still look keys up under the
// scopes of the site's earlier scope rules.
func (l *legacyScopes) previousActive() bool { return l.prevAny != nil && !l.prevEnded.Load() }

// olds is the scopes a claim of scope looks its key up under first: the
// previous rules' and the bare one, while keys of each may remain.
func (l *legacyScopes) olds(ctx context.Context, scope string) []string {
	o, ok := oldScopesOf(ctx)
	var out []string
	if ok && l.previousActive() {
		out = append(out, o.previous()...)
	}
	switch {
	case !l.active():
	case ok:
		out = append(out, o.beforeNamespaces()...)
	default:
		if bare, found := bareScope(scope); found {
			out = append(out, bare)
		}
	}
	return out
}

// Claim implements idempotency.Store.
func (l *legacyScopes) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Lease[*pgstore.Batch], *idempotency.Record, error) {
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
		// Free under the old scope: the key is the current one's.
		if err := lease.Rollback(ctx); err != nil {
			return nil, nil, err
		}
	}
	return l.next.Claim(ctx, req)
}

// PurgeExpired implements idempotency.Store, purging the next store.
func (l *legacyScopes) PurgeExpired(ctx context.Context, batch int) (int64, error) {
	return l.next.PurgeExpired(ctx, batch)
}

// KeyStats implements idempotency.Store, counting the next store's
// keys.
func (l *legacyScopes) KeyStats(ctx context.Context) (idempotency.Stats, error) {
	return l.next.KeyStats(ctx)
}

// Settle implements idempotency.Store: ref's record is the namespace's,
// or else, while keys of bare scopes remain, one stored before (a retry of
// an unknown outcome releases such a key).
func (l *legacyScopes) Settle(ctx context.Context, ref idempotency.Ref, resp idempotency.Response) (bool, error) {
	return l.settle(ctx, ref, func(ref idempotency.Ref) (bool, error) { return l.next.Settle(ctx, ref, resp) })
}

// Release implements idempotency.Store, as Settle.
func (l *legacyScopes) Release(ctx context.Context, ref idempotency.Ref) (bool, error) {
	return l.settle(ctx, ref, func(ref idempotency.Ref) (bool, error) { return l.next.Release(ctx, ref) })
}

// WritePiece implements idempotency.Store, as Settle: the pieces of a
// held record's body are written under the scope it is stored under.
func (l *legacyScopes) WritePiece(ctx context.Context, ref idempotency.Ref, n int, p []byte) (bool, error) {
	return l.settle(ctx, ref, func(ref idempotency.Ref) (bool, error) { return l.next.WritePiece(ctx, ref, n, p) })
}

// ReadPiece implements idempotency.Store: a replay names its record by
// the request's scope and the record's claim, and a record found under an
// old scope (Claim) keeps its pieces there, so a piece not found under
// ref's scope is looked for under the old ones, while keys of them remain.
func (l *legacyScopes) ReadPiece(ctx context.Context, ref idempotency.Ref, n int) ([]byte, error) {
	p, err := l.next.ReadPiece(ctx, ref, n)
	if p != nil || err != nil {
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

func (l *legacyScopes) settle(ctx context.Context, ref idempotency.Ref, settle func(idempotency.Ref) (bool, error)) (bool, error) {
	done, err := settle(ref)
	if done || err != nil {
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
		for l.active() || l.previousActive() {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if err := l.check(ctx); err != nil && ctx.Err() == nil {
				log.WarnContext(ctx, "idempotency: could not look for keys stored under old scopes; still looking them up", "err", err)
			}
		}
		log.InfoContext(ctx, "idempotency: no key stored before namespaces or under an earlier scope rule remains; claims no longer look keys up under old scopes")
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
	// Every namespaced scope starts with namespacePrefix.
	lo, hi := []byte(namespacePrefix), prefixEnd(namespacePrefix)
	return func(ctx context.Context) (bool, error) {
		var found bool
		if err := pool.QueryRow(ctx, query, lo, hi, []byte(namespaceEnd)).Scan(&found); err != nil {
			return false, err
		}
		return found, nil
	}
}

// postgresPreviousKeys reports whether pgstore's default key table holds
// an unexpired key of namespace ns whose scope does not start with
// current (the scope_secret's scopeMAC prefix): one stored before the secret,
// or under a previous one. Both ranges are of the primary key, which
// starts with the scope: cheap. The twin of PostgresPreviousKeys in
// internal/gateway/legacy.go.
func postgresPreviousKeys(pool *pgxpool.Pool, ns, current string) func(context.Context) (bool, error) {
	query := fmt.Sprintf(`SELECT EXISTS (SELECT FROM %[1]s WHERE ((scope >= $1 AND scope < $2) OR (scope >= $3 AND scope < $4)) AND expires_at > now())`,
		pgx.Identifier{pgstore.DefaultTable}.Sanitize())
	lo, cur := namespacedScope(ns, ""), namespacedScope(ns, current)
	args := []any{[]byte(lo), []byte(cur), prefixEnd(cur), prefixEnd(lo)}
	return func(ctx context.Context) (bool, error) {
		var found bool
		if err := pool.QueryRow(ctx, query, args...).Scan(&found); err != nil {
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
	_ idempotency.Store[*pgstore.Batch] = (*legacyScopes)(nil)
)
