package httpserver_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/httpserver"
)

// blocking is a handler that holds every request until released.
type blocking struct {
	entered chan struct{} // one send per request entering
	release chan struct{}
	once    sync.Once
}

func newBlocking() *blocking {
	return &blocking{entered: make(chan struct{}, 16), release: make(chan struct{})}
}

func (h *blocking) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.entered <- struct{}{}
	<-h.release
	_, _ = io.WriteString(w, "done")
}

// hold starts n requests from hc and returns once all are in the handler;
// each one's status arrives on the returned channel after h.free.
func (h *blocking) hold(t *testing.T, hc *http.Client, url string, n int) <-chan int {
	t.Helper()
	statuses := make(chan int, n)
	for range n {
		go func() {
			resp, err := hc.Post(url, "application/json", strings.NewReader(`{}`))
			if err != nil {
				statuses <- 0
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			statuses <- resp.StatusCode
		}()
	}
	for range n {
		select {
		case <-h.entered:
		case <-time.After(5 * time.Second):
			t.Fatal("the requests did not reach the handler")
		}
	}
	t.Cleanup(h.free)
	return statuses
}

func (h *blocking) free() { h.once.Do(func() { close(h.release) }) }

// Beyond MaxInFlight a request is answered at once with 503, Retry-After
// and a problem document (or the caller's own answer); requests within the
// cap run, and the server takes requests again as soon as one finishes.
func TestInFlightCap(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		overloaded func(http.ResponseWriter, *http.Request)
		wantStatus int
		wantType   string // Content-Type
		wantBody   map[string]any
	}{
		{
			name:       "default problem",
			wantStatus: http.StatusServiceUnavailable,
			wantType:   "application/problem+json",
			wantBody: map[string]any{
				"type":   "https://oncekey.dev/problems/unavailable",
				"title":  "Service temporarily unavailable",
				"status": float64(503),
				"detail": "the server is running as many requests as it can; retry after the delay in Retry-After",
			},
		},
		{
			name: "the caller's own answer",
			overloaded: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusTooManyRequests)
				_, _ = io.WriteString(w, `{"busy":true}`)
			},
			wantStatus: http.StatusTooManyRequests,
			wantType:   "application/json",
			wantBody:   map[string]any{"busy": true},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newBlocking()
			b := setup(t, httpserver.Config{Handler: h, MaxInFlight: 2, RetryAfter: 1500 * time.Millisecond, Overloaded: tc.overloaded})
			hc := client(t)
			held := h.hold(t, hc, b.url, 2)

			start := time.Now()
			resp, err := hc.Post(b.url, "application/json", strings.NewReader(`{"items":[]}`))
			require.NoError(t, err)
			defer resp.Body.Close()
			t.Logf("over the cap: %d in %s", resp.StatusCode, time.Since(start).Round(time.Microsecond))
			require.Equal(t, tc.wantStatus, resp.StatusCode)
			require.Equal(t, tc.wantType, resp.Header.Get("Content-Type"))
			require.Equal(t, "2", resp.Header.Get("Retry-After"), "1.5 s, rounded up to whole seconds")
			var body map[string]any
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
			require.Equal(t, tc.wantBody, body)

			h.free()
			require.Equal(t, http.StatusOK, <-held)
			require.Equal(t, http.StatusOK, <-held)
			resp, err = hc.Get(b.url)
			require.NoError(t, err)
			_ = resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode, "served again once below the cap")
		})
	}
}

// At MaxConns with every connection busy, a new connection is closed at
// once instead of waiting; the busy ones are served.
func TestConnectionCapRefusesWhenAllAreBusy(t *testing.T) {
	t.Parallel()
	h := newBlocking()
	b := setup(t, httpserver.Config{Handler: h, MaxConns: 2})
	held := h.hold(t, client(t), b.url, 2)

	over := b.dial(t)
	write(t, over, "GET / HTTP/1.1\r\nHost: test\r\n\r\n")
	took, reply := heldFor(t, over, 2*time.Second)
	t.Logf("over the cap: closed after %s", took)
	require.Less(t, took, 100*time.Millisecond)
	require.Empty(t, reply)

	h.free()
	require.Equal(t, http.StatusOK, <-held)
	require.Equal(t, http.StatusOK, <-held)
}

