package idempotency_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
)

// eventsServer is a held operation on a fresh memstore, behind a real HTTP
// server, whose handler streams events 1 to count (each with its id,
// flushed on its own) in the line ending eol, and closes done when it
// has written the last.
func eventsServer(t *testing.T, count int, eol string) (*httptest.Server, *atomic.Int64, chan struct{}) {
	t.Helper()
	var runs atomic.Int64
	done := make(chan struct{})
	e := idempotency.New(idempotency.Config{
		Scope:           func(*http.Request) (string, error) { return "tenant", nil },
		Wait:            50 * time.Millisecond,
		ProblemTypeBase: "https://example.com/problems/",
	})
	op := idempotency.NewOperation(e, memstore.New(), idempotency.OperationConfig{Name: "completions", Held: &idempotency.HeldConfig{}})
	srv := httptest.NewServer(op.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		runs.Add(1)
		defer close(done)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 1; i <= count; i++ {
			fmt.Fprintf(w, "id: %d%sdata: token %d%s%s", i, eol, i, eol, eol)
			_ = http.NewResponseController(w).Flush()
		}
	})))
	t.Cleanup(srv.Close)
	return srv, &runs, done
}

// streamOf is events from to count, each as eventsServer writes it.
func streamOf(from, count int, eol string) string {
	var b strings.Builder
	for i := from; i <= count; i++ {
		fmt.Fprintf(&b, "id: %d%sdata: token %d%s%s", i, eol, i, eol, eol)
	}
	return b.String()
}

// openStream posts to srv under key, with Last-Event-ID if last is set.
func openStream(t *testing.T, ctx context.Context, srv *httptest.Server, key, last string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/completions", strings.NewReader(`{"prompt":"hi"}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idempotency.HeaderKey, key)
	if last != "" {
		req.Header.Set("Last-Event-ID", last)
	}
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	return resp
}

// TestStreamsAreStoredAndReplayed: a held operation's event stream is
// stored event by event as it passes. A client that goes away halfway
// loses nothing: the operation goes on, and the retry with its key gets
// the whole stream, byte for byte, and the operation ran once. With
// Last-Event-ID, the retry resumes after that event; with an id the
// stream does not have, it gets the whole stream.
func TestStreamsAreStoredAndReplayed(t *testing.T) {
	t.Parallel()
	for _, eol := range []string{"\n", "\r\n", "\r"} {
		t.Run(fmt.Sprintf("%q", eol), func(t *testing.T) {
			t.Parallel()
			const count = 2000
			srv, runs, done := eventsServer(t, count, eol)

			// The client reads half the stream, then goes away.
			ctx, cancel := context.WithCancel(t.Context())
			resp := openStream(t, ctx, srv, "k1", "")
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
			half := streamOf(1, count/2, eol)
			got := make([]byte, len(half))
			_, err := io.ReadFull(bufio.NewReader(resp.Body), got)
			require.NoError(t, err)
			require.Equal(t, half, string(got), "the first half, as it came")
			cancel()
			_ = resp.Body.Close()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("the operation did not finish its stream once its client left")
			}

			whole := streamOf(1, count, eol)
			for _, tc := range []struct{ name, last, want string }{
				{"no Last-Event-ID: the whole stream", "", whole},
				{"Last-Event-ID 1000: the events after it", "1000", streamOf(1001, count, eol)},
				{"the last event's id: nothing more", "2000", ""},
				{"an id the stream does not have: the whole stream", "abc", whole},
			} {
				// The settle follows the handler's last write: a retry
				// just after it may still find the key running.
				var retry *http.Response
				require.Eventually(t, func() bool {
					retry = openStream(t, t.Context(), srv, "k1", tc.last)
					if retry.StatusCode == http.StatusOK {
						return true
					}
					_ = retry.Body.Close()
					return false
				}, 10*time.Second, 10*time.Millisecond, "%s: the retry is answered from the stored stream", tc.name)
				body, err := io.ReadAll(retry.Body)
				_ = retry.Body.Close()
				require.NoError(t, err, tc.name)
				require.Equal(t, "true", retry.Header.Get(idempotency.HeaderReplayed), tc.name)
				require.Equal(t, "text/event-stream", retry.Header.Get("Content-Type"), tc.name)
				require.Equal(t, int64(len(tc.want)), retry.ContentLength, tc.name)
				require.Equal(t, tc.want, string(body), tc.name)
			}
			require.Equal(t, int64(1), runs.Load(), "the operation ran once")
		})
	}
}

