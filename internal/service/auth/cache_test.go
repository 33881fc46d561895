package auth_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/auth"
)

// countingStore is an in-test auth.Store that counts look-ups.
type countingStore struct {
	keys    map[auth.KeyHash]uuid.UUID
	lookups int
}

func (s *countingStore) AccountByKeyHash(_ context.Context, h auth.KeyHash) (uuid.UUID, error) {
	s.lookups++
	id, ok := s.keys[h]
	if !ok {
		return uuid.UUID{}, auth.ErrUnknownKey
	}
	return id, nil
}

func (s *countingStore) CreateAccount(_ context.Context, id uuid.UUID, _ string, h auth.KeyHash) error {
	s.keys[h] = id
	return nil
}

func (s *countingStore) RevokeKey(_ context.Context, h auth.KeyHash) (bool, error) {
	_, ok := s.keys[h]
	delete(s.keys, h)
	return ok, nil
}

func TestCache(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// Cases that need a look-up to stay cached between calls use a TTL no
	// stall of a loaded CI machine reaches; the expiry cases poll past it.
	const long, short = time.Minute, 50 * time.Millisecond
	for _, tc := range []struct {
		name string
		ttl  time.Duration
		run  func(t *testing.T, store *countingStore, cache *auth.Cache, creds auth.Credentials)
	}{
		{"an active key is looked up once", long, func(t *testing.T, store *countingStore, cache *auth.Cache, creds auth.Credentials) {
			for range 3 {
				id, err := cache.AccountByKeyHash(ctx, auth.HashKey(creds.APIKey))
				require.NoError(t, err)
				require.Equal(t, creds.AccountID, id)
			}
			require.Equal(t, 1, store.lookups, "later look-ups come from the cache")
		}},
		{"after the TTL the store is asked again", short, func(t *testing.T, store *countingStore, cache *auth.Cache, creds auth.Credentials) {
			_, err := cache.AccountByKeyHash(ctx, auth.HashKey(creds.APIKey))
			require.NoError(t, err)
			// Each look-up within the TTL comes from the cache; the first
			// after it asks the store.
			require.Eventually(t, func() bool {
				_, err := cache.AccountByKeyHash(ctx, auth.HashKey(creds.APIKey))
				return err == nil && store.lookups > 1
			}, 5*time.Second, 10*time.Millisecond, "after the TTL the store is asked again")
			require.Equal(t, 2, store.lookups, "after the TTL the store is asked again, once")
		}},
		{"unknown keys are never cached", long, func(t *testing.T, store *countingStore, cache *auth.Cache, _ auth.Credentials) {
			for range 3 {
				_, err := cache.AccountByKeyHash(ctx, auth.HashKey("ok_made_up"))
				require.ErrorIs(t, err, auth.ErrUnknownKey)
			}
			require.Equal(t, 3, store.lookups)
		}},
		{"revoking through the cache takes effect at once", long, func(t *testing.T, store *countingStore, cache *auth.Cache, creds auth.Credentials) {
			_, err := cache.AccountByKeyHash(ctx, auth.HashKey(creds.APIKey))
			require.NoError(t, err)
			revoked, err := cache.RevokeKey(ctx, auth.HashKey(creds.APIKey))
			require.NoError(t, err)
			require.True(t, revoked)
			_, err = cache.AccountByKeyHash(ctx, auth.HashKey(creds.APIKey))
			require.ErrorIs(t, err, auth.ErrUnknownKey)
		}},
		{"revoked elsewhere, a key works until the TTL", short, func(t *testing.T, store *countingStore, cache *auth.Cache, creds auth.Credentials) {
			_, err := cache.AccountByKeyHash(ctx, auth.HashKey(creds.APIKey))
			require.NoError(t, err)
			_, err = store.RevokeKey(ctx, auth.HashKey(creds.APIKey)) // another replica
			require.NoError(t, err)
			require.Eventually(t, func() bool {
				_, err := cache.AccountByKeyHash(ctx, auth.HashKey(creds.APIKey))
				return errors.Is(err, auth.ErrUnknownKey)
			}, time.Second, 10*time.Millisecond, "after the TTL the revocation holds")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			store := &countingStore{keys: map[auth.KeyHash]uuid.UUID{}}
			cache := auth.NewCache(store, 100, tc.ttl)
			creds, err := auth.CreateAccount(ctx, cache, "cached", "")
			require.NoError(t, err)
			tc.run(t, store, cache, creds)
		})
	}
}
