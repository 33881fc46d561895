package caddymodule_test

import (
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/internal/testharness"
	"github.com/oncekey/oncekey/idempotency/pgstore/pgstoretest"
)

// TestCaddyReplaysLargeAnswers: through Caddy with the module, on
// PostgreSQL, a 50 MB answer is stored in pieces as it passes and
// replayed byte for byte, and Caddy's resident memory grows by less than
// 16 MB during the first request and during the replay: neither holds
// the body. The upstream runs once.
func TestCaddyReplaysLargeAnswers(t *testing.T) {
	t.Parallel()
	const size = 50_000_000
	var runs atomic.Int64
	var sum atomic.Value
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(size))
		rng := mrand.New(mrand.NewPCG(size, 59))
		h := sha256.New()
		chunk := make([]byte, 32<<10)
		for rest := size; rest > 0; rest -= len(chunk) {
			chunk = chunk[:min(rest, len(chunk))]
			for i := range chunk {
				chunk[i] = byte(rng.Uint32())
			}
			h.Write(chunk)
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
		sum.Store([32]byte(h.Sum(nil)))
	}))
	t.Cleanup(up.Close)
	bin := buildCaddy(t)
	addr := freeAddr(t)
	caddyfile := fmt.Sprintf("{\n\tadmin off\n\tauto_https off\n}\nhttp://%s {\n\tidempotency {\n\t\tscope {http.request.header.X-Account-Id}\n\t\tproblem_type_base https://example.com/problems/\n\t\tdatabase_url %q\n\t\tnamespace exports\n\t}\n\treverse_proxy %s\n}\n",
		addr, pgstoretest.URL(t), strings.TrimPrefix(up.URL, "http://"))
	proc, logs := startCaddyProcess(t, bin, caddyfile, nil, addr)

	scope, key := "acct-"+rand.Text(), rand.Text()
	post := func() (*http.Response, [32]byte, int64) {
		req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/exports", strings.NewReader(`{"year":2026}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Account-Id", scope)
		req.Header.Set(idempotency.HeaderKey, key)
		resp, err := (&http.Client{Timeout: 2 * time.Minute}).Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		h := sha256.New()
		n, err := io.Copy(h, resp.Body)
		require.NoError(t, err, "the answer's body; Caddy's log:\n%s", logs)
		return resp, [32]byte(h.Sum(nil)), n
	}
	var first, replay *http.Response
	var firstSum, replaySum [32]byte
	var firstLen, replayLen int64
	firstGrowth := testharness.PeakRSS(t, proc.Pid, func() { first, firstSum, firstLen = post() })
	replayGrowth := testharness.PeakRSS(t, proc.Pid, func() { replay, replaySum, replayLen = post() })
	t.Logf("Caddy's RSS growth: first %.1f MB, replay %.1f MB", float64(firstGrowth)/1e6, float64(replayGrowth)/1e6)

	require.Equal(t, http.StatusOK, first.StatusCode)
	require.Equal(t, int64(size), firstLen)
	require.Equal(t, sum.Load(), firstSum, "the first answer passes whole")
	require.Equal(t, http.StatusOK, replay.StatusCode)
	require.Equal(t, "true", replay.Header.Get(idempotency.HeaderReplayed))
	require.Equal(t, int64(size), replay.ContentLength, "the replay's Content-Length")
	require.Equal(t, int64(size), replayLen)
	require.Equal(t, sum.Load(), replaySum, "the replay is byte for byte the first answer")
	require.Equal(t, int64(1), runs.Load(), "the upstream ran once")
	require.Less(t, firstGrowth, int64(16e6), "Caddy's RSS during the first request")
	require.Less(t, replayGrowth, int64(16e6), "Caddy's RSS during the replay")
}
