package httpserver_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/httpserver"
)

// smallBuffers is a listener whose connections have a small send buffer,
// so that a client that stops reading blocks the server's writes after a
// few KiB rather than after the megabytes the kernel would buffer on
// loopback: what the test measures is the write deadline, not the
// kernel's memory.
type smallBuffers struct{ net.Listener }

func (l smallBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(8 << 10)
	}
	return c, err
}

// dialNonReader connects with a small receive window and asks for path,
// then never reads.
func dialNonReader(ctx context.Context, addr, path string) (net.Conn, error) {
	d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10) })
		if err != nil {
			return err
		}
		return serr
	}}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: test\r\n\r\n", path); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

// The proof of the write deadline (docs/reliability.md): 256 clients that
// ask for a large answer and never read it take every slot of MaxInFlight
// 256, and each slot is freed within the write deadline; a client that
// gets 503 and retries after Retry-After is served within the deadline
// plus a second. Without a write deadline the slots are held for as long
// as the non-readers keep their connections open.
func TestSlowReadersFreeTheirSlots(t *testing.T) {
	t.Parallel()
	const (
		clients      = 256
		writeTimeout = time.Second
		minWriteRate = 64 << 10
		chunk        = 32 << 10
		// deadline is the longest a blocked write of one chunk may take.
		deadline = writeTimeout + time.Duration(chunk)*time.Second/minWriteRate
		slack    = time.Second
	)
	var (
		entered  atomic.Int64
		mu       sync.Mutex
		longest  time.Duration
		finished int
	)
	large := bytes.Repeat([]byte("x"), chunk)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/large" {
			_, _ = io.WriteString(w, "ok")
			return
		}
		start := time.Now()
		entered.Add(1)
		defer func() {
			mu.Lock()
			defer mu.Unlock()
			longest = max(longest, time.Since(start))
			finished++
		}()
		w.Header().Set("Content-Length", fmt.Sprint(32<<20))
		for range (32 << 20) / chunk {
			if _, err := w.Write(large); err != nil {
				return
			}
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	b := setupOn(t, smallBuffers{ln}, httpserver.Config{
		Handler: handler, MaxInFlight: clients, MaxConns: 2 * clients,
		WriteTimeout: writeTimeout, MinWriteRate: minWriteRate,
	})

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for range clients {
		c, err := dialNonReader(ctx, b.addr, "/large")
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
	}
	require.Eventually(t, func() bool { return entered.Load() == clients }, 10*time.Second, 5*time.Millisecond,
		"every non-reader's request runs")
	full := time.Now()

	hc := client(t)
	attempts := 0
	for {
		attempts++
		resp, err := hc.Get(b.url + "/")
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			break
		}
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		require.Equal(t, "1", resp.Header.Get("Retry-After"))
		require.Less(t, time.Since(full), deadline+slack+5*time.Second, "still refused after %d attempts", attempts)
		pace(time.Second) // the Retry-After it was told
	}
	served := time.Since(full)
	t.Logf("a retrying client was served %s after %d slots were taken, on attempt %d (write deadline %s)",
		served.Round(time.Millisecond), clients, attempts, deadline)
	require.Less(t, served, deadline+slack, "served within the write deadline plus a second")

	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return finished == clients
	}, deadline+slack, 10*time.Millisecond, "every non-reader's slot is freed")
	mu.Lock()
	defer mu.Unlock()
	t.Logf("the longest a non-reader held its slot: %s", longest.Round(time.Millisecond))
	require.Less(t, longest, deadline+slack/2, "no slot held past the write deadline")
}

// Only the client's reading is timed, not the handler's pace: an event
// stream that sends a byte now and then, with gaps longer than the write
// timeout, reaches a client that reads it whole, and so does what a
// handler leaves buffered when it returns after a long quiet.
func TestSlowHandlersAreNotSlowReaders(t *testing.T) {
	t.Parallel()
	const writeTimeout = 300 * time.Millisecond
	const gap = 3 * writeTimeout
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		want    string
	}{
		{
			name: "an event stream with long gaps",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				rc := http.NewResponseController(w)
				for i := range 3 {
					if _, err := fmt.Fprintf(w, "data: %d\n\n", i); err != nil {
						return
					}
					if err := rc.Flush(); err != nil {
						return
					}
					pace(gap)
				}
			},
			want: "data: 0\n\ndata: 1\n\ndata: 2\n\n",
		},
		{
			name: "a write left buffered over a long quiet",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				_, _ = io.WriteString(w, "early")
				pace(gap)
				_, _ = io.WriteString(w, " and late")
			},
			want: "early and late",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, httpserver.Config{Handler: tc.handler, WriteTimeout: writeTimeout})
			resp, err := client(t).Get(b.url)
			require.NoError(t, err)
			defer resp.Body.Close()
			got, err := io.ReadAll(resp.Body)
			require.NoError(t, err, "the whole answer arrives (got %q)", got)
			require.Equal(t, tc.want, string(got))
		})
	}
}

