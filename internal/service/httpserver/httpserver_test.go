package httpserver_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/httpserver"
)

// testBundle is a server run by Serve on a loopback port.
type testBundle struct {
	addr   string
	url    string
	cancel context.CancelFunc
	done   chan struct{} // closed when Serve returned
	err    error         // Serve's result, once done is closed
}

// setup runs Serve with cfg until the test ends. A nil Handler answers
// "ok"; a nil Logger discards.
func setup(t *testing.T, cfg httpserver.Config) *testBundle {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return setupOn(t, ln, cfg)
}

// setupOn is setup on a listener of the test's own.
func setupOn(t *testing.T, ln net.Listener, cfg httpserver.Config) *testBundle {
	t.Helper()
	if cfg.Handler == nil {
		cfg.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := &testBundle{addr: ln.Addr().String(), url: "http://" + ln.Addr().String(), cancel: cancel, done: make(chan struct{})}
	go func() {
		b.err = httpserver.Serve(ctx, ln, cfg)
		close(b.done)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-b.done:
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return after its context ended")
		}
	})
	return b
}

// shutdown ends Serve's context and returns Serve's result and how long it
// took to return.
func (b *testBundle) shutdown(t *testing.T) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	b.cancel()
	select {
	case <-b.done:
		return time.Since(start), b.err
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return within 10 s of its context ending")
		return 0, nil
	}
}

// dial opens a raw TCP connection to the server, closed when the test ends.
func (b *testBundle) dial(t *testing.T) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", b.addr, time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// write sends s on c.
func write(t *testing.T, c net.Conn, s string) {
	t.Helper()
	_, err := io.WriteString(c, s)
	require.NoError(t, err)
}

// heldFor reads from c until the server closes it, and returns how long
// that took and what the server sent; it fails the test if c is still open
// after limit.
func heldFor(t *testing.T, c net.Conn, limit time.Duration) (time.Duration, string) {
	t.Helper()
	held, reply, closed := waitClosed(c, limit)
	if !closed {
		t.Fatalf("the server still held the connection after %s", limit)
	}
	return held, reply
}

// waitClosed is heldFor for goroutines other than the test's: it reports
// whether c was closed within limit instead of failing the test.
func waitClosed(c net.Conn, limit time.Duration) (held time.Duration, reply string, closed bool) {
	start := time.Now()
	if err := c.SetReadDeadline(start.Add(limit)); err != nil {
		return 0, "", false
	}
	var got strings.Builder
	_, err := io.Copy(&got, c)
	return time.Since(start), got.String(), !errors.Is(err, os.ErrDeadlineExceeded)
}

// stillOpen reports whether the server has left c open for another wait.
func stillOpen(t *testing.T, c net.Conn, wait time.Duration) bool {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(wait)))
	_, err := c.Read(make([]byte, 1))
	return errors.Is(err, os.ErrDeadlineExceeded)
}

// roundTrip sends a complete request on c and reads its response, leaving
// c open as a keep-alive connection.
func roundTrip(t *testing.T, c net.Conn, br *bufio.Reader, method, body string) *http.Response {
	t.Helper()
	write(t, c, fmt.Sprintf("%s / HTTP/1.1\r\nHost: test\r\nContent-Length: %d\r\n\r\n%s", method, len(body), body))
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return resp
}

// headers is the head of a POST whose body is yet to come.
func headers(contentLength int) string {
	if contentLength < 0 {
		return "POST / HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n"
	}
	return fmt.Sprintf("POST / HTTP/1.1\r\nHost: test\r\nContent-Length: %d\r\n\r\n", contentLength)
}

// client is an HTTP client with its own connections, so no test shares a
// keep-alive connection with another.
func client(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 5 * time.Second}
}

func TestServeNeedsAHandler(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	require.ErrorContains(t, httpserver.Serve(t.Context(), ln, httpserver.Config{}), "Handler is nil")
}

// TestServeReportsListenerFailure: Serve returns when its listener fails,
// rather than serving nothing until ctx ends.
func TestServeReportsListenerFailure(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	require.NoError(t, ln.Close())
	err = httpserver.Serve(t.Context(), ln, httpserver.Config{Handler: http.NotFoundHandler(), Logger: slog.New(slog.DiscardHandler)})
	require.Error(t, err)
	require.True(t, strings.HasPrefix(err.Error(), "httpserver: "), err.Error())
}

// stallInBody makes c a request stalled in its body, known to be past its
// headers: it asks for 100 Continue, which the server sends only when the
// body is first read, then sends part of the body and no more.
func stallInBody(t *testing.T, c net.Conn) {
	t.Helper()
	write(t, c, "POST / HTTP/1.1\r\nHost: test\r\nExpect: 100-continue\r\nContent-Length: 1000\r\n\r\n")
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	want := "HTTP/1.1 100 Continue\r\n\r\n"
	got := make([]byte, len(want))
	_, err := io.ReadFull(c, got)
	require.NoError(t, err)
	require.Equal(t, want, string(got))
	write(t, c, `{"items":`)
}
