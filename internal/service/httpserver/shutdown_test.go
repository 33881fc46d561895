package httpserver_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/httpserver"
)

// patient has timeouts long enough that only the shutdown closes a
// connection within a test.
var patient = httpserver.Config{
	ReadHeaderTimeout: 10 * time.Second,
	BodyTimeout:       10 * time.Second,
	IdleTimeout:       10 * time.Second,
	ShutdownTimeout:   3 * time.Second,
}

// Shutdown does not wait for clients that are not sending: idle
// connections and stalled headers are closed at once, a stalled body as
// soon as it has brought nothing for 250 ms. (http.Server.Shutdown alone
// waits for the stalled body and the stalled headers until its timeout.)
func TestShutdownClosesIdleAndStalledConnections(t *testing.T) {
	t.Parallel()
	b := setup(t, patient)
	stalledHeaders := b.dial(t)
	write(t, stalledHeaders, "POST / HTTP/1.1\r\nHost: test\r\n")
	stalledBody := b.dial(t)
	stallInBody(t, stalledBody)
	idle := b.dial(t)
	require.Equal(t, http.StatusOK, roundTrip(t, idle, bufio.NewReader(idle), http.MethodGet, "").StatusCode)

	took, err := b.shutdown(t)
	t.Logf("shutdown took %s", took)
	require.NoError(t, err)
	require.Less(t, took, 500*time.Millisecond)
	for _, c := range []struct {
		name string
		conn net.Conn
	}{{"stalled in its headers", stalledHeaders}, {"stalled in its body", stalledBody}, {"idle", idle}} {
		// Serve has returned: each is closed already.
		held, _ := heldFor(t, c.conn, time.Second)
		require.Less(t, held, 50*time.Millisecond, "%s: still open after the shutdown", c.name)
	}
}

// A body still arriving when shutdown starts is read to its end and its
// request runs; a client that stops sending midway is cut off 250 ms after
// its last bytes.
func TestShutdownWithABodyArriving(t *testing.T) {
	t.Parallel()
	const body = "abcdefghijabcdefghijabcdefghijabcdefghijabcdefghij"
	for _, tc := range []struct {
		name   string
		pieces int // of ten bytes, 100 ms apart, after shutdown starts
	}{
		// Half a second of upload, twice what a stalled body gets, with no
		// pause as long: served.
		{name: "sends it to the end", pieces: 5},
		{name: "stops midway", pieces: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := patient
			cfg.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				got, _ := io.ReadAll(r.Body)
				_, _ = io.WriteString(w, strings.ToUpper(string(got)))
			})
			shuttingDown := make(chan struct{})
			cfg.Logger = slog.New(onMessage{prefix: "shutting down:", seen: shuttingDown, once: new(sync.Once)})
			b := setup(t, cfg)
			c := b.dial(t)
			write(t, c, fmt.Sprintf("POST / HTTP/1.1\r\nHost: test\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", len(body)))
			br := bufio.NewReader(c)
			require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
			cont, err := http.ReadResponse(br, nil)
			require.NoError(t, err)
			require.Equal(t, http.StatusContinue, cont.StatusCode)

			type shutdownResult struct {
				took time.Duration
				err  error
			}
			shutDown := make(chan shutdownResult, 1)
			go func() {
				took, err := b.shutdown(t)
				shutDown <- shutdownResult{took, err}
			}()
			// The pieces must arrive while the server shuts down: sent
			// before Serve has begun, they would test a plain upload.
			select {
			case <-shuttingDown:
			case <-time.After(10 * time.Second):
				t.Fatal("Serve did not begin to shut down within 10s of its context ending")
			}
			for i := range tc.pieces {
				pace(100 * time.Millisecond) // the upload's pace, not a wait for anything
				write(t, c, body[i*10:(i+1)*10])
			}

			if tc.pieces*10 == len(body) {
				resp, err := http.ReadResponse(br, nil)
				require.NoError(t, err)
				got, err := io.ReadAll(resp.Body)
				require.NoError(t, err)
				require.Equal(t, http.StatusOK, resp.StatusCode)
				require.Equal(t, strings.ToUpper(body), string(got))
			} else {
				held, reply := heldFor(t, c, 2*time.Second)
				t.Logf("closed %s after its last bytes", held.Round(time.Millisecond))
				require.Empty(t, reply)
				require.InDelta(t, 250*time.Millisecond, held, float64(150*time.Millisecond))
			}
			s := <-shutDown
			t.Logf("shutdown took %s", s.took.Round(time.Millisecond))
			require.NoError(t, s.err)
		})
	}
}

