package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/gen/db"
	"github.com/oncekey/oncekey/internal/service/auth"
)

// AccountByKeyHash implements auth.Store.
func (s *Store) AccountByKeyHash(ctx context.Context, hash auth.KeyHash) (uuid.UUID, error) {
	id, err := db.New(s.pool).APIKeyGetAccountID(ctx, hash[:])
	if errors.Is(err, pgx.ErrNoRows) {
		return uuid.UUID{}, auth.ErrUnknownKey
	}
	return id, translate(err)
}

// CreateAccount implements auth.Store: the account and its key commit together.
func (s *Store) CreateAccount(ctx context.Context, id uuid.UUID, name string, hash auth.KeyHash) error {
	return s.createAccount(ctx, id, name, hash, false)
}

// NameTakenError refuses an account whose name is in use already.
type NameTakenError struct {
	Name string
	// ID is an account of that name.
	ID uuid.UUID
}

func (e *NameTakenError) Error() string {
	return fmt.Sprintf("an account named %q exists already (account_id %s)", e.Name, e.ID)
}

// UniqueNames is the store as an auth.Store whose CreateAccount refuses a
// name in use (*NameTakenError). Concurrent creates of one name run one at
// a time (a transaction-scoped advisory lock on the name), so exactly one
// of them succeeds. Names are not unique in the schema: an operator may
// create a second account of a name on purpose, through the Store itself.
func (s *Store) UniqueNames() auth.Store { return uniqueNames{s} }

type uniqueNames struct{ *Store }

func (u uniqueNames) CreateAccount(ctx context.Context, id uuid.UUID, name string, hash auth.KeyHash) error {
	return u.createAccount(ctx, id, name, hash, true)
}

func (s *Store) createAccount(ctx context.Context, id uuid.UUID, name string, hash auth.KeyHash, unique bool) error {
	return translate(pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		q := db.New(tx)
		if unique {
			if err := q.AccountNameLock(ctx, name); err != nil {
				return fmt.Errorf("lock the account name: %w", err)
			}
			ids, err := q.AccountIDsByName(ctx, name)
			if err != nil {
				return fmt.Errorf("look up the account name: %w", err)
			}
			if len(ids) > 0 {
				return &NameTakenError{Name: name, ID: ids[0]}
			}
		}
		if err := q.AccountCreate(ctx, db.AccountCreateParams{ID: id, Name: name}); err != nil {
			return fmt.Errorf("insert account: %w", err)
		}
		if err := q.APIKeyCreate(ctx, db.APIKeyCreateParams{KeyHash: hash[:], AccountID: id}); err != nil {
			return fmt.Errorf("insert api key: %w", err)
		}
		return nil
	}))
}

// AccountsNamed implements store.Backend.
func (s *Store) AccountsNamed(ctx context.Context, name string) ([]uuid.UUID, error) {
	ids, err := db.New(s.pool).AccountIDsByName(ctx, name)
	return ids, translate(err)
}

// RevokeKey implements auth.Store. The row stays (revoked_at is set), so
// the key's history is kept and it can never be issued again.
func (s *Store) RevokeKey(ctx context.Context, hash auth.KeyHash) (bool, error) {
	n, err := db.New(s.pool).APIKeyRevoke(ctx, hash[:])
	return n == 1, translate(err)
}

// ErrDemoKeyTaken refuses a demo key that is the key of an account other
// than the demo account: it will not be made a demo key.
var ErrDemoKeyTaken = errors.New("the demo API key is another account's key")

// wellKnownDemoKey is the README's demo key, whose hash SetDemoKey treats
// as a demo key's wherever it was given.
var wellKnownDemoKey = auth.HashKey("ok_local_demo")

// SetDemoKey makes key the demo account's only active key, or, with key
// "", leaves the demo account none: every other demo key is revoked, so a
// demo key works exactly as long as the setting that made it is given. The
// account (named demo) is created with key the first time, and a key of it
// disabled by an earlier start without the setting is active again. It
// returns the demo account (uuid.Nil with key "") and how many keys it
// revoked.
func (s *Store) SetDemoKey(ctx context.Context, key string) (account uuid.UUID, revoked int64, err error) {
	keep := auth.KeyHash{}
	if key != "" {
		keep = auth.HashKey(key)
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		q := db.New(tx)
		var err error
		revoked, err = q.APIKeyDisableDemo(ctx, db.APIKeyDisableDemoParams{WellKnown: wellKnownDemoKey[:], Keep: keep[:]})
		if err != nil || key == "" {
			return err
		}
		row, err := q.APIKeyGet(ctx, keep[:])
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			account, err = uuid.NewV7()
			if err != nil {
				return err
			}
			if err := q.AccountCreate(ctx, db.AccountCreateParams{ID: account, Name: "demo"}); err != nil {
				return fmt.Errorf("insert the demo account: %w", err)
			}
			return q.APIKeyCreateDemo(ctx, db.APIKeyCreateDemoParams{KeyHash: keep[:], AccountID: account})
		case err != nil:
			return err
		case !row.Demo:
			// A key of the demo account made before demo keys were flagged
			// is adopted; any other account's key is refused.
			name, err := q.AccountName(ctx, row.AccountID)
			if err != nil {
				return err
			}
			if name != "demo" {
				return ErrDemoKeyTaken
			}
		}
		account = row.AccountID
		return q.APIKeyEnableDemo(ctx, keep[:])
	})
	return account, revoked, translate(err)
}
