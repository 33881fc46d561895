package main

import (
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// largeBody writes size bytes of a fixed pseudo-random sequence to w, 32
// KiB at a time, as an upstream streams a large answer, and returns their
// SHA-256; nothing holds the whole body.
func largeBody(w io.Writer, size int) ([32]byte, error) {
	r := rand.New(rand.NewPCG(uint64(size), 59))
	h := sha256.New()
	chunk := make([]byte, 32<<10)
	for rest := size; rest > 0; rest -= len(chunk) {
		chunk = chunk[:min(rest, len(chunk))]
		for i := range chunk {
			chunk[i] = byte(r.Uint32())
		}
		h.Write(chunk)
		if _, err := w.Write(chunk); err != nil {
			return [32]byte{}, err
		}
	}
	return [32]byte(h.Sum(nil)), nil
}

// rssOf is the resident set of process pid, in bytes, from /proc.
func rssOf(pid int) (int64, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// peakRSS samples the resident set of pid every 5 ms while fn runs and
// returns its growth over what it was before fn: the most the process
// held for what fn made it do.
func peakRSS(t *testing.T, pid int, fn func()) int64 {
	t.Helper()
	before, err := rssOf(pid)
	require.NoError(t, err)
	peak := before
	done, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			if rss, err := rssOf(pid); err == nil {
				peak = max(peak, rss)
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	fn()
	close(done)
	<-sampled
	return peak - before
}

// TestProxyReplaysLargeAnswers: through `oncekey proxy` on PostgreSQL, a
// 50 MB answer is stored in pieces as it passes and replayed byte for
// byte, and the gateway's resident memory grows by less than 16 MB during
// the first request and during the replay: neither holds the body. The
// upstream runs once.
func TestProxyReplaysLargeAnswers(t *testing.T) {
	t.Parallel()
	const size = 50_000_000
	var runs atomic.Int64
	var sum atomic.Value // the body's SHA-256, set by the upstream's handler
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			_, _ = io.WriteString(w, "ok")
			return
		}
		runs.Add(1)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(size))
		s, err := largeBody(w, size)
		if err == nil {
			sum.Store(s)
		}
	}))
	t.Cleanup(upstream.Close)
	url, _ := testdb.Fresh(t)
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	require.NoError(t, os.WriteFile(routes, []byte("routes:\n  - {method: POST, path: /exports}\n"), 0o600))
	p := spawnProxy(t, map[string]string{"DATABASE_URL": url}, "--upstream", upstream.URL, "--routes", routes, "--scope-header", "X-Account-Id")

	key, scope := uuid.NewString(), "acct-"+uuid.NewString()
	post := func() (*http.Response, [32]byte, int64) {
		req, err := http.NewRequest(http.MethodPost, "http://"+p.addr+"/exports", strings.NewReader(`{"year":2026}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Account-Id", scope)
		req.Header.Set(idempotency.HeaderKey, key)
		resp, err := (&http.Client{Timeout: 2 * time.Minute}).Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		h := sha256.New()
		n, err := io.Copy(h, resp.Body)
		require.NoError(t, err, "the answer's body")
		return resp, [32]byte(h.Sum(nil)), n
	}
	// A small request first, so that what the process needs to answer at
	// all is counted before, not as the large answer's.
	warm, err := http.Get("http://" + p.addr + "/health")
	require.NoError(t, err)
	_ = warm.Body.Close()

	pid := p.cmd.Process.Pid
	var first, replay *http.Response
	var firstSum, replaySum [32]byte
	var firstLen, replayLen int64
	firstGrowth := peakRSS(t, pid, func() { first, firstSum, firstLen = post() })
	replayGrowth := peakRSS(t, pid, func() { replay, replaySum, replayLen = post() })
	t.Logf("gateway RSS growth: first %.1f MB, replay %.1f MB", float64(firstGrowth)/1e6, float64(replayGrowth)/1e6)

	require.Equal(t, http.StatusOK, first.StatusCode)
	require.Equal(t, int64(size), firstLen)
	require.Equal(t, sum.Load(), firstSum, "the first answer passes whole")
	require.Equal(t, http.StatusOK, replay.StatusCode)
	require.Equal(t, "true", replay.Header.Get(idempotency.HeaderReplayed))
	require.Equal(t, int64(size), replay.ContentLength, "the replay's Content-Length")
	require.Equal(t, int64(size), replayLen)
	require.Equal(t, sum.Load(), replaySum, "the replay is byte for byte the first answer")
	require.Equal(t, int64(1), runs.Load(), "the upstream ran once")
	require.Less(t, firstGrowth, int64(16e6), "the gateway's RSS during the first request")
	require.Less(t, replayGrowth, int64(16e6), "the gateway's RSS during the replay")
}
