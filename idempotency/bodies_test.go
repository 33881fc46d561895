package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
)

// leaseStore is a memstore whose leases count the pieces written through
// them (Lease.WritePiece), and can be made to take none (unsupported),
// none for now (busy), or to fail from a piece on (-1: never).
type leaseStore struct {
	*memstore.Store
	unsupported bool
	busy        atomic.Bool
	failFrom    atomic.Int64
	pieces      atomic.Int64
}

func newLeaseStore() *leaseStore {
	s := &leaseStore{Store: memstore.New()}
	s.failFrom.Store(-1)
	return s
}

func (s *leaseStore) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Lease[*memstore.Tx], *idempotency.Record, error) {
	lease, rec, err := s.Store.Claim(ctx, req)
	if lease == nil {
		return nil, rec, err
	}
	return countingLease{Lease: lease, s: s}, nil, nil
}

type countingLease struct {
	idempotency.Lease[*memstore.Tx]
	s *leaseStore
}

func (l countingLease) WritePiece(ctx context.Context, n int, p []byte) error {
	if l.s.unsupported {
		return fmt.Errorf("no pieces here: %w", errors.ErrUnsupported)
	}
	if l.s.busy.Load() {
		return fmt.Errorf("busy, not now: %w", errors.ErrUnsupported)
	}
	if f := l.s.failFrom.Load(); f >= 0 && int64(n) >= f {
		return fmt.Errorf("piece %d: %w", n, idempotency.ErrUnavailable)
	}
	l.s.pieces.Add(1)
	return l.Lease.WritePiece(ctx, n, p)
}

