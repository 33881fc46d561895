package idempotency

import (
	"context"
	"errors"
	"time"
)

// Stats describes the keys table for operators and metrics.
type Stats struct {
	Processing int64 // keys whose operation is running (or was, if stuck)
	Completed  int64 // keys holding a stored response (an estimate on large tables)
	TableBytes int64 // storage used by keys, indexes included (0 in memory)
	// OldestProcessingAge is how long the oldest processing key has been
	// processing (0 when none).
	OldestProcessingAge time.Duration
	// CleanupLag is the age of the oldest expired key not yet deleted (0 when
	// none): how far cleanup is behind.
	CleanupLag time.Duration
}

// StatsSource reports Stats.
type StatsSource interface {
	KeyStats(ctx context.Context) (Stats, error)
}

// KeyInfo is what operators see of one key (oncekey keys inspect). It never
// includes the stored response body, which may hold customer data; only
// its size.
type KeyInfo struct {
	Account        string     `json:"account_id"`
	Key            string     `json:"idempotency_key"`
	Status         string     `json:"status"`
	Fingerprint    string     `json:"fingerprint"`
	Method         string     `json:"method"`
	Route          string     `json:"route"`
	ResponseStatus int        `json:"response_status,omitempty"`
	ResponseBytes  int        `json:"response_bytes"`
	CreatedAt      time.Time  `json:"created_at"`
	CompletedAt    *time.Time `json:"completed_at,omitempty"`
	ExpiresAt      time.Time  `json:"expires_at"`
	Expired        bool       `json:"expired"`
}

// ErrKeyNotFound: no record under that account and key.
var ErrKeyNotFound = errors.New("idempotency: no such key")
