package auth

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/golang-lru/v2/expirable"
)

// DefaultCacheTTL is how long a looked-up key is trusted without asking the
// store again; it is also how long a key revoked on another replica keeps
// working on this one.
const DefaultCacheTTL = 10 * time.Second

// DefaultCacheSize bounds how many keys one process remembers.
const DefaultCacheSize = 10_000

// Cache remembers which account an active API key belongs to for a short
// while, saving every request its look-up round trip. Only keys found active
// are remembered: an unknown key always asks the store, so a flood of made-up
// keys cannot push real ones out, and a new key works at once. A key revoked
// through this Cache stops working here at once; revoked elsewhere (another
// replica, SQL) it keeps working for up to the TTL.
type Cache struct {
	Store
	accounts *expirable.LRU[KeyHash, uuid.UUID]
	// revoked remembers keys revoked through this Cache for a TTL, so that
	// a look-up that read the key as active just before the revocation
	// cannot cache it again afterwards.
	revoked *expirable.LRU[KeyHash, struct{}]
}

// NewCache wraps store with a cache of size keys kept for ttl. Each Cache
// runs one expiry goroutine for the life of the process (the library's
// design): make one per process, not per request.
func NewCache(store Store, size int, ttl time.Duration) *Cache {
	return &Cache{
		Store:    store,
		accounts: expirable.NewLRU[KeyHash, uuid.UUID](size, nil, ttl),
		revoked:  expirable.NewLRU[KeyHash, struct{}](size, nil, ttl),
	}
}

// AccountByKeyHash implements Store.
func (c *Cache) AccountByKeyHash(ctx context.Context, hash KeyHash) (uuid.UUID, error) {
	if id, ok := c.accounts.Get(hash); ok {
		return id, nil
	}
	id, err := c.Store.AccountByKeyHash(ctx, hash)
	if err != nil {
		return uuid.UUID{}, err
	}
	if !c.revoked.Contains(hash) {
		c.accounts.Add(hash, id)
	}
	return id, nil
}

// RevokeKey implements Store, forgetting the key here too.
func (c *Cache) RevokeKey(ctx context.Context, hash KeyHash) (bool, error) {
	c.revoked.Add(hash, struct{}{})
	c.accounts.Remove(hash)
	ok, err := c.Store.RevokeKey(ctx, hash)
	c.accounts.Remove(hash) // a look-up that raced the revocation
	return ok, err
}
