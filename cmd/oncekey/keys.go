package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/user"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/pgstore/keyadmin"
	"github.com/oncekey/oncekey/internal/gateway"
	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
)

// A key command (keys …, purge) and the gateway (proxy) open the key table
// alone: they create it with the engine's migrations (pgstore.Migrate) on
// a database that lacks it, and touch no other table. A gateway's database
// is the application's own, with tables (an orders table, goose's version
// table) that the service's migrations would collide with; and no key
// command reads the service's tables (an account's keys are found by the
// scope its id makes, auth.Scope), so none needs them. The service's
// commands (serve, migrate, accounts, payments) migrate its whole schema.

// openKeyTable connects to url and creates or checks the key table of
// opts, and nothing else; the pool is closed again if that fails.
func openKeyTable(ctx context.Context, url string, opts pgstore.Options) (*pgxpool.Pool, *pgstore.Store, error) {
	pool, err := postgres.Open(ctx, url)
	if err != nil {
		return nil, nil, err
	}
	if err := pgstore.Migrate(ctx, pool, opts); err != nil {
		pool.Close()
		return nil, nil, err
	}
	keys, err := pgstore.New(pool, opts)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, keys, nil
}

// withKeys opens the key table of db (openKeyTable) and runs fn on it.
func withKeys(ctx context.Context, db databaseFlags, fn func(*pgstore.Store) error) error {
	pool, keys, err := openKeyTable(ctx, db.DatabaseURL, db.keys())
	if err != nil {
		return err
	}
	defer pool.Close()
	return fn(keys)
}

// check refuses a --namespace without --gateway, and a namespace no
// gateway could have.
func (k keyArgs) check() error {
	switch {
	case k.Namespace == "":
		return nil
	case !k.Gateway:
		return errors.New("--namespace names a gateway's namespace: it needs --gateway")
	}
	if err := gateway.CheckNamespace(k.Namespace); err != nil {
		return fmt.Errorf("--namespace: %w", err)
	}
	return nil
}

// storedKey is where the key table keeps a key: its scope as stored, and
// for a gateway's key the namespace that scope holds ("" for a key stored
// before namespaces).
type storedKey struct {
	scope, namespace string
}

// maxNamespacesOfKey bounds the look-up of a gateway key's namespaces
// (storedScope): a key in more namespaces than this is told apart with
// --namespace all the same.
const maxNamespacesOfKey = 100

// storedScope is the scope k's key is stored under: an account's
// (auth.Scope), or a gateway's in the namespace --namespace gives, or else
// in the one namespace that holds it (a key stored before namespaces
// counts as one). Several namespaces are refused, naming them.
func (k keyArgs) storedScope(ctx context.Context, keys *pgstore.Store) (storedKey, error) {
	if !k.Gateway {
		account, err := uuid.Parse(k.Account)
		if err != nil {
			return storedKey{}, fmt.Errorf("ACCOUNT %q is not an account id (a gateway's scope needs --gateway)", k.Account)
		}
		return storedKey{scope: auth.Scope(account)}, nil
	}
	if k.Namespace != "" {
		return storedKey{scope: gateway.NamespacedScope(k.Namespace, k.Account), namespace: k.Namespace}, nil
	}
	scopes, err := keyadmin.ScopesOf(ctx, keys, k.Key, maxNamespacesOfKey)
	if err != nil {
		return storedKey{}, err
	}
	var found []storedKey
	for _, stored := range scopes {
		if ns, scope, _ := gateway.SplitScope(stored); scope == k.Account {
			found = append(found, storedKey{scope: stored, namespace: ns})
		}
	}
	switch len(found) {
	case 0:
		return storedKey{}, fmt.Errorf("%w: scope %q holds key %q in no namespace", keyadmin.ErrKeyNotFound, k.Account, k.Key)
	case 1:
		return found[0], nil
	}
	names := make([]string, 0, len(found))
	for _, f := range found {
		if f.namespace == "" {
			names = append(names, "(none: stored before namespaces)")
			continue
		}
		names = append(names, fmt.Sprintf("%q", f.namespace))
	}
	return storedKey{}, fmt.Errorf("scope %q holds key %q in %d namespaces: %s; say which with --namespace", k.Account, k.Key, len(found), strings.Join(names, ", "))
}

