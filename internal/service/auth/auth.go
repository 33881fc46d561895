// Package auth authenticates callers by API key and carries the caller's
// account through the request context. Keys are random, shown once, and
// stored only as SHA-256 hashes.
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
)

// KeyPrefix starts every API key, so a leaked key is recognisable to secret
// scanners and to people.
const KeyPrefix = "ok_"

// ErrUnknownKey means the presented key is not (or no longer) valid. Stores
// return it for a hash they do not know or that was revoked.
var ErrUnknownKey = errors.New("auth: unknown or revoked API key")

// KeyHash is the SHA-256 of an API key, the only form in which keys are stored.
type KeyHash [sha256.Size]byte

// HashKey returns the stored form of key. Looking a key up by its hash
// means no secret is ever compared byte by byte, so there is no timing
// side channel to guard.
func HashKey(key string) KeyHash { return sha256.Sum256([]byte(key)) }

// NewKey returns a fresh API key: the prefix and 256 random bits.
func NewKey() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("read random bytes: %w", err)
	}
	return KeyPrefix + base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// StrongKey reports whether key is as strong as NewKey makes them: the
// prefix and 256 bits, base64url. A demo key must be, unless told
// otherwise: a guessable key opens a persistent database to anyone.
func StrongKey(key string) bool {
	rest, ok := strings.CutPrefix(key, KeyPrefix)
	if !ok {
		return false
	}
	b, err := base64.RawURLEncoding.DecodeString(rest)
	return err == nil && len(b) == 32
}

// Store is what authentication needs from persistence.
type Store interface {
	// AccountByKeyHash returns the account owning an active key, or ErrUnknownKey.
	AccountByKeyHash(ctx context.Context, hash KeyHash) (uuid.UUID, error)
	// CreateAccount stores a new account with one API key.
	CreateAccount(ctx context.Context, id uuid.UUID, name string, hash KeyHash) error
	// RevokeKey makes an active key unknown (to the store: caches keep it
	// for their TTL), and reports whether there was one to revoke.
	RevokeKey(ctx context.Context, hash KeyHash) (bool, error)
}

// Scope is the idempotency scope of an account's keys: the account id's 16
// bytes, so that two accounts' keys never meet.
func Scope(account uuid.UUID) string { return string(account[:]) }

// Credentials are a new account and its API key, shown exactly once.
type Credentials struct {
	AccountID uuid.UUID `json:"account_id"`
	APIKey    string    `json:"api_key"`
}

// CreateAccount makes an account with a fresh key. If key is empty a random
// one is generated; a fixed key is for demo setups only.
func CreateAccount(ctx context.Context, store Store, name, key string) (Credentials, error) {
	if strings.TrimSpace(name) == "" {
		return Credentials{}, errors.New("account name must not be empty")
	}
	if key == "" {
		var err error
		if key, err = NewKey(); err != nil {
			return Credentials{}, err
		}
	}
	id, err := uuid.NewV7()
	if err != nil {
		return Credentials{}, fmt.Errorf("new account id: %w", err)
	}
	if err := store.CreateAccount(ctx, id, name, HashKey(key)); err != nil {
		return Credentials{}, fmt.Errorf("create account: %w", err)
	}
	return Credentials{AccountID: id, APIKey: key}, nil
}

type accountKey struct{}

// WithAccount returns ctx carrying the authenticated account.
func WithAccount(ctx context.Context, id uuid.UUID) context.Context {
	return context.WithValue(ctx, accountKey{}, id)
}

// AccountFrom returns the authenticated account, if any.
func AccountFrom(ctx context.Context) (uuid.UUID, bool) {
	id, ok := ctx.Value(accountKey{}).(uuid.UUID)
	return id, ok
}
