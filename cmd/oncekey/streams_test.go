package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// eventsUpstream is an upstream whose POST /completions streams events 1 to
// count (each with its id, flushed on its own, a millisecond apart), and
// waits at event pause+1 until release is closed (or its client goes
// away). done receives each run's last event.
type eventsUpstream struct {
	url     string
	runs    atomic.Int64
	release chan struct{}
	once    sync.Once
	done    chan int
}

// resume lets the waiting stream go on.
func (u *eventsUpstream) resume() { u.once.Do(func() { close(u.release) }) }

func startEventsUpstream(t *testing.T, count, pause int) *eventsUpstream {
	t.Helper()
	u := &eventsUpstream{release: make(chan struct{}), done: make(chan int, 4)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			_, _ = io.WriteString(w, "ok")
			return
		}
		u.runs.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		i := 1
		defer func() { u.done <- i - 1 }()
		for ; i <= count; i++ {
			if i == pause+1 {
				select {
				case <-u.release:
				case <-r.Context().Done():
					return
				}
			}
			if _, err := fmt.Fprintf(w, "id: %d\ndata: token %d\n\n", i, i); err != nil {
				return
			}
			_ = http.NewResponseController(w).Flush()
			pace(time.Millisecond) // a slow upstream, an event at a time
		}
	}))
	t.Cleanup(srv.Close)
	// Before the server closes: a test that fails early leaves no run
	// waiting.
	t.Cleanup(u.resume)
	u.url = srv.URL
	return u
}

// events is events from to to as eventsUpstream sends them.
func events(from, to int) string {
	var b strings.Builder
	for i := from; i <= to; i++ {
		fmt.Fprintf(&b, "id: %d\ndata: token %d\n\n", i, i)
	}
	return b.String()
}

// openEvents posts to the gateway at addr under scope and key, with
// Last-Event-ID if last is set.
func openEvents(t *testing.T, ctx context.Context, addr, scope, key, last string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/completions", strings.NewReader(`{"prompt":"hi"}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Account-Id", scope)
	req.Header.Set(idempotency.HeaderKey, key)
	if last != "" {
		req.Header.Set("Last-Event-ID", last)
	}
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	require.NoError(t, err)
	return resp
}

// readExactly reads len(want) bytes of r and requires them to be want.
func readExactly(t *testing.T, r io.Reader, want, what string) {
	t.Helper()
	got := make([]byte, len(want))
	_, err := io.ReadFull(r, got)
	require.NoError(t, err, what)
	require.Equal(t, want, string(got), what)
}

// streamProxies starts n gateways on one fresh database in front of u,
// with upstreamTimeout, covering POST /completions.
func streamProxies(t *testing.T, u *eventsUpstream, n int, upstreamTimeout time.Duration) []*serveProcess {
	t.Helper()
	url, _ := testdb.Fresh(t)
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	require.NoError(t, os.WriteFile(routes, []byte("routes:\n  - {method: POST, path: /completions}\n"), 0o600))
	var out []*serveProcess
	for range n {
		out = append(out, spawnProxy(t, map[string]string{"DATABASE_URL": url}, "--upstream", u.url, "--routes", routes,
			"--scope-header", "X-Account-Id", "--upstream-timeout", upstreamTimeout.String()))
	}
	return out
}

// TestProxyStreamsAreStoredAndFollowed: through two `oncekey proxy`
// replicas on PostgreSQL, in front of a slow upstream that streams 2,000
// events. A client killed halfway loses nothing: the stream goes on, and
// its retry gets all 2,000 events, once each, in order. The other replica,
// sent the key while the stream runs, follows it live from its first
// event to its last. With Last-Event-ID, a retry gets only the events
// after it. The upstream ran once.
func TestProxyStreamsAreStoredAndFollowed(t *testing.T) {
	t.Parallel()
	const count, half = 2000, 1000
	u := startEventsUpstream(t, count, half)
	gws := streamProxies(t, u, 2, 30*time.Second)
	a, b := gws[0].addr, gws[1].addr
	scope, key := "acct-"+uuid.NewString(), uuid.NewString()

	// The client reads half the stream through a, then is killed.
	ctx, kill := context.WithCancel(t.Context())
	first := openEvents(t, ctx, a, scope, key, "")
	require.Equal(t, http.StatusOK, first.StatusCode)
	readExactly(t, bufio.NewReader(first.Body), events(1, half), "the first half, through a")
	kill()
	_ = first.Body.Close()

	// The other replica, while the stream waits upstream: what is stored,
	// then the rest as it comes.
	follower := openEvents(t, t.Context(), b, scope, key, "")
	defer follower.Body.Close()
	require.Equal(t, http.StatusOK, follower.StatusCode)
	require.Equal(t, "true", follower.Header.Get(idempotency.HeaderReplayed))
	followed := bufio.NewReader(follower.Body)
	readExactly(t, followed, events(1, half), "b follows: what is stored so far")
	u.resume()
	rest, err := io.ReadAll(followed)
	require.NoError(t, err)
	require.Equal(t, events(half+1, count), string(rest), "b follows: the rest, live, to the end")
	require.Equal(t, count, <-u.done, "the upstream sent the whole stream, its client gone")

	for _, tc := range []struct {
		name, addr, last, want string
	}{
		{"the killed client's retry, through a", a, "", events(1, count)},
		{"through b", b, "", events(1, count)},
		{"Last-Event-ID 1500, through b", b, "1500", events(1501, count)},
	} {
		resp := openEvents(t, t.Context(), tc.addr, scope, key, tc.last)
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.NoError(t, err, tc.name)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", tc.name, body)
		require.Equal(t, "true", resp.Header.Get(idempotency.HeaderReplayed), tc.name)
		require.Equal(t, tc.want, string(body), "%s: every event once, in order", tc.name)
	}
	require.Equal(t, int64(1), u.runs.Load(), "the upstream ran once")
}

// TestProxyKilledMidStream: a gateway killed with -9 while its stream runs
// leaves the key held. A retry through another gateway follows what was
// stored; once the dead gateway's lease ends it breaks off, and from then
// on retries get 409 outcome-unknown. The upstream never runs twice.
func TestProxyKilledMidStream(t *testing.T) {
	t.Parallel()
	u := startEventsUpstream(t, 100, 10)
	gws := streamProxies(t, u, 2, time.Second) // a lease of 11 s
	dying, other := gws[0], gws[1]
	scope, key := "acct-"+uuid.NewString(), uuid.NewString()

	first := openEvents(t, t.Context(), dying.addr, scope, key, "")
	readExactly(t, bufio.NewReader(first.Body), events(1, 10), "the first ten events")
	dying.kill()
	_ = first.Body.Close()

	follower := openEvents(t, t.Context(), other.addr, scope, key, "")
	require.Equal(t, http.StatusOK, follower.StatusCode)
	body, err := io.ReadAll(follower.Body)
	_ = follower.Body.Close()
	require.Error(t, err, "the follower's answer breaks off once the lease ends, never ends as if whole")
	require.Equal(t, events(1, 10), string(body), "what was stored before the kill")

	resp := openEvents(t, t.Context(), other.addr, scope, key, "")
	problem, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusConflict, resp.StatusCode, "%s", problem)
	require.Contains(t, string(problem), idempotency.ProblemOf(idempotency.ErrOutcomeUnknown).Slug)
	require.Equal(t, int64(1), u.runs.Load(), "the upstream ran once")
}
