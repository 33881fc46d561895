package storetest

import (
	"context"
	"testing"

	"github.com/oncekey/oncekey/internal/idempotency"
	"github.com/oncekey/oncekey/internal/store/memory"
	"github.com/oncekey/oncekey/internal/store/postgres"
	"github.com/oncekey/oncekey/internal/testdb"
)

// RunInFront runs the suite with a cache or fast path in front of each
// durable store (PostgreSQL and memory): front wraps the store's keys, and
// the case gets the store with its claims going through that front. A
// front must keep every promise the stores keep.
func RunInFront(t *testing.T, front func(t *testing.T, inner Store) idempotency.Store) {
	t.Helper()
	for name, open := range map[string]func(t *testing.T) Store{
		"postgres": func(t *testing.T) Store { return postgres.New(testdb.Pool(t)) },
		"memory":   func(*testing.T) Store { return memory.New() },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			Run(t, func(t *testing.T) Store {
				inner := open(t)
				return fronted{Store: inner, front: front(t, inner)}
			})
		})
	}
}

// fronted is a full store whose claims go through front.
type fronted struct {
	Store
	front idempotency.Store
}

func (f fronted) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Lease, *idempotency.Record, error) {
	return f.front.Claim(ctx, req)
}