// gatewayKeyInfo is `keys inspect --gateway`'s output: the engine's view
// of a key, with the namespace and the caller's scope its stored scope
// joins.
type gatewayKeyInfo struct {
	Namespace string `json:"namespace"`
	Scope     string `json:"scope"` // the caller's, without the namespace
	keyadmin.KeyInfo
}

// unknownKey is one line of `keys unknown`.
type unknownKey struct {
	// Namespace is the gateway's ("" for a key stored before namespaces).
	Namespace string `json:"namespace"`
	Scope     string `json:"scope"` // the caller's, without the namespace
	keyadmin.UnknownKey
}

// Run is `oncekey keys unknown`: what the metric oncekey_idempotency_keys
// {status="unknown"} and `keys stats` count, by name.
func (k *keysUnknownCmd) Run(e env) error {
	if err := k.require(); err != nil {
		return err
	}
	filter := keyadmin.UnknownFilter{Limit: k.Limit}
	if k.Namespace != "" {
		if err := gateway.CheckNamespace(k.Namespace); err != nil {
			return fmt.Errorf("--namespace: %w", err)
		}
		filter.ScopePrefix = gateway.NamespacedScope(k.Namespace, "")
	}
	if k.Limit < 1 {
		return fmt.Errorf("--limit %d: want 1 or more", k.Limit)
	}
	return withKeys(e.ctx, k.databaseFlags, func(s *pgstore.Store) error {
		unknown, err := keyadmin.Unknown(e.ctx, s, filter)
		if err != nil {
			return err
		}
		out := make([]unknownKey, 0, len(unknown))
		for _, u := range unknown {
			ns, scope, _ := gateway.SplitScope(u.Scope)
			out = append(out, unknownKey{Namespace: ns, Scope: scope, UnknownKey: u})
		}
		return indented(e.stdout).Encode(out)
	})
}

func (k *keysResolveCmd) Run(e env) error {
	if err := k.require(); err != nil {
		return err
	}
	if k.Status < 200 || k.Status > 499 {
		return fmt.Errorf("--status %d: want the upstream's answer, 200 to 499 (a 5xx ran nothing: release the key instead)", k.Status)
	}
	var body []byte
	if k.BodyFile != "" {
		var err error
		if body, err = os.ReadFile(k.BodyFile); err != nil {
			return err
		}
	}
	resp := idempotency.Response{Status: k.Status, Header: http.Header{}, Body: body}
	if len(body) > 0 {
		resp.Header.Set("Content-Type", k.ContentType)
	}
	return changeKey(e, k.databaseFlags, k.keyArgs, k.changeArgs, "resolved", func(ctx context.Context, s *pgstore.Store, c keyadmin.Change) (keyadmin.AuditEntry, error) {
		return keyadmin.Resolve(ctx, s, c, resp)
	})
}

func (k *keysReleaseCmd) Run(e env) error {
	if err := k.require(); err != nil {
		return err
	}
	return changeKey(e, k.databaseFlags, k.keyArgs, k.changeArgs, "released", keyadmin.Release)
}

// operator is who --operator names, or else the OS user running the
// command.
func (c changeArgs) operator(e env) (string, error) {
	if c.Operator != "" {
		return c.Operator, nil
	}
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username, nil
	}
	if name := e.getenv("USER"); name != "" {
		return name, nil
	}
	return "", errors.New("no OS user to name as the operator: say who with --operator")
}

