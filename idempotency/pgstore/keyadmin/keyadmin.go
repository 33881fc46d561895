// Package keyadmin is the operator's view of pgstore's key table: one key's
// record, the scopes a key is stored under, the keys stuck processing, the
// held keys of unknown outcome, and how many expired keys a purge would
// delete; and the two changes an operator makes by hand, Resolve and
// Release, each audited in the database (Audit reads the trail). It is
// kept apart from pgstore.Store so that the store's API is what a service
// needs, and these are what an operator's tools need.
package keyadmin

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
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
// response body, which may hold customer data; only its size
// (ResponseBytes), and for a body too large for its record, stored apart,
// how many pieces it is in (ResponsePieces).
type KeyInfo struct {
	Scope string `json:"scope"`
	Key   string `json:"idempotency_key"`
	// Status is "processing" or "completed", or for a held operation's key
	// (see Held) its state: "held" while it runs, "unknown" once its
	// outcome is unknown (marked so, or its lease ended), "not-stored".
	// A held key has no ResponseStatus: what is stored is no response.
	Status         string     `json:"status"`
	Fingerprint    string     `json:"fingerprint"`
	Method         string     `json:"method"`
	Route          string     `json:"route"`
	ResponseStatus int        `json:"response_status,omitempty"`
	ResponseBytes  int        `json:"response_bytes"`
	ResponsePieces int        `json:"response_pieces,omitempty"`
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
	// The response as the store reads it: a body in pieces is stored as
	// a held record for releases that know no pieces, and is none.
	resp, err := access.Response(row.ResponseStatus, row.ResponseHeaders, row.ResponseBody, row.ResponsePieces, row.ResponseSize)
	if err != nil {
		return KeyInfo{}, fmt.Errorf("keyadmin: %w", err)
	}
	info := KeyInfo{
		Scope:          access.ScopeRead(store, row.Scope),
		Key:            row.IdempotencyKey,
		Status:         row.Status,
		Fingerprint:    hex.EncodeToString(row.Fingerprint),
		Method:         row.RequestMethod,
		Route:          row.RequestRoute,
		ResponseStatus: resp.Status,
		ResponseBytes:  len(resp.Body),
		ResponsePieces: resp.Pieces,
		CreatedAt:      row.CreatedAt,
		CompletedAt:    row.CompletedAt,
		ExpiresAt:      row.ExpiresAt,
		// By the database's clock, as the store and the gateways judge
		// them, not the operator's.
		Expired: !row.ExpiresAt.After(row.ReadAt),
	}
	if resp.Pieces > 0 {
		info.ResponseBytes = int(resp.Size)
	}
	if held, ok := idempotency.ParseHeld(resp, row.ReadAt); ok {
		info.Held = &held
		info.Status, info.ResponseStatus = heldStatus(held.State), 0
	}
	return info, nil
}

// heldStatus is KeyInfo.Status for a held key in state.
func heldStatus(state string) string {
	if state == idempotency.HeldRunning {
		return "held"
	}
	return string(state)
}

// ScopesOf returns up to limit scopes under which key is stored in store's
// table, in order: for an operator who knows a key and not its whole scope
// (a gateway's namespace). No index leads with the key, so it reads the
// whole table.
func ScopesOf(ctx context.Context, store *pgstore.Store, key string, limit int) ([]string, error) {
	rows, err := access.Table(store)(access.Pool(store)).IdempotencyKeyListScopes(ctx, keydb.IdempotencyKeyListScopesParams{
		IdempotencyKey: key, MaxRows: int32(min(limit, math.MaxInt32)),
	})
	if err != nil {
		return nil, pgstore.Translate(fmt.Errorf("list the scopes of a key: %w", err))
	}
	out := make([]string, 0, len(rows))
	for _, r := range rows {
		out = append(out, access.ScopeRead(store, r))
	}
	return out, nil
}

// UnknownKey is a held key whose outcome is unknown: its operation may
// have run, and nobody will learn how it ended unless an operator finds
// out (see idempotency.ErrOutcomeUnknown).
type UnknownKey struct {
	Scope  string `json:"scope"`
	Key    string `json:"idempotency_key"`
	Method string `json:"method"`
	Route  string `json:"route"`
	// Path is the path the request was sent to, where its holder kept it.
	Path      string    `json:"path,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	// UnknownSince is when the outcome became unknown: when the holder
	// marked it so, or when the lease of a holder that never did ended.
	UnknownSince time.Time `json:"unknown_since"`
	// Holder is the process that held the key (idempotency.Held.Holder),
	// and Reason why its outcome is unknown ("" once the lease ended
	// unmarked: the holder is presumed gone, killed or cut off).
	Holder string `json:"holder,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// UnknownFilter narrows Unknown.
type UnknownFilter struct {
	// ScopePrefix keeps only the keys whose scope starts with it.
	ScopePrefix string
	// Limit bounds the list (0: no bound).
	Limit int
}

// Unknown returns the held keys of store's table whose outcome is unknown,
// oldest first: those marked unknown, and those still marked running
// whose lease has ended. They are the keys idempotency.Stats.Unknown
// counts, all of them when f sets no bound.
func Unknown(ctx context.Context, store *pgstore.Store, f UnknownFilter) ([]UnknownKey, error) {
	parts, err := access.Partitions(ctx, store)
	if err != nil {
		return nil, err
	}
	out := []UnknownKey{}
	for _, part := range parts {
		rows, err := part(access.Pool(store)).IdempotencyKeyListUnknown(ctx)
		if err != nil {
			return nil, pgstore.Translate(fmt.Errorf("list keys of unknown outcome: %w", err))
		}
		for _, r := range rows {
			scope := access.ScopeRead(store, r.Scope)
			if !strings.HasPrefix(scope, f.ScopePrefix) {
				continue
			}
			held, _ := idempotency.ParseHeld(idempotency.Response{Status: idempotency.StatusHeld, Body: r.ResponseBody}, time.Time{})
			k := UnknownKey{Scope: scope, Key: r.IdempotencyKey, Method: r.RequestMethod, Route: r.RequestRoute, Path: held.Path,
				CreatedAt: r.CreatedAt, Holder: held.Holder, Reason: held.Reason}
			switch {
			case held.State == idempotency.HeldRunning:
				k.UnknownSince = held.Until
			case r.CompletedAt != nil: // when the held record was replaced by the unknown one
				k.UnknownSince = *r.CompletedAt
			default:
				k.UnknownSince = r.CreatedAt
			}
			out = append(out, k)
		}
	}
	// Each partition's oldest first: together, the oldest of all.
	slices.SortStableFunc(out, func(a, b UnknownKey) int { return a.CreatedAt.Compare(b.CreatedAt) })
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[:f.Limit]
	}
	return out, nil
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
