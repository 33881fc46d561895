package httpserver_test

import (
	"bufio"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/httpserver"
)

// The fault run's floods, scaled down: four times MaxConns connections that
// stall in their bodies, or that idle on keep-alive. The server never holds
// more than MaxConns of them (each newcomer replaces the oldest), cuts off
// the stalled ones after the body timeout, and serves a well-behaved client
// at once in the middle of the flood. docs/reliability.md quotes these
// figures.
func TestFloods(t *testing.T) {
	t.Parallel()
	const (
		maxConns    = 64
		flood       = 4 * maxConns
		bodyTimeout = 300 * time.Millisecond
	)
	cfg := httpserver.Config{
		MaxConns:          maxConns,
		ReadHeaderTimeout: bodyTimeout,
		BodyTimeout:       bodyTimeout,
		IdleTimeout:       10 * time.Second,
	}
	for _, tc := range []struct {
		name string
		// open makes c one connection of the flood.
		open func(c net.Conn) error
		// wantHeld is how many of the flood's connections the server keeps
		// for good: none stalled; MaxConns idle ones, less the one that made
		// room for the well-behaved client.
		wantHeld int
	}{
		{
			name: "stalled bodies",
			open: func(c net.Conn) error {
				_, err := c.Write([]byte(headers(1000) + `{"items":`))
				return err
			},
			wantHeld: 0,
		},
		{
			name: "idle keep-alive connections",
			open: func(c net.Conn) error {
				if _, err := c.Write([]byte("GET / HTTP/1.1\r\nHost: test\r\n\r\n")); err != nil {
					return err
				}
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err == nil {
					err = resp.Body.Close()
				}
				return err
			},
			wantHeld: maxConns - 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			counted := &countingListener{Listener: ln}
			b := setupOn(t, counted, cfg)
			var (
				mu        sync.Mutex
				longest   time.Duration
				stillOpen int
				wg        sync.WaitGroup
			)
			for range flood {
				c := b.dial(t)
				if err := tc.open(c); err != nil {
					t.Fatalf("a flood connection was closed before it was in: %v", err)
				}
				wg.Go(func() {
					held, _, closed := waitClosed(c, bodyTimeout+time.Second)
					mu.Lock()
					defer mu.Unlock()
					if !closed {
						stillOpen++
						return
					}
					longest = max(longest, held)
				})
			}

			start := time.Now()
			resp, err := client(t).Get(b.url)
			require.NoError(t, err)
			_ = resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)
			t.Logf("a well-behaved client in the flood: served in %s", time.Since(start).Round(time.Microsecond))

			wg.Wait()
			t.Logf("%d connections: the server held at most %d at once, and closed each it closed within %s; %d still open",
				flood, counted.most(), longest.Round(time.Millisecond), stillOpen)
			// +1: a newcomer is accepted before it replaces another.
			require.LessOrEqual(t, counted.most(), maxConns+1, "never more than MaxConns held")
			require.Less(t, longest, bodyTimeout+500*time.Millisecond)
			require.Equal(t, tc.wantHeld, stillOpen)
		})
	}
}

// countingListener counts the connections the server holds open: accepted
// and not yet closed by it.
type countingListener struct {
	net.Listener
	mu         sync.Mutex
	open, peak int
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.open++
	l.peak = max(l.peak, l.open)
	l.mu.Unlock()
	return &countedConn{Conn: c, l: l}, nil
}

func (l *countingListener) most() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.peak
}

type countedConn struct {
	net.Conn
	l    *countingListener
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() {
		c.l.mu.Lock()
		c.l.open--
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}