// At MaxConns, a new client takes the place of a connection with no request
// running, the one whose loss costs least: idle and stalled clients cannot
// lock new ones out.
func TestConnectionCapMakesRoom(t *testing.T) {
	t.Parallel()
	// idle leaves c a keep-alive connection. net/http marks it idle a
	// moment after the client has read the response: idle returns once
	// the server has.
	idle := func(t *testing.T, l *idleListener, c net.Conn) {
		require.Equal(t, http.StatusOK, roundTrip(t, c, bufio.NewReader(c), http.MethodGet, "").StatusCode)
		select {
		case <-l.idle(c.LocalAddr().String()):
		case <-time.After(5 * time.Second):
			t.Fatal("the server did not mark the connection idle within 5s of its response")
		}
	}
	stalledHeaders := func(t *testing.T, _ *idleListener, c net.Conn) { write(t, c, "POST / HTTP/1.1\r\nHost: test\r\n") }
	stalledBody := func(t *testing.T, _ *idleListener, c net.Conn) { stallInBody(t, c) }
	for _, tc := range []struct {
		name         string
		older, newer func(t *testing.T, l *idleListener, c net.Conn)
		olderGoes    bool // else the newer one goes
	}{
		{name: "the connection idle longest goes", older: idle, newer: idle, olderGoes: true},
		{name: "an idle connection goes before a stalled one", older: stalledBody, newer: idle, olderGoes: false},
		{name: "with none idle, the one stalled longest goes", older: stalledHeaders, newer: stalledBody, olderGoes: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			l := &idleListener{Listener: ln, marked: map[string]chan struct{}{}}
			b := setupOn(t, l, httpserver.Config{MaxConns: 2, ReadHeaderTimeout: 10 * time.Second, BodyTimeout: 10 * time.Second, IdleTimeout: 10 * time.Second})
			older := b.dial(t)
			tc.older(t, l, older)
			newer := b.dial(t)
			tc.newer(t, l, newer)

			resp, err := client(t).Get(b.url)
			require.NoError(t, err, "the new client is served")
			_ = resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)

			goes, stays := newer, older
			if tc.olderGoes {
				goes, stays = older, newer
			}
			took, _ := heldFor(t, goes, time.Second)
			require.Less(t, took, 100*time.Millisecond, "closed to make room")
			require.True(t, stillOpen(t, stays, 100*time.Millisecond), "the other one is kept")
		})
	}
}

// idleListener tells a test when the server has marked a connection idle.
// After a response, net/http clears the connection's write deadline, then
// reports it idle, and on that report the server (conns.observe) clears it
// again: the second cleared deadline of a connection's first request is
// its idle mark. Should either clear go, idle's wait fails, loudly.
type idleListener struct {
	net.Listener
	mu     sync.Mutex
	marked map[string]chan struct{} // closed once idle, by the client's address
}

func (l *idleListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &idleConn{TCPConn: c.(*net.TCPConn), marked: l.idle(c.RemoteAddr().String())}, nil
}

// idle returns a channel closed once the server marks the connection from
// addr idle.
func (l *idleListener) idle(addr string) chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	ch, ok := l.marked[addr]
	if !ok {
		ch = make(chan struct{})
		l.marked[addr] = ch
	}
	return ch
}

// idleConn is a server's connection that closes marked when its write
// deadline is cleared the second time. It embeds the *net.TCPConn so that net/http finds
// CloseWrite and ReadFrom as it would on the connection itself.
type idleConn struct {
	*net.TCPConn
	marked  chan struct{}
	cleared atomic.Int32
}

func (c *idleConn) SetWriteDeadline(t time.Time) error {
	if t.IsZero() && c.cleared.Add(1) == 2 {
		close(c.marked)
	}
	return c.TCPConn.SetWriteDeadline(t)
}