// changeKey runs change (keyadmin.Resolve or Release) on the held key k
// names, whose outcome must be unknown (or not stored): a key still
// running belongs to its gateway. keyadmin writes the audit row, of the
// change or of its refusal; the change is also logged, and printed as
// {"<done>": true}.
func changeKey(e env, db databaseFlags, k keyArgs, c changeArgs, done string, change func(context.Context, *pgstore.Store, keyadmin.Change) (keyadmin.AuditEntry, error)) error {
	if err := k.check(); err != nil {
		return err
	}
	operator, err := c.operator(e)
	if err != nil {
		return err
	}
	return withKeys(e.ctx, db, func(s *pgstore.Store) error {
		stored, lookErr := k.storedScope(e.ctx, s)
		switch {
		case errors.Is(lookErr, keyadmin.ErrKeyNotFound):
			// In no namespace: the attempt is refused, and audited so, under
			// the scope as given.
			stored = storedKey{scope: k.Account}
		case lookErr != nil:
			return lookErr
		}
		entry, err := change(e.ctx, s, keyadmin.Change{Scope: stored.scope, Key: k.Key, Actor: operator, Reason: c.Reason})
		switch {
		case lookErr != nil && errors.Is(err, keyadmin.ErrKeyNotFound):
			return fmt.Errorf("%w (the attempt is in keys audit)", lookErr)
		case errors.Is(err, keyadmin.ErrKeyNotFound), errors.Is(err, keyadmin.ErrNotHeld), errors.Is(err, keyadmin.ErrStillRunning):
			return fmt.Errorf("key %q: %w (the attempt is in keys audit)", k.Key, err)
		case err != nil:
			return err
		}
		e.log.Warn("idempotency key "+done+" by an operator", "account", k.Account, "namespace", stored.namespace, "key", k.Key,
			"was", entry.PreviousState, "operator", entry.Actor, "reason", entry.Reason, "audit_id", entry.ID,
			"status", entry.ResponseStatus, "body_sha256", entry.BodySHA256)
		return indented(e.stdout).Encode(map[string]bool{done: true})
	})
}

// auditRow is one line of `keys audit`.
type auditRow struct {
	// Namespace is the gateway's ("" for a key stored without one).
	Namespace string `json:"namespace"`
	Scope     string `json:"scope"` // the caller's, without the namespace
	keyadmin.AuditEntry
}

// Run is `oncekey keys audit`: who resolved or released which key, when
// and why, and who tried and was refused.
func (k *keysAuditCmd) Run(e env) error {
	if err := k.require(); err != nil {
		return err
	}
	if k.Limit < 1 {
		return fmt.Errorf("--limit %d: want 1 or more", k.Limit)
	}
	filter := keyadmin.AuditFilter{Key: k.Key, Limit: k.Limit}
	switch {
	case k.Namespace != "":
		if err := gateway.CheckNamespace(k.Namespace); err != nil {
			return fmt.Errorf("--namespace: %w", err)
		}
		filter.ScopePrefix = gateway.NamespacedScope(k.Namespace, "")
		if k.Scope != "" {
			filter.Scope = gateway.NamespacedScope(k.Namespace, k.Scope)
		}
	case k.Scope != "":
		// In any namespace: the stored scope ends with it; rows whose
		// caller's scope only ends so are dropped below.
		filter.ScopeSuffix = k.Scope
	}
	if k.Since != "" {
		since, err := parseSince(k.Since, time.Now())
		if err != nil {
			return err
		}
		filter.Since = since
	}
	return withKeys(e.ctx, k.databaseFlags, func(s *pgstore.Store) error {
		entries, err := keyadmin.Audit(e.ctx, s, filter)
		if err != nil {
			return err
		}
		out := make([]auditRow, 0, len(entries))
		for _, a := range entries {
			ns, scope, _ := gateway.SplitScope(a.Scope)
			if k.Scope != "" && scope != k.Scope {
				continue
			}
			if !utf8.ValidString(scope) { // an account's: its 16 bytes
				scope = accountOf(scope)
			}
			out = append(out, auditRow{Namespace: ns, Scope: scope, AuditEntry: a})
		}
		return indented(e.stdout).Encode(out)
	})
}

// parseSince reads --since: a duration back from now, or an RFC 3339 time.
func parseSince(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("--since %q: want a duration back from now (24h) or an RFC 3339 time (2026-01-02T15:04:05Z)", s)
	}
	return t, nil
}
