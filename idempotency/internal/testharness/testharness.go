// Package testharness gives the engine's tests what storetest needs of
// memstore, with writes of its own through its unit of work, alone or with a
// cache or a fast path in front. pgstoretest gives the same for pgstore.
package testharness

import (
	"context"
	"sync"
	"testing"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/idempotency/storetest"
)

// Memstore is the suite's harness for a fresh memstore.
func Memstore() storetest.Harness[*memstore.Tx] {
	store, written := memstore.New(), newRows()
	return storetest.Harness[*memstore.Tx]{
		Open:  func(*testing.T) idempotency.Store[*memstore.Tx] { return store },
		Write: written.write,
		Count: written.count,
		Read:  written.read,
		Replace: func(_ context.Context, ref idempotency.Ref, final idempotency.Response) (bool, error) {
			return store.ReplaceProvisional(ref, final), nil
		},
	}
}

// rows is what the suite writes through a memstore.Tx: rows by id, each
// locked by the lease that writes it until that lease ends, as a primary
// key locks a row in PostgreSQL.
type rows struct {
	mu        sync.Mutex
	committed map[string]string        // id → scope
	locks     map[string]chan struct{} // id → closed when its writer ends
	pending   map[*memstore.Tx][]string
}

func newRows() *rows {
	return &rows{committed: map[string]string{}, locks: map[string]chan struct{}{}, pending: map[*memstore.Tx][]string{}}
}

func (r *rows) write(ctx context.Context, tx *memstore.Tx, ref idempotency.Ref, id string) error {
	for {
		r.mu.Lock()
		held, busy := r.locks[id]
		if !busy {
			break
		}
		r.mu.Unlock()
		select {
		case <-held:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	done := make(chan struct{})
	r.locks[id] = done
	r.pending[tx] = append(r.pending[tx], id)
	r.mu.Unlock()
	end := func(commit bool) func() {
		return func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			if commit {
				if _, dup := r.committed[id]; !dup {
					r.committed[id] = ref.Scope
				}
			}
			delete(r.locks, id)
			delete(r.pending, tx)
			close(done)
		}
	}
	tx.OnCommit(end(true))
	tx.OnRollback(end(false))
	return nil
}

func (r *rows) count(_ context.Context, _ *testing.T, scope string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, s := range r.committed {
		if s == scope {
			n++
		}
	}
	return n
}

func (r *rows) read(_ context.Context, tx *memstore.Tx, id string) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.pending[tx] {
		if p == id {
			return true, nil
		}
	}
	_, ok := r.committed[id]
	return ok, nil
}

// Wrapped returns h with each store it opens wrapped by wrap (a cache, a
// fast path in front of it), which must keep every promise the store keeps.
func Wrapped[U any](h storetest.Harness[U], wrap func(t *testing.T, next idempotency.Store[U]) idempotency.Store[U]) storetest.Harness[U] {
	open := h.Open
	h.Open = func(t *testing.T) idempotency.Store[U] { return wrap(t, open(t)) }
	return h
}
