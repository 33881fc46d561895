package postgres

import (
	"context"

	"github.com/oncekey/oncekey/gen/db"
	"github.com/oncekey/oncekey/internal/service/store"
)

// reads are the queries of store.Reads, each run where route sends it: the
// primary (Store), or a replica that may lag, the primary standing in for
// it (Replica). route runs fn once or, when the first run's answer will
// not do, again on the primary.
type reads struct {
	route func(ctx context.Context, fn func(ctx context.Context, q *db.Queries) error) error
}

var (
	_ store.Reads = reads{}
	_ store.Reads = (*Replica)(nil)
)
