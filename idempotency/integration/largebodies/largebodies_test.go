// Package largebodies_test holds the proof that an ordinary operation's
// large answer passes through bounded memory on PostgreSQL: a test binary
// of its own, since it sets the garbage collector's pace for the whole
// process, so that the heap it samples is what is held.
package largebodies_test

import (
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/pgstore/pgstoretest"
)

func TestMain(m *testing.M) {
	pgstoretest.Main(m, pgstoretest.Options{})
}

// heapObjects is the runtime's count of bytes in live and not yet
// collected heap objects: cheap to read, without stopping the world.
const heapObjects = "/memory/classes/heap/objects:bytes"

// peakHeap samples the heap every millisecond while f runs and returns
// how far it rose above where it was, collected, before f.
func peakHeap(f func()) uint64 {
	runtime.GC()
	sample := []metrics.Sample{{Name: heapObjects}}
	metrics.Read(sample)
	base := sample[0].Value.Uint64()
	var peak atomic.Uint64
	done := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		s := []metrics.Sample{{Name: heapObjects}}
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			metrics.Read(s)
			if v := s[0].Value.Uint64(); v > peak.Load() {
				peak.Store(v)
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	f()
	close(done)
	<-sampled
	if p := peak.Load(); p > base {
		return p - base
	}
	return 0
}

// TestOperationsAnswerLargeBodiesInBoundedMemory: an ordinary operation
// on PostgreSQL whose handler writes one row and a 50 MB answer, in
// writes of 32 KiB as a handler copying a file would, answers it whole
// and replays it byte-identical, its row written once and its body in
// the pieces table; the heap grows by less than 16 MB during the first
// request and during the replay, where holding the body whole would grow
// it by 50 MB.
func TestOperationsAnswerLargeBodiesInBoundedMemory(t *testing.T) {
	// Collect soon: the heap sampled is then what is held, not garbage
	// waiting for a collection.
	defer debug.SetGCPercent(debug.SetGCPercent(10))
	const size, limit = 50_000_000, 16 << 20
	ctx := t.Context()
	pool := pgstoretest.Pool(t)
	store, err := pgstore.New(pool, pgstore.Options{})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS large_exports (key text PRIMARY KEY)")
	require.NoError(t, err)

	var runs atomic.Int64
	e := idempotency.New(idempotency.Config{
		Scope:           func(*http.Request) (string, error) { return "tenant", nil },
		ProblemTypeBase: "https://example.com/problems/",
	})
	op := idempotency.NewOperation(e, store, idempotency.OperationConfig{Name: "export"})
	srv := httptest.NewServer(op.HandlerFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) {
		runs.Add(1)
		if _, err := tx.Exec(r.Context(), "INSERT INTO large_exports VALUES ($1)", r.Header.Get(idempotency.HeaderKey)); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusCreated)
		rnd := rand.NewChaCha8([32]byte{59})
		buf := make([]byte, 32<<10)
		for left := size; left > 0; left -= len(buf) {
			buf = buf[:min(len(buf), left)]
			_, _ = rnd.Read(buf)
			if _, err := w.Write(buf); err != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	want := sha256.New()
	_, _ = io.CopyN(want, rand.NewChaCha8([32]byte{59}), size)

	key := "large-" + strconv.FormatUint(rand.Uint64(), 36)
	post := func(what string) *http.Response {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/exports", nil)
		require.NoError(t, err)
		req.Header.Set(idempotency.HeaderKey, key)
		var resp *http.Response
		grew := peakHeap(func() {
			resp, err = srv.Client().Do(req)
			require.NoError(t, err, what)
			defer resp.Body.Close()
			got := sha256.New()
			n, err := io.Copy(got, resp.Body)
			require.NoError(t, err, "%s: the body", what)
			require.EqualValues(t, size, n, "%s: the body's length", what)
			require.Equal(t, want.Sum(nil), got.Sum(nil), "%s: the body, byte for byte", what)
		})
		t.Logf("%s: the heap grew by %.1f MB", what, float64(grew)/1e6)
		require.Less(t, grew, uint64(limit), "%s: the heap grew by %d bytes, for a %d-byte answer", what, grew, size)
		return resp
	}
	first := post("the first request")
	require.Equal(t, http.StatusCreated, first.StatusCode)
	require.EqualValues(t, size, first.ContentLength)
	require.Empty(t, first.Header.Get(idempotency.HeaderReplayed))
	replay := post("the replay")
	require.Equal(t, http.StatusCreated, replay.StatusCode)
	require.Equal(t, "true", replay.Header.Get(idempotency.HeaderReplayed))
	require.EqualValues(t, size, replay.ContentLength)

	require.EqualValues(t, 1, runs.Load(), "the operation ran once")
	var rows, pieces int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM large_exports WHERE key = $1", key).Scan(&rows))
	require.Equal(t, 1, rows, "the operation's row, written once")
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_keys_pieces WHERE idempotency_key = $1", key).Scan(&pieces))
	require.Equal(t, (size+256<<10-1)/(256<<10), pieces, "the body in pieces of 256 KiB")
}

// TestOperationsStreamRowsOfTheirTransaction: a handler that writes its
// answer row by row as it reads them from its own transaction (its
// connection busy until the rows are closed) answers whole and replays
// whole: the pieces it could not store while the rows were read are
// stored once they are closed, in the same transaction.
func TestOperationsStreamRowsOfTheirTransaction(t *testing.T) {
	ctx := t.Context()
	pool := pgstoretest.Pool(t)
	store, err := pgstore.New(pool, pgstore.Options{})
	require.NoError(t, err)
	e := idempotency.New(idempotency.Config{
		Scope:           func(*http.Request) (string, error) { return "tenant", nil },
		ProblemTypeBase: "https://example.com/problems/",
	})
	op := idempotency.NewOperation(e, store, idempotency.OperationConfig{Name: "report"})
	var runs atomic.Int64
	srv := httptest.NewServer(op.HandlerFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) {
		runs.Add(1)
		rows, err := tx.Query(r.Context(), "SELECT n, repeat(md5(n::text), 32) FROM generate_series(1, 2000) AS n")
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer rows.Close()
		w.Header().Set("Content-Type", "text/csv")
		for rows.Next() {
			var n int
			var line string
			if err := rows.Scan(&n, &line); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			if _, err := fmt.Fprintf(w, "%d,%s\n", n, line); err != nil {
				return
			}
		}
		if rows.Err() != nil {
			http.Error(w, rows.Err().Error(), http.StatusInternalServerError)
		}
	}))
	t.Cleanup(srv.Close)

	key := "rows-" + strconv.FormatUint(rand.Uint64(), 36)
	post := func() (*http.Response, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/reports", nil)
		require.NoError(t, err)
		req.Header.Set(idempotency.HeaderKey, key)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp, string(body)
	}
	first, body := post()
	require.Equal(t, http.StatusOK, first.StatusCode, "%.300s", body)
	require.Equal(t, 2000, strings.Count(body, "\n"), "every row")
	require.Greater(t, len(body), 4*(256<<10), "an answer of several pieces")
	require.True(t, strings.HasPrefix(body, "1,") && strings.Contains(body, "\n2000,"), "the rows in order")
	replay, again := post()
	require.Equal(t, "true", replay.Header.Get(idempotency.HeaderReplayed))
	require.Equal(t, body, again, "the replay, byte for byte")
	require.EqualValues(t, 1, runs.Load())
	var pieces int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_keys_pieces WHERE idempotency_key = $1", key).Scan(&pieces))
	require.Equal(t, (len(body)+256<<10-1)/(256<<10), pieces, "the body in pieces, stored once the rows were closed")
}
