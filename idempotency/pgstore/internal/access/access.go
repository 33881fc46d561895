// Package access lets pgstore's subpackages reach what a Store keeps
// unexported: pgstore fills these in when it is initialised, and only
// packages under pgstore can import this one.
package access

import (
	"context"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore/internal/keydb"
)

// Queries returns the statements of a table, or of one partition of it, on a DBTX.
type Queries func(keydb.DBTX) *keydb.Queries

var (
	// Pool is the pool a *pgstore.Store runs on.
	Pool func(store any) *pgxpool.Pool
	// Table is the statements of a *pgstore.Store's key table.
	Table func(store any) Queries
	// Partitions is the statements of each partition of a *pgstore.Store's
	// key table, or of the table itself when it is not partitioned.
	Partitions func(ctx context.Context, store any) ([]Queries, error)
	// ScopeArg is a scope as a *pgstore.Store's statements take it, or why
	// its key table cannot hold it.
	ScopeArg func(store any, scope string) ([]byte, error)
	// ScopeRead is a scope as a *pgstore.Store's statements read it back.
	ScopeRead func(store any, b []byte) string
	// Settle and Release are a *pgstore.Store's Settle and Release run on
	// db (an operator's transaction, which writes its audit row too).
	Settle  func(ctx context.Context, store any, db keydb.DBTX, ref idempotency.Ref, resp idempotency.Response) (bool, error)
	Release func(ctx context.Context, store any, db keydb.DBTX, ref idempotency.Ref) (bool, error)
	// Response reads a response from its key row's columns as pgstore
	// stored it, so that an operator's view of a record whose body is in
	// pieces (kept as a held record, not stored, for releases that know
	// no pieces) is the record's real status and size, as the store's
	// own reads give it.
	Response func(status pgtype.Int4, headers, body []byte, pieces pgtype.Int4, size pgtype.Int8) (idempotency.Response, error)
)
