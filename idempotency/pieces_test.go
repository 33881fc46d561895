package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
)

// pieceStore is a memstore whose pieces can be made to fail: WritePiece
// unsupported, or failing from a piece on, and ReadPiece failing from a
// piece on (-1: never).
type pieceStore struct {
	*memstore.Store
	unsupported          bool
	failWrite, failRead  atomic.Int64
	written, readsPieces atomic.Int64
}

func newPieceStore() *pieceStore {
	s := &pieceStore{Store: memstore.New()}
	s.failWrite.Store(-1)
	s.failRead.Store(-1)
	return s
}

func (s *pieceStore) WritePiece(ctx context.Context, ref idempotency.Ref, n int, p []byte) (bool, error) {
	if s.unsupported {
		return false, fmt.Errorf("no pieces here: %w", errors.ErrUnsupported)
	}
	if f := s.failWrite.Load(); f >= 0 && int64(n) >= f {
		return false, fmt.Errorf("piece %d: %w", n, idempotency.ErrUnavailable)
	}
	s.written.Add(1)
	return s.Store.WritePiece(ctx, ref, n, p)
}

func (s *pieceStore) ReadPiece(ctx context.Context, ref idempotency.Ref, n int) ([]byte, error) {
	if f := s.failRead.Load(); f >= 0 && int64(n) >= f {
		return nil, idempotency.ErrUnavailable
	}
	s.readsPieces.Add(1)
	return s.Store.ReadPiece(ctx, ref, n)
}

// bigBody is n random bytes, which the handlers below write in writes of
// 32 KiB, as httputil.ReverseProxy copies an upstream's body.
func bigBody(n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(uint64(n), 59))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// piecesServer is a held operation on store, behind a real HTTP server,
// whose handler answers body in writes of 32 KiB, counting its runs.
func piecesServer(t *testing.T, store idempotency.Store[*memstore.Tx], held idempotency.HeldConfig, body []byte) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var runs atomic.Int64
	e := idempotency.New(idempotency.Config{
		Scope:           func(*http.Request) (string, error) { return "tenant", nil },
		Wait:            200 * time.Millisecond,
		ProblemTypeBase: "https://example.com/problems/",
	})
	op := idempotency.NewOperation(e, store, idempotency.OperationConfig{Name: "upstream", Held: &held})
	srv := httptest.NewServer(op.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		runs.Add(1)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusOK)
		for rest := body; len(rest) > 0; {
			n := min(len(rest), 32<<10)
			_, _ = w.Write(rest[:n])
			rest = rest[n:]
		}
	})))
	t.Cleanup(srv.Close)
	return srv, &runs
}

// piecesPost posts to srv with key and reads the whole answer; err is
// the body's read error (io.ErrUnexpectedEOF for one broken off).
func piecesPost(t *testing.T, srv *httptest.Server, key string) (*http.Response, []byte, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/blobs", strings.NewReader(`{"size":"large"}`))
	require.NoError(t, err)
	req.Header.Set(idempotency.HeaderKey, key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, body, err
}

// TestLargeAnswersStoredInPieces: a held operation's answer larger than
// what is kept in memory is stored piece by piece as it passes and
// replayed whole from its pieces; past the limit, or where the store
// takes no pieces, it passes through once and its key says it was not
// stored. Each case counts the handler's runs: never two.
func TestLargeAnswersStoredInPieces(t *testing.T) {
	t.Parallel()
	const mib = 1 << 20
	tests := []struct {
		name  string
		size  int
		held  idempotency.HeldConfig
		store func(*pieceStore)
		// replayed: the retry replays the body; else it is refused
		// (409, not stored).
		replayed bool
		// pieces: the pieces the store took: the head, the body's, and
		// the empty one that ends it.
		pieces int64
	}{
		{name: "5 MiB: stored in pieces, replayed whole", size: 5 * mib, replayed: true, pieces: 1 + 20 + 1},
		{name: "just over a piece: two pieces", size: 256<<10 + 1, replayed: true, pieces: 1 + 2 + 1},
		{name: "a piece exactly: kept in the record", size: 256 << 10, replayed: true, pieces: 0},
		{name: "over the limit: passed through, not stored", size: 3 * mib, held: idempotency.HeldConfig{MaxStored: 2 * mib}, replayed: false, pieces: 1 + 8},
		{name: "a store without pieces: stored in the record up to 1 MiB", size: 900 << 10, store: func(s *pieceStore) { s.unsupported = true }, replayed: true},
		{name: "a store without pieces: larger, not stored", size: 2 * mib, store: func(s *pieceStore) { s.unsupported = true }, replayed: false},
		{name: "the store fails a piece: the rest passes, not stored", size: 4 * mib, store: func(s *pieceStore) { s.failWrite.Store(3) }, replayed: false, pieces: 1 + 2},
		{name: "the store fails the first piece: passes, not stored", size: 4 * mib, store: func(s *pieceStore) { s.failWrite.Store(0) }, replayed: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			store := newPieceStore()
			if tt.store != nil {
				tt.store(store)
			}
			body := bigBody(tt.size)
			srv, runs := piecesServer(t, store, tt.held, body)

			first, got, err := piecesPost(t, srv, "k1")
			require.NoError(t, err, "the first answer's body")
			require.Equal(t, http.StatusOK, first.StatusCode)
			require.True(t, bytes.Equal(body, got), "the first answer passes whole: %d bytes of %d", len(got), len(body))
			require.Equal(t, tt.pieces, store.written.Load(), "pieces the store took")

			retry, again, err := piecesPost(t, srv, "k1")
			require.NoError(t, err, "the retry's body")
			if tt.replayed {
				require.Equal(t, http.StatusOK, retry.StatusCode, "%s", again)
				require.Equal(t, "true", retry.Header.Get(idempotency.HeaderReplayed))
				require.Equal(t, int64(len(body)), retry.ContentLength, "the replay's Content-Length")
				require.True(t, bytes.Equal(body, again), "the replay is byte for byte the first answer: %d bytes of %d", len(again), len(body))
			} else {
				require.Equal(t, http.StatusConflict, retry.StatusCode, "%s", again)
				require.Contains(t, string(again), "not stored")
			}
			require.Equal(t, int64(1), runs.Load(), "the operation ran once")
		})
	}
}

// TestReplayOfPiecesBreaksOffWhenAPieceIsLost: a replay whose piece cannot
// be read breaks the answer off short of its Content-Length, so that no
// client takes a part of the body for the whole.
func TestReplayOfPiecesBreaksOffWhenAPieceIsLost(t *testing.T) {
	t.Parallel()
	store := newPieceStore()
	body := bigBody(2 << 20)
	srv, runs := piecesServer(t, store, idempotency.HeldConfig{}, body)
	_, got, err := piecesPost(t, srv, "k1")
	require.NoError(t, err)
	require.True(t, bytes.Equal(body, got))

	store.failRead.Store(3)
	retry, part, err := piecesPost(t, srv, "k1")
	require.ErrorIs(t, err, io.ErrUnexpectedEOF, "the replay breaks off")
	require.Equal(t, http.StatusOK, retry.StatusCode)
	require.Less(t, len(part), len(body))
	require.True(t, bytes.Equal(body[:len(part)], part), "what came is the stored body's start")

	store.failRead.Store(-1)
	_, again, err := piecesPost(t, srv, "k1")
	require.NoError(t, err)
	require.True(t, bytes.Equal(body, again), "once the store answers, the replay is whole")
	require.Equal(t, int64(1), runs.Load())
}
