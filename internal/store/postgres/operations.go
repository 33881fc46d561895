package postgres

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/gen/db"
	"github.com/oncekey/oncekey/internal/idempotency"
)

// InspectKey returns one key's record for operators.
func (s *Store) InspectKey(ctx context.Context, account uuid.UUID, key string) (idempotency.KeyInfo, error) {
	row, err := db.New(s.pool).IdempotencyKeyGet(ctx, db.IdempotencyKeyGetParams{AccountID: account, IdempotencyKey: key})
	if errors.Is(err, pgx.ErrNoRows) {
		return idempotency.KeyInfo{}, idempotency.ErrKeyNotFound
	}
	if err != nil {
		return idempotency.KeyInfo{}, translate(err)
	}
	return idempotency.KeyInfo{
		Account:        row.AccountID.String(),
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
	}, nil
}

// StuckKey is a key processing for longer than it should.
type StuckKey struct {
	Account   string    `json:"account_id"`
	Key       string    `json:"idempotency_key"`
	Method    string    `json:"method"`
	Route     string    `json:"route"`
	CreatedAt time.Time `json:"created_at"`
}

// ListStuck returns up to limit keys processing for longer than olderThan,
// oldest first.
func (s *Store) ListStuck(ctx context.Context, olderThan time.Duration, limit int) ([]StuckKey, error) {
	rows, err := db.New(s.pool).IdempotencyKeyListStuck(ctx, db.IdempotencyKeyListStuckParams{
		OlderThanSeconds: olderThan.Seconds(), MaxRows: int32(limit),
	})
	if err != nil {
		return nil, translate(fmt.Errorf("list stuck keys: %w", err))
	}
	out := make([]StuckKey, 0, len(rows))
	for _, r := range rows {
		out = append(out, StuckKey{Account: r.AccountID.String(), Key: r.IdempotencyKey, Method: r.RequestMethod, Route: r.RequestRoute, CreatedAt: r.CreatedAt})
	}
	return out, nil
}

// CountExpired returns how many expired keys a purge would delete now.
func (s *Store) CountExpired(ctx context.Context) (int64, error) {
	n, err := db.New(s.pool).IdempotencyKeyCountExpired(ctx)
	return n, translate(err)
}