// A request running when shutdown starts finishes, and its client gets the
// whole response, while a stalled connection beside it is closed at once
// and new clients are refused.
func TestShutdownLetsRunningRequestsFinish(t *testing.T) {
	t.Parallel()
	entered, release := make(chan struct{}), make(chan struct{})
	reply := strings.Repeat("r", 256<<10) // more than a socket buffer holds
	cfg := patient
	cfg.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		if err := r.Context().Err(); err != nil {
			http.Error(w, "the shutdown cancelled the request: "+err.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, reply)
	})
	b := setup(t, cfg)

	type result struct {
		status int
		body   string
		err    error
	}
	answered := make(chan result, 1)
	hc := client(t)
	go func() {
		resp, err := hc.Post(b.url, "application/json", strings.NewReader(`{"items":[]}`))
		if err != nil {
			answered <- result{err: err}
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		answered <- result{resp.StatusCode, string(body), err}
	}()
	<-entered
	stalled := b.dial(t)
	stallInBody(t, stalled)

	type shutdownResult struct {
		took time.Duration
		err  error
	}
	shutDown := make(chan shutdownResult, 1)
	go func() {
		took, err := b.shutdown(t)
		shutDown <- shutdownResult{took, err}
	}()

	held, _ := heldFor(t, stalled, time.Second)
	require.Less(t, held, 500*time.Millisecond, "the stalled connection is closed, the running request still going")
	// The listener closes a moment after the drain; until then a new
	// connection is accepted and closed at once.
	if c, err := net.DialTimeout("tcp", b.addr, time.Second); err == nil {
		held, _ := heldFor(t, c, time.Second)
		require.Less(t, held, 100*time.Millisecond, "a new client is refused")
		_ = c.Close()
	}
	select {
	case s := <-shutDown:
		t.Fatalf("Serve returned %v while a request was still running", s.err)
	case <-time.After(200 * time.Millisecond):
	}

	close(release)
	got := <-answered
	require.NoError(t, got.err)
	require.Equal(t, http.StatusOK, got.status, got.body)
	require.Equal(t, len(reply), len(got.body))
	s := <-shutDown
	t.Logf("shutdown took %s, waiting for the running request", s.took)
	require.NoError(t, s.err)
}

// A request still running after ShutdownTimeout is cut off: its context is
// cancelled, and Serve says so.
func TestShutdownCutsOffRequestsPastTheTimeout(t *testing.T) {
	t.Parallel()
	entered, cancelled := make(chan struct{}), make(chan struct{})
	cfg := patient
	cfg.ShutdownTimeout = 300 * time.Millisecond
	cfg.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-r.Context().Done()
		close(cancelled)
	})
	b := setup(t, cfg)
	failed := make(chan error, 1)
	hc := client(t)
	go func() {
		resp, err := hc.Post(b.url, "application/json", bytes.NewReader([]byte(`{}`)))
		if err == nil {
			resp.Body.Close()
		}
		failed <- err
	}()
	<-entered

	took, err := b.shutdown(t)
	t.Logf("shutdown took %s", took)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.InDelta(t, cfg.ShutdownTimeout, took, float64(300*time.Millisecond))
	select {
	case <-cancelled:
	case <-time.After(time.Second):
		t.Fatal("the request's context was not cancelled")
	}
	require.Error(t, <-failed, "the client gets no response")
}

// onMessage is a slog.Handler that closes seen on the first record whose
// message starts with prefix, for a test to wait on what the server says
// it is doing; it keeps nothing.
type onMessage struct {
	prefix string
	seen   chan struct{}
	once   *sync.Once
}

func (h onMessage) Enabled(context.Context, slog.Level) bool { return true }

func (h onMessage) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, h.prefix) {
		h.once.Do(func() { close(h.seen) })
	}
	return nil
}

func (h onMessage) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h onMessage) WithGroup(string) slog.Handler      { return h }