// TestRunningStreamsAreFollowed: a request whose key's stream is still
// running, on the same process or another on the same store, gets what
// is stored so far and then each event as it is stored, to the end; with
// Last-Event-ID it resumes after that event. The operation ran once.
func TestRunningStreamsAreFollowed(t *testing.T) {
	t.Parallel()
	const count, paused = 1000, 500
	store := memstore.New()
	var runs atomic.Int64
	release := make(chan struct{})
	server := func() *httptest.Server {
		e := idempotency.New(idempotency.Config{
			Scope:           func(*http.Request) (string, error) { return "tenant", nil },
			Wait:            50 * time.Millisecond,
			ProblemTypeBase: "https://example.com/problems/",
		})
		op := idempotency.NewOperation(e, store, idempotency.OperationConfig{Name: "completions", Held: &idempotency.HeldConfig{}})
		srv := httptest.NewServer(op.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			runs.Add(1)
			w.Header().Set("Content-Type", "text/event-stream")
			for i := 1; i <= count; i++ {
				if i == paused+1 {
					<-release
				}
				fmt.Fprintf(w, "id: %d\ndata: token %d\n\n", i, i)
				_ = http.NewResponseController(w).Flush()
			}
		})))
		t.Cleanup(srv.Close)
		return srv
	}
	one, other := server(), server()
	// Run before the servers close (cleanups run last first): a test that
	// fails before the release does not leave the operation waiting.
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })

	first := openStream(t, t.Context(), one, "k1", "")
	defer first.Body.Close()
	firstBody := bufio.NewReader(first.Body)
	readStream := func(r io.Reader, want string, what string) {
		t.Helper()
		got := make([]byte, len(want))
		_, err := io.ReadFull(r, got)
		require.NoError(t, err, what)
		require.Equal(t, want, string(got), what)
	}
	readStream(firstBody, streamOf(1, paused, "\n"), "the first request's events before the pause")

	followers := []struct {
		name, last, from string
		srv              *httptest.Server
		start            int
	}{
		{name: "another process", srv: other, start: 1},
		{name: "the same process", srv: one, start: 1},
		{name: "another process, Last-Event-ID 300", srv: other, last: "300", start: 301},
	}
	bodies := make([]*bufio.Reader, len(followers))
	for i, f := range followers {
		resp := openStream(t, t.Context(), f.srv, "k1", f.last)
		t.Cleanup(func() { _ = resp.Body.Close() })
		require.Equal(t, http.StatusOK, resp.StatusCode, f.name)
		require.Equal(t, "true", resp.Header.Get(idempotency.HeaderReplayed), f.name)
		require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"), f.name)
		bodies[i] = bufio.NewReader(resp.Body)
		readStream(bodies[i], streamOf(f.start, paused, "\n"), f.name+": what is stored so far")
	}
	releaseOnce.Do(func() { close(release) })
	readStream(firstBody, streamOf(paused+1, count, "\n"), "the first request's events after the pause")
	for i, f := range followers {
		rest, err := io.ReadAll(bodies[i])
		require.NoError(t, err, f.name)
		require.Equal(t, streamOf(paused+1, count, "\n"), string(rest), f.name+": the rest, live, to its end")
	}
	require.Equal(t, int64(1), runs.Load(), "the operation ran once")
}

// TestQuietStreamsKeepTheirLease: a stream that passes for longer than its
// lease (here quiet for three leases between two events) keeps its key
// held, its holder renewing the lease: a request on another process
// follows it rather than taking its operation for one whose holder died,
// and gets it to its end. The operation ran once.
func TestQuietStreamsKeepTheirLease(t *testing.T) {
	t.Parallel()
	const lease = 300 * time.Millisecond
	store := memstore.New()
	var runs atomic.Int64
	release := make(chan struct{})
	var releaseOnce sync.Once
	server := func() *httptest.Server {
		e := idempotency.New(idempotency.Config{
			Scope:           func(*http.Request) (string, error) { return "tenant", nil },
			Wait:            50 * time.Millisecond,
			ProblemTypeBase: "https://example.com/problems/",
		})
		op := idempotency.NewOperation(e, store, idempotency.OperationConfig{Name: "completions", Held: &idempotency.HeldConfig{Lease: lease}})
		srv := httptest.NewServer(op.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			runs.Add(1)
			w.Header().Set("Content-Type", "text/event-stream")
			for i := 1; i <= 20; i++ {
				if i == 11 {
					<-release
				}
				fmt.Fprintf(w, "id: %d\ndata: token %d\n\n", i, i)
				_ = http.NewResponseController(w).Flush()
			}
		})))
		t.Cleanup(srv.Close)
		return srv
	}
	one, other := server(), server()
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })

	first := openStream(t, t.Context(), one, "k1", "")
	defer first.Body.Close()
	got := make([]byte, len(streamOf(1, 10, "\n")))
	_, err := io.ReadFull(first.Body, got)
	require.NoError(t, err)
	<-time.After(3 * lease) // pacing: the stream is quiet for three leases

	follower := openStream(t, t.Context(), other, "k1", "")
	defer follower.Body.Close()
	body := bufio.NewReader(follower.Body)
	require.Equal(t, http.StatusOK, follower.StatusCode, "the key is still held by a live holder: followed, not of unknown outcome")
	head := make([]byte, len(streamOf(1, 10, "\n")))
	_, err = io.ReadFull(body, head)
	require.NoError(t, err)
	require.Equal(t, streamOf(1, 10, "\n"), string(head))
	releaseOnce.Do(func() { close(release) })
	rest, err := io.ReadAll(body)
	require.NoError(t, err, "followed to its end")
	require.Equal(t, streamOf(11, 20, "\n"), string(rest))
	require.Equal(t, int64(1), runs.Load(), "the operation ran once")
}
