package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/pgstore/keyadmin"
	"github.com/oncekey/oncekey/internal/auth"
	"github.com/oncekey/oncekey/internal/gateway"
	"github.com/oncekey/oncekey/internal/store/postgres"
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