// A request beyond MaxInFlight is refused before its body is read: a
// client that sends its headers and holds its body back gets its 503 at
// once, where a server that read first would wait BodyTimeout for the body
// and then close without an answer. The refusal closes the connection.
func TestBodiesAreReadOnlyOnceAdmitted(t *testing.T) {
	t.Parallel()
	const bodyTimeout = 3 * time.Second
	h := newBlocking()
	b := setup(t, httpserver.Config{Handler: h, MaxInFlight: 1, BodyTimeout: bodyTimeout})
	held := h.hold(t, client(t), b.url, 1)

	c := b.dial(t)
	start := time.Now()
	write(t, c, headers(10)) // and no body
	require.NoError(t, c.SetReadDeadline(time.Now().Add(bodyTimeout+time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err, "an answer before the body was sent")
	_ = resp.Body.Close()
	t.Logf("refused in %s", time.Since(start).Round(time.Microsecond))
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Less(t, time.Since(start), bodyTimeout/3, "answered without waiting for the body")
	require.True(t, resp.Close, "Connection: close, since the body was not read")

	h.free()
	require.Equal(t, http.StatusOK, <-held)
}

// With StreamBodies the handler reads the body as it arrives, under the
// body deadline: it sees the first bytes while the rest is still to come,
// and a body that stops coming is cut off after BodyTimeout.
func TestStreamBodies(t *testing.T) {
	t.Parallel()
	const bodyTimeout = 400 * time.Millisecond
	firstBytes := make(chan string, 1)
	readErr := make(chan error, 1)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 5)
		_, err := io.ReadFull(r.Body, buf)
		firstBytes <- string(buf)
		if err == nil {
			_, err = io.Copy(io.Discard, r.Body)
		}
		readErr <- err
	})
	b := setup(t, httpserver.Config{Handler: handler, StreamBodies: true, BodyTimeout: bodyTimeout})
	c := b.dial(t)
	start := time.Now()
	write(t, c, headers(100)+"first")
	select {
	case got := <-firstBytes:
		require.Equal(t, "first", got)
	case <-time.After(bodyTimeout / 2):
		t.Fatal("the handler did not get the body's first bytes while the rest was still to come")
	}
	select {
	case err := <-readErr:
		require.Error(t, err, "a body that stopped coming is an error to the handler")
		require.Less(t, time.Since(start), bodyTimeout+time.Second)
	case <-time.After(bodyTimeout + 2*time.Second):
		t.Fatal("a stalled streamed body was not cut off")
	}
	_, _ = heldFor(t, c, 3*time.Second) // and the connection is closed
}

// With StreamBodies, a handler that answers without reading the body
// (a refusal) to a client that stalls in it does not keep the connection
// (marked running, so neither evicted nor closed by the drain): net/http's
// reading of the unread body before the answer goes out is bounded by
// BodyTimeout too.
func TestStreamBodiesUnreadAndStalled(t *testing.T) {
	t.Parallel()
	const bodyTimeout = 300 * time.Millisecond
	handler := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "refused", http.StatusBadRequest)
	})
	b := setup(t, httpserver.Config{Handler: handler, StreamBodies: true, BodyTimeout: bodyTimeout})
	c := b.dial(t)
	write(t, c, "POST / HTTP/1.1\r\nHost: test\r\nContent-Length: 100\r\n\r\nfirst")
	held, reply := heldFor(t, c, bodyTimeout+3*time.Second)
	t.Logf("answered and closed in %s", held.Round(time.Millisecond))
	require.True(t, strings.HasPrefix(reply, "HTTP/1.1 400 "), "the refusal is answered: %q", reply)
}

// With StreamBodies, only the client's pace counts, not the handler's: a
// handler that reads the first bytes, then passes them on for longer than
// BodyTimeout before it reads on (a slow upstream), gets the whole body
// that the client sent at once.
func TestStreamBodiesAtTheHandlersPace(t *testing.T) {
	t.Parallel()
	const bodyTimeout = 300 * time.Millisecond
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		first := make([]byte, 5)
		if _, err := io.ReadFull(r.Body, first); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		pace(3 * bodyTimeout)
		rest, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		_, _ = fmt.Fprintf(w, "%s%d", first, len(rest))
	})
	b := setup(t, httpserver.Config{Handler: handler, StreamBodies: true, BodyTimeout: bodyTimeout})
	// More than net/http buffers with the headers: the rest is read from
	// the connection, after the pause.
	resp, err := client(t).Post(b.url, "text/plain", strings.NewReader("first"+strings.Repeat("x", 64<<10)))
	require.NoError(t, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", got)
	require.Equal(t, fmt.Sprintf("first%d", 64<<10), string(got))
}