// TestOperationsStoreLargeBodiesInPieces: an ordinary operation's answer
// larger than a piece is stored in pieces through its lease while the
// handler writes it, with the operation's writes, and the client gets it
// from the store once committed; its retry replays it whole. A lease that
// takes no pieces keeps the body whole in the record, as before; one busy
// for a while (a handler reading rows of its transaction) takes them once
// it is free again, at the latest when the handler returns; a piece the
// store fails fails the run, and nothing of it is kept; a response that
// is not the outcome passes whole and is not stored.
func TestOperationsStoreLargeBodiesInPieces(t *testing.T) {
	t.Parallel()
	const mib = 1 << 20
	tests := []struct {
		name   string
		size   int
		status int
		store  func(*leaseStore)
		// pieces: taken by the lease in all; during: by the time the
		// handler had written 2 MiB (what shows that the body is not
		// held whole while it runs).
		pieces, during int64
		// failed: the first run is refused 503, and its retry runs again.
		failed bool
		// busy: bytes the handler writes while the lease is busy (-1: all).
		busy int
	}{
		{name: "5 MiB: in pieces as it is written", size: 5 * mib, status: http.StatusCreated, pieces: 20, during: 7},
		{name: "just over a piece: two pieces", size: 256<<10 + 1, status: http.StatusCreated, pieces: 2},
		{name: "a piece exactly: kept in the record", size: 256 << 10, status: http.StatusCreated},
		{name: "a lease without pieces: kept in the record", size: 3 * mib, status: http.StatusCreated, store: func(s *leaseStore) { s.unsupported = true }},
		{name: "a lease busy for the first MiB: in pieces from then on", size: 3 * mib, status: http.StatusCreated, busy: mib, pieces: 12, during: 7},
		{name: "a lease busy while the handler runs: in pieces at the end", size: 3 * mib, status: http.StatusCreated, busy: -1, pieces: 12},
		{name: "the store fails a piece: the run fails, nothing kept", size: 3 * mib, status: http.StatusCreated, store: func(s *leaseStore) { s.failFrom.Store(3) }, pieces: 2, failed: true},
		{name: "not the outcome: passed whole, not stored", size: 3 * mib, status: http.StatusInternalServerError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			store := newLeaseStore()
			if tt.store != nil {
				tt.store(store)
			}
			body := bigBody(tt.size)
			var runs, committed, during atomic.Int64
			e := idempotency.New(idempotency.Config{
				Scope:           func(*http.Request) (string, error) { return "tenant", nil },
				Wait:            200 * time.Millisecond,
				ProblemTypeBase: "https://example.com/problems/",
			})
			op := idempotency.NewOperation(e, store, idempotency.OperationConfig{Name: "export"})
			srv := httptest.NewServer(op.HandlerFunc(func(w http.ResponseWriter, _ *http.Request, tx *memstore.Tx) {
				runs.Add(1)
				tx.OnCommit(func() { committed.Add(1) })
				store.busy.Store(tt.busy != 0)
				defer store.busy.Store(false)
				w.Header().Set("Content-Type", "application/octet-stream")
				w.Header().Set("X-Export", "7")
				w.WriteHeader(tt.status)
				for i, rest := 0, body; len(rest) > 0; i++ {
					if i == (2*mib)/(32<<10) {
						during.Store(store.pieces.Load())
					}
					if tt.busy > 0 && i == tt.busy/(32<<10) {
						store.busy.Store(false)
					}
					n := min(len(rest), 32<<10)
					if _, err := w.Write(rest[:n]); err != nil {
						return // the piece failed: the run is over
					}
					rest = rest[n:]
				}
			}))
			t.Cleanup(srv.Close)

			first, got, err := piecesPost(t, srv, "k1")
			require.NoError(t, err, "the first answer's body")
			if tt.failed {
				require.Equal(t, http.StatusServiceUnavailable, first.StatusCode, "%s", got)
				require.NotEmpty(t, first.Header.Get("Retry-After"))
				require.Zero(t, committed.Load(), "the failed run's writes rolled back")
				require.Equal(t, tt.pieces, store.pieces.Load(), "pieces the lease took before the one that failed")
				require.Equal(t, tt.during, during.Load())
				store.failFrom.Store(-1)
				again, got, err := piecesPost(t, srv, "k1")
				require.NoError(t, err)
				require.Equal(t, tt.status, again.StatusCode, "the retry runs again, its key free")
				require.True(t, bytes.Equal(body, got), "the retry's answer whole")
				require.Equal(t, int64(2), runs.Load())
				require.Equal(t, int64(1), committed.Load())
				return
			}
			require.Equal(t, tt.status, first.StatusCode)
			require.Empty(t, first.Header.Get(idempotency.HeaderReplayed), "the first answer is not a replay")
			require.Equal(t, "7", first.Header.Get("X-Export"), "the handler's headers")
			require.Equal(t, int64(len(body)), first.ContentLength, "the first answer's Content-Length")
			require.True(t, bytes.Equal(body, got), "the first answer whole: %d bytes of %d", len(got), len(body))
			require.Equal(t, tt.pieces, store.pieces.Load(), "pieces the lease took")
			require.Equal(t, tt.during, during.Load(), "pieces taken by the time 2 MiB were written")

			retry, again, err := piecesPost(t, srv, "k1")
			require.NoError(t, err, "the retry's body")
			if tt.status >= 500 {
				require.Equal(t, tt.status, retry.StatusCode, "a server error is not stored: the retry runs")
				require.Empty(t, retry.Header.Get(idempotency.HeaderReplayed))
				require.Equal(t, int64(2), runs.Load())
				require.Zero(t, committed.Load())
				return
			}
			require.Equal(t, tt.status, retry.StatusCode, "%.200s", again)
			require.Equal(t, "true", retry.Header.Get(idempotency.HeaderReplayed))
			require.Equal(t, int64(len(body)), retry.ContentLength, "the replay's Content-Length")
			require.True(t, bytes.Equal(body, again), "the replay is byte for byte the first answer: %d bytes of %d", len(again), len(body))
			require.Equal(t, int64(1), runs.Load(), "the operation ran once")
			require.Equal(t, int64(1), committed.Load(), "its writes committed once")
		})
	}
}
