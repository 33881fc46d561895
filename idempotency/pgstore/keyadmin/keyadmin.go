// Package keyadmin is the operator's view of pgstore's key table: one key's
// record, the keys stuck processing, and how many expired keys a purge
// would delete. It only reads. It is kept apart from pgstore.Store so that
// the store's API is what a service needs, and these are what an operator's
// tools need.
package keyadmin

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/pgstore/internal/access"
	"github.com/oncekey/oncekey/idempotency/pgstore/internal/keydb"
)

// ErrKeyNotFound means no record under that scope and key.
var ErrKeyNotFound = errors.New("keyadmin: no such key")

// KeyInfo is what operators see of one key. It never includes the stored
// response body, which may hold customer data; only its size.
type KeyInfo struct {
	Scope          string     `json:"scope"`
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
	// Held is set for a held operation's key (a gateway's): its state now
	// (running, unknown or not-stored) and why.
	Held *idempotency.Held `json:"held,omitempty"`
}

// Inspect returns one key's record in store's table.
func Inspect(ctx context.Context, store *pgstore.Store, scope, key string) (KeyInfo, error) {
	arg, err := access.ScopeArg(store, scope)
	if err != nil {
		return KeyInfo{}, err
	}
	row, err := access.Table(store)(access.Pool(store)).IdempotencyKeyGet(ctx, keydb.IdempotencyKeyGetParams{Scope: arg, IdempotencyKey: key})
	if errors.Is(err, pgx.ErrNoRows) {
		return KeyInfo{}, ErrKeyNotFound
	}
	if err != nil {
		return KeyInfo{}, pgstore.Translate(err)
	}
	info := KeyInfo{
		Scope:          access.ScopeRead(store, row.Scope),
		Key:            row.IdempotencyKey,
		Status:         row.Status,
		Fingerprint:    hex.EncodeToString(row.Fingerprint),
		Method:         row.RequestMethod,
		Route:          row.RequestRoute,
		ResponseStatus: int(row.ResponseStatus.Int32),
		ResponseBytes:  len(row.ResponseBody),
		CreatedAt:      row.CreatedAt,
		CompletedAt:    row.CompletedAt,
		ExpiresAt:      row.ExpiresAt,
		Expired:        !row.ExpiresAt.After(time.Now()),
	}
	resp := idempotency.Response{Status: info.ResponseStatus, Body: row.ResponseBody}
	if held, ok := idempotency.ParseHeld(resp); ok {
		held.State = held.At(time.Now())
		info.Held = &held
	}
	return info, nil
}

// StuckKey is a key processing for longer than it should.
type StuckKey struct {
	Scope     string    `json:"scope"`
	Key       string    `json:"idempotency_key"`
	Method    string    `json:"method"`
	Route     string    `json:"route"`
	CreatedAt time.Time `json:"created_at"`
}

// Stuck returns up to limit keys of store's table processing for longer
// than olderThan, oldest first.
func Stuck(ctx context.Context, store *pgstore.Store, olderThan time.Duration, limit int) ([]StuckKey, error) {
	parts, err := access.Partitions(ctx, store)
	if err != nil {
		return nil, err
	}
	var out []StuckKey
	for _, part := range parts {
		rows, err := part(access.Pool(store)).IdempotencyKeyListStuck(ctx, keydb.IdempotencyKeyListStuckParams{
			OlderThanSeconds: olderThan.Seconds(), MaxRows: int32(limit),
		})
		if err != nil {
			return nil, pgstore.Translate(fmt.Errorf("list stuck keys: %w", err))
		}
		for _, r := range rows {
			out = append(out, StuckKey{Scope: access.ScopeRead(store, r.Scope), Key: r.IdempotencyKey, Method: r.RequestMethod, Route: r.RequestRoute, CreatedAt: r.CreatedAt})
		}
	}
	// Each partition's oldest: together, the oldest of all.
	slices.SortStableFunc(out, func(a, b StuckKey) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out[:min(len(out), limit)], nil
}

// CountExpired returns how many expired keys of store's table a purge would
// delete now.
func CountExpired(ctx context.Context, store *pgstore.Store) (int64, error) {
	parts, err := access.Partitions(ctx, store)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, part := range parts {
		n, err := part(access.Pool(store)).IdempotencyKeyCountExpired(ctx)
		if err != nil {
			return total, pgstore.Translate(err)
		}
		total += n
	}
	return total, nil
}
