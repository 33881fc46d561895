package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pace holds a peer of these tests back for d: a client backing off or
// keeping to Retry-After, an upstream that is slow or quiet on purpose,
// keys sent over time rather than at once. The slowness is the scenario;
// nothing is waited for.
func pace(d time.Duration) {
	time.Sleep(d) // pacing: a peer slow on purpose, not a wait for anything
}

// slowUpstream is an upstream with a large answer (/large, 32 MiB), a slow
// event stream (/events: an event, then a quiet longer than the gateway's
// write timeout, three times) and a body reader (POST /upload, which
// reports the first bytes it gets and then reads the rest).
type slowUpstream struct {
	url        string
	firstBytes chan string
	large      atomic.Int64 // requests to /large that reached it
	uploads    atomic.Int64 // requests to /upload that reached it
}

func startSlowUpstream(t *testing.T, quiet time.Duration) *slowUpstream {
	t.Helper()
	u := &slowUpstream{firstBytes: make(chan string, 8)}
	chunk := strings.Repeat("x", 32<<10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/large":
			u.large.Add(1)
			w.Header().Set("Content-Length", fmt.Sprint(32<<20))
			for range (32 << 20) / len(chunk) {
				if _, err := io.WriteString(w, chunk); err != nil {
					return
				}
			}
		case "/events":
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range 3 {
				fmt.Fprintf(w, "data: %d\n\n", i)
				_ = http.NewResponseController(w).Flush()
				pace(quiet) // the stream's quiet between events
			}
		case "/upload":
			u.uploads.Add(1)
			buf := make([]byte, 5)
			_, _ = io.ReadFull(r.Body, buf)
			u.firstBytes <- string(buf)
			n, _ := io.Copy(io.Discard, r.Body)
			fmt.Fprintf(w, "%d", n+5)
		default:
			_, _ = io.WriteString(w, "ok")
		}
	}))
	t.Cleanup(srv.Close)
	u.url = srv.URL
	return u
}

// spawnSlowProxy starts `oncekey proxy` in front of u, in memory, with a
// write timeout of writeTimeout at 64 KiB/s.
func spawnSlowProxy(t *testing.T, u *slowUpstream, writeTimeout time.Duration, args ...string) *serveProcess {
	t.Helper()
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	require.NoError(t, os.WriteFile(routes, []byte("routes:\n  - {method: POST, path: /transfers}\n"), 0o600))
	return spawnProxy(t, nil, append([]string{"--upstream", u.url, "--routes", routes, "--scope-header", "X-Account-Id",
		"--write-timeout", writeTimeout.String(), "--min-write-rate", "65536", "--max-body-bytes", "1024"}, args...)...)
}

// TestProxySlowReadersFreeTheirSlots, the gateway's half of the write
// deadline's proof (the other is httpserver's, with 256 clients): clients
// that ask for a 32 MiB answer passed through and never read it take
// every slot of --max-in-flight, and lose them within the write deadline;
// a client that retries its 503 after Retry-After is served within the
// deadline plus a second. Before the write deadline they held the slots
// for as long as they liked.
func TestProxySlowReadersFreeTheirSlots(t *testing.T) {
	t.Parallel()
	const (
		slots        = 16
		writeTimeout = time.Second
		// deadline is the longest a write of the proxy's 32 KiB copy
		// buffer may wait at 64 KiB/s.
		deadline = writeTimeout + 500*time.Millisecond
	)
	u := startSlowUpstream(t, 0)
	p := spawnSlowProxy(t, u, writeTimeout, "--max-in-flight", fmt.Sprint(slots))
	d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		// A small receive window: the client's buffers fill after a few
		// KiB, not the megabytes loopback would take.
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10) })
	}}
	for range slots {
		c, err := d.Dial("tcp", p.addr)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		_, err = fmt.Fprintf(c, "GET /large HTTP/1.1\r\nHost: test\r\n\r\n")
		require.NoError(t, err)
	}

	// A condition, not a pace: 30 s is only the bound on a busy machine
	// (10 s once ran out in CI with the race detector beside it).
	if !assert.Eventually(t, func() bool { return u.large.Load() == slots }, 30*time.Second, 5*time.Millisecond) {
		t.Fatalf("every non-reader's request goes upstream: %d of %d reached it; the gateway's log:\n%s", u.large.Load(), slots, p.logs)
	}
	hc := &http.Client{Timeout: 5 * time.Second}
	get := func() int {
		resp, err := hc.Get("http://" + p.addr + "/small")
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	full := time.Now()
	require.Equal(t, http.StatusServiceUnavailable, get(), "the non-readers hold every slot")
	for get() != http.StatusOK {
		require.Less(t, time.Since(full), deadline+6*time.Second, "still refused")
		pace(time.Second) // Retry-After
	}
	served := time.Since(full)
	t.Logf("served %s after the %d slots were taken (write deadline %s)", served.Round(time.Millisecond), slots, deadline)
	require.Less(t, served, deadline+time.Second, "a retrying client is served within the write deadline plus a second")
}

// TestProxyPacesTheClientNotTheUpstream: an event stream whose upstream is
// quiet for longer than the write timeout reaches its reader whole, and a
// body passed through streams upstream as it comes (the upstream reads its
// first bytes while the rest is still to be sent); a body over
// --max-body-bytes passed through gets 413, declared or not.
func TestProxyPacesTheClientNotTheUpstream(t *testing.T) {
	t.Parallel()
	const writeTimeout = 500 * time.Millisecond
	u := startSlowUpstream(t, 3*writeTimeout)
	p := spawnSlowProxy(t, u, writeTimeout)

	t.Run("a slow event stream", func(t *testing.T) {
		resp, err := http.Get("http://" + p.addr + "/events")
		require.NoError(t, err)
		defer resp.Body.Close()
		got, err := io.ReadAll(resp.Body)
		require.NoError(t, err, "got %q", got)
		require.Equal(t, "data: 0\n\ndata: 1\n\ndata: 2\n\n", string(got))
	})

	t.Run("a body passed through streams", func(t *testing.T) {
		c, err := net.Dial("tcp", p.addr)
		require.NoError(t, err)
		defer c.Close()
		_, err = io.WriteString(c, "POST /upload HTTP/1.1\r\nHost: test\r\nContent-Length: 10\r\n\r\nfirst")
		require.NoError(t, err)
		select {
		case got := <-u.firstBytes:
			require.Equal(t, "first", got)
		case <-time.After(3 * time.Second):
			t.Fatal("the upstream did not get the body's first bytes while the rest was still to come")
		}
		_, err = io.WriteString(c, "later")
		require.NoError(t, err)
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		require.Equal(t, "10", string(body))
	})

	t.Run("a body over the limit", func(t *testing.T) {
		before := u.uploads.Load()
		resp, err := http.Post("http://"+p.addr+"/upload", "text/plain", strings.NewReader(strings.Repeat("x", 2048)))
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, "declared")
		require.Equal(t, before, u.uploads.Load(), "a body declared too large does not go upstream")

		// A reader of unknown length goes chunked.
		resp, err = http.Post("http://"+p.addr+"/upload", "text/plain", io.MultiReader(strings.NewReader(strings.Repeat("x", 2048))))
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, "chunked")
	})
}
