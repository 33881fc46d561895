package httpserver_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/httpserver"
)

// patient has timeouts long enough that only the shutdown closes a
// connection within a test.
var patient = httpserver.Config{
	ReadHeaderTimeout: 10 * time.Second,
	BodyTimeout:       10 * time.Second,
	IdleTimeout:       10 * time.Second,
	ShutdownTimeout:   3 * time.Second,
}

// Connections with no request running are closed at once: shutdown does not
// wait for a stalled client. (http.Server.Shutdown alone waits for the
// stalled body and the stalled headers until its timeout.)
func TestShutdownClosesConnectionsWithNothingRunning(t *testing.T) {
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
	for name, c := range map[string]net.Conn{"stalled in its headers": stalledHeaders, "stalled in its body": stalledBody, "idle": idle} {
		held, _ := heldFor(t, c, time.Second)
		require.Less(t, held, 100*time.Millisecond, "%s: still open after the shutdown", name)
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
	require.Less(t, held, 100*time.Millisecond, "the stalled connection is closed at once")
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
