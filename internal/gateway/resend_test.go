package gateway_test

import (
	"bufio"
	"crypto/rand"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/gateway"
	"github.com/oncekey/oncekey/internal/gateway/keyscope"
)

// dyingUpstream answers the first request on each connection and keeps the
// connection open. A later request on that connection it reads in full,
// then closes the connection without a byte of answer: an upstream that
// died while running it. That is the failure after which net/http's
// transport resends a request it takes for idempotent, on a new connection.
type dyingUpstream struct {
	url string

	mu   sync.Mutex
	seen map[string][]int // Idempotency-Key → each time it came, its place on its connection (0: first)
}

func startDyingUpstream(t *testing.T) *dyingUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	u := &dyingUpstream{url: "http://" + ln.Addr().String(), seen: map[string][]int{}}
	var conns sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		conns.Wait()
	})
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Go(func() { u.serve(conn) })
		}
	}()
	return u
}

func (u *dyingUpstream) serve(conn net.Conn) {
	defer conn.Close()
	br := bufio.NewReader(conn)
	for place := 0; ; place++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		u.mu.Lock()
		key := req.Header.Get(idempotency.HeaderKey)
		u.seen[key] = append(u.seen[key], place)
		u.mu.Unlock()
		if place > 0 {
			return
		}
		if _, err := io.WriteString(conn, "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"); err != nil {
			return
		}
	}
}

// came is each time a request under key reached the upstream: its place on
// its connection.
func (u *dyingUpstream) came(key string) []int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]int(nil), u.seen[key]...)
}

// TestForwardedRequestIsNeverResent drives net/http's transport into the
// case where it resends a request: a kept-alive connection that the
// upstream closes after reading the request, before a byte of answer
// (persistConn.shouldRetryRequest). It does so for a request it takes for
// idempotent: one without a body (or one it can rewind) that carries
// Idempotency-Key or X-Idempotency-Key under its canonical name
// (Request.isReplayable). The gateway's request must reach the upstream
// once, and its client learn that the outcome is unknown.
func TestForwardedRequestIsNeverResent(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		header func(key string) []string // beside Idempotency-Key
	}{
		{"Idempotency-Key", func(string) []string { return nil }},
		{"X-Idempotency-Key", func(key string) []string { return []string{"X-Idempotency-Key", key} }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			up := startDyingUpstream(t)
			gw := httptest.NewServer(stores[0].open(t)(gateway.Config{Upstream: mustURL(t, up.url),
				Routes: []gateway.Route{{Method: "POST", Path: "/echo"}}, Scope: keyscope.Header("X-Account-Id")}))
			t.Cleanup(gw.Close)
			c := client{t, gw.URL, "acct-" + rand.Text()}
			resp, body := c.post("/echo", uuid.NewString(), "")
			require.Equal(t, http.StatusCreated, resp.StatusCode, "the first request opens the connection the gateway keeps: %s", body)
			// The gateway's transport puts a connection back in its pool
			// just after reading the answer; a request sent before that
			// goes on a new connection, which the upstream answers. Such a
			// request is sent again, under a new key, until one goes on a
			// connection already used.
			for range 20 {
				key := uuid.NewString()
				resp, body := c.post("/echo", key, "", tc.header(key)...)
				came := up.came(key)
				require.NotEmpty(t, came, "the request reached the upstream")
				if came[0] == 0 {
					require.Equal(t, http.StatusCreated, resp.StatusCode, body)
					continue
				}
				require.Equal(t, []int{came[0]}, came, "the upstream got the request once (each time: its place on its connection)")
				require.Equal(t, http.StatusConflict, resp.StatusCode, body)
				require.Equal(t, idempotency.ProblemOf(idempotency.ErrOutcomeUnknown).Slug, problemType(t, body))
				return
			}
			t.Fatal("no request went on a connection the gateway had used before")
		})
	}
}
