package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/redisstore/redistest"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// lenientUpstream reads paths as the most forgiving upstream framework
// would: escapes decoded (%2F too), a NUL ending the path, "\" as "/",
// ";" parameters dropped, case ignored, dot segments resolved and slashes
// merged; a method in any case. It counts, per Idempotency-Key, the
// requests it reads as POST /transfers: the runs of the covered operation.
type lenientUpstream struct {
	mu   sync.Mutex
	runs map[string]int
}

func startLenientUpstream(t *testing.T) (*lenientUpstream, string) {
	t.Helper()
	u := &lenientUpstream{runs: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if strings.EqualFold(r.Method, http.MethodPost) && leniently(r.RequestURI) == "/transfers" {
			u.mu.Lock()
			u.runs[r.Header.Get(idempotency.HeaderKey)]++
			u.mu.Unlock()
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"t1"}`)
	}))
	t.Cleanup(srv.Close)
	return u, srv.URL
}

func leniently(target string) string {
	p, _, _ := strings.Cut(target, "?")
	if d, err := url.PathUnescape(p); err == nil {
		p = d
	}
	p, _, _ = strings.Cut(p, "\x00")
	segments := strings.Split(strings.ReplaceAll(p, `\`, "/"), "/")
	for i, s := range segments {
		segments[i], _, _ = strings.Cut(s, ";")
	}
	return strings.TrimSuffix(path.Clean("/"+strings.ToLower(strings.Join(segments, "/"))), "/")
}

func (u *lenientUpstream) ran(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.runs[key]
}

// pathSpelling is a line of internal/gateway/testdata/paths.txt.
type pathSpelling struct{ class, target string }

func readPathSpellings(t *testing.T, file string) []pathSpelling {
	t.Helper()
	raw, err := os.ReadFile(file)
	require.NoError(t, err)
	var out []pathSpelling
	for line := range strings.Lines(string(raw)) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		class, target, ok := strings.Cut(line, " ")
		require.True(t, ok, "a spelling line: %q", line)
		out = append(out, pathSpelling{class, target})
	}
	return out
}

// rawPost sends POST target to addr byte for byte, as no HTTP client
// would (they clean paths), and returns the status and the
// Idempotent-Replayed header.
func rawPost(t *testing.T, addr, target, key string) (int, string) {
	t.Helper()
	return rawRequest(t, addr, http.MethodPost, target, key)
}

// rawRequest is rawPost with another method, spelled as given.
func rawRequest(t *testing.T, addr, method, target, key string) (int, string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))
	body := `{"amount":500,"currency":"EUR"}`
	_, err = fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nX-Account-Id: acme\r\nIdempotency-Key: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		method, target, addr, key, len(body), body)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err, "%s %s", method, target)
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get(idempotency.HeaderReplayed)
}

// TestProxyPathSpellings: every spelling of a covered path, sent twice
// under one key through oncekey proxy (keys in memory, in PostgreSQL, and
// in PostgreSQL with Redis in front) to an upstream that reads paths as
// leniently as any framework: the ambiguous ones are refused (400) and
// never reach it, the others run under the protocol (once, then
// replayed), and no spelling it reads as the covered path runs twice.
func TestProxyPathSpellings(t *testing.T) {
	t.Parallel()
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	require.NoError(t, os.WriteFile(routes, []byte("routes:\n  - method: POST\n    path: /transfers\n"), 0o600))
	spellings := readPathSpellings(t, filepath.Join("..", "..", "internal", "gateway", "testdata", "paths.txt"))
	for _, tc := range []struct {
		name string
		env  func(t *testing.T) map[string]string
	}{
		{"memory", func(*testing.T) map[string]string { return map[string]string{} }},
		{"postgres", func(t *testing.T) map[string]string {
			url, _ := testdb.Fresh(t)
			return map[string]string{"DATABASE_URL": url}
		}},
		{"postgres and redis", func(t *testing.T) map[string]string {
			url, _ := testdb.Fresh(t)
			return map[string]string{"DATABASE_URL": url, "REDIS_URL": redistest.SharedURL()}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			up, upURL := startLenientUpstream(t)
			addr, _ := startCommand(t, tc.env(t), "proxy", "--upstream", upURL, "--routes", routes, "--scope-header", "X-Account-Id")
			for _, s := range spellings {
				key := uuid.NewString()
				first, _ := rawPost(t, addr, s.target, key)
				again, replayed := rawPost(t, addr, s.target, key)
				switch s.class {
				case "ambiguous":
					require.Equal(t, []int{http.StatusBadRequest, http.StatusBadRequest}, []int{first, again}, "POST %s is refused", s.target)
					require.Zero(t, up.ran(key), "POST %s never reaches the upstream", s.target)
				case "covered":
					require.Equal(t, []int{http.StatusCreated, http.StatusCreated}, []int{first, again}, "POST %s", s.target)
					require.Equal(t, "true", replayed, "POST %s is covered: its retry is replayed", s.target)
					require.Equal(t, 1, up.ran(key), "POST %s ran once", s.target)
				case "uncovered":
					require.Zero(t, up.ran(key), "POST %s is not the covered path, even leniently read", s.target)
				default:
					t.Fatalf("unknown class %q of %s", s.class, s.target)
				}
			}
			// A method in another case is the covered one too.
			key := uuid.NewString()
			first, _ := rawRequest(t, addr, "post", "/transfers", key)
			again, replayed := rawRequest(t, addr, "post", "/transfers", key)
			require.Equal(t, []int{http.StatusCreated, http.StatusCreated}, []int{first, again}, "post /transfers")
			require.Equal(t, "true", replayed, "post /transfers is covered")
			require.Equal(t, 1, up.ran(key), "post /transfers ran once")
		})
	}
}
