package caddymodule_test

import (
	"bufio"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore/pgstoretest"
)

// docCaddyfile is the Caddyfile docs/gateway.md shows under
// <!-- caddy-test: name -->.
func docCaddyfile(t *testing.T, name string) string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "gateway.md"))
	require.NoError(t, err)
	m := regexp.MustCompile("(?s)<!-- caddy-test: " + name + " -->\\s*```caddyfile\\n(.*?)```").FindSubmatch(doc)
	require.NotNil(t, m, "docs/gateway.md shows the %s Caddyfile", name)
	return string(m[1])
}

// lenientUpstream reads paths as the most forgiving upstream framework
// would (escapes decoded, %2F too; a NUL ends the path; "\" is "/"; ";"
// parameters dropped; case ignored; dot segments resolved, slashes
// merged), and counts per key the POSTs it reads as /transfers. The twin
// of cmd/oncekey's, for the proxy: a test of another module.
type lenientUpstream struct {
	mu   sync.Mutex
	runs map[string]int
	addr string
}

func startLenientUpstream(t *testing.T, name string) *lenientUpstream {
	t.Helper()
	u := &lenientUpstream{runs: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		key := r.Header.Get(idempotency.HeaderKey)
		if r.Method == http.MethodPost && leniently(r.RequestURI) == "/transfers" {
			u.mu.Lock()
			u.runs[key]++
			u.mu.Unlock()
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"upstream":%q,"key":%q}`, name, key)
	}))
	t.Cleanup(srv.Close)
	u.addr = strings.TrimPrefix(srv.URL, "http://")
	return u
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

// rawPost sends POST target to addr byte for byte (HTTP clients clean
// paths), as scope under key, and returns the status, Idempotent-Replayed
// and the body.
func rawPost(t *testing.T, addr, target, scope, key string) (int, string, string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))
	body := `{"amount":500,"currency":"EUR"}`
	_, err = fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nX-Account-Id: %s\r\nIdempotency-Key: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		target, addr, scope, key, len(body), body)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err, "POST %s", target)
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header.Get(idempotency.HeaderReplayed), string(answer)
}

// TestCaddyDocsCaddyfiles runs the Caddyfiles docs/gateway.md shows (keys
// in memory, and in PostgreSQL under a namespace), each a site in front of
// an upstream that reads paths as leniently as any framework, with every
// spelling of internal/gateway/testdata/paths.txt sent twice under one
// key: the ambiguous ones are refused (400) and never reach the upstream,
// the others run once and are replayed; no spelling the upstream reads as
// the covered path runs twice. A second PostgreSQL site, under another
// namespace in front of another upstream, shares the database: the same
// (scope, key) pairs sent to both are never replayed across.
func TestCaddyDocsCaddyfiles(t *testing.T) {
	t.Parallel()
	bin := buildCaddy(t)
	dbURL := pgstoretest.URL(t)
	up, other := startLenientUpstream(t, "payments"), startLenientUpstream(t, "ledger")
	addrs := freeAddrs(t, 3)
	memory, postgres, ledger := addrs[0], addrs[1], addrs[2]
	site := func(addr, caddyfile string, replace ...string) string {
		return fmt.Sprintf("http://%s {\n%s}\n", addr, strings.NewReplacer(replace...).Replace(caddyfile))
	}
	pg := docCaddyfile(t, "postgres")
	dbLine := regexp.MustCompile(`(?m)^(\s*database_url\s+)\S+$`)
	pg = dbLine.ReplaceAllString(pg, "${1}"+strings.ReplaceAll(fmt.Sprintf("%q", dbURL), "$", "$$"))
	startCaddy(t, bin, "{\n\tadmin off\n\tauto_https off\n}\n"+
		site(memory, docCaddyfile(t, "memory"), "127.0.0.1:3000", up.addr)+
		site(postgres, pg, "127.0.0.1:3000", up.addr)+
		site(ledger, pg, "127.0.0.1:3000", other.addr, "payments-api", "ledger-api"),
		memory, postgres, ledger)

	raw, err := os.ReadFile(filepath.Join("..", "..", "internal", "gateway", "testdata", "paths.txt"))
	require.NoError(t, err)
	for _, addr := range []string{memory, postgres} {
		for line := range strings.Lines(string(raw)) {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			class, target, _ := strings.Cut(line, " ")
			key := rand.Text()
			first, _, body := rawPost(t, addr, target, "acme", key)
			again, replayed, _ := rawPost(t, addr, target, "acme", key)
			switch class {
			case "ambiguous":
				require.Equal(t, []int{http.StatusBadRequest, http.StatusBadRequest}, []int{first, again}, "POST %s is refused: %s", target, body)
				require.Contains(t, body, "The request's path is ambiguous", "the problem of the module's own")
				require.Zero(t, up.ran(key), "POST %s never reaches the upstream", target)
			case "covered", "uncovered":
				// The site covers every unsafe request.
				require.Equal(t, []int{http.StatusCreated, http.StatusCreated}, []int{first, again}, "POST %s: %s", target, body)
				require.Equal(t, "true", replayed, "POST %s is covered: its retry is replayed", target)
				require.LessOrEqual(t, up.ran(key), 1, "POST %s ran at most once", target)
			default:
				t.Fatalf("unknown class %q of %s", class, target)
			}
		}
	}

	for i := range 50 {
		scope, key := fmt.Sprintf("acct-%d", i%7), rand.Text()
		for _, s := range []struct {
			addr string
			up   *lenientUpstream
			name string
		}{{postgres, up, "payments"}, {ledger, other, "ledger"}, {postgres, up, "payments"}} {
			status, _, body := rawPost(t, s.addr, "/transfers", scope, key)
			require.Equal(t, http.StatusCreated, status, body)
			require.Equal(t, fmt.Sprintf(`{"upstream":%q,"key":%q}`, s.name, key), body, "no site replays another upstream's answer")
			require.Equal(t, 1, s.up.ran(key), "%s ran %s once", s.name, key)
		}
	}
}
