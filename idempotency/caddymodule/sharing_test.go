package caddymodule_test

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore/pgstoretest"
)

// countingUpstream answers every request 201 with a fresh id, as JSON:
// gzipped when the request asks for gzip, and on /deflate always
// deflated (Content-Encoding: deflate, which no transport decodes for
// its caller). It counts the requests it ran.
type countingUpstream struct {
	*httptest.Server
	runs atomic.Int64
}

func startCountingUpstream(t *testing.T) *countingUpstream {
	t.Helper()
	u := &countingUpstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		u.runs.Add(1)
		body := fmt.Appendf(nil, `{"id":%q}`, rand.Text())
		w.Header().Set("Content-Type", "application/json")
		var zw io.WriteCloser
		switch {
		case r.URL.Path == "/deflate":
			w.Header().Set("Content-Encoding", "deflate")
			zw, _ = flate.NewWriter(w, flate.BestSpeed)
		case strings.Contains(r.Header.Get("Accept-Encoding"), "gzip"):
			w.Header().Set("Content-Encoding", "gzip")
			zw = gzip.NewWriter(w)
		}
		w.WriteHeader(http.StatusCreated)
		if zw == nil {
			_, _ = w.Write(body)
			return
		}
		_, _ = zw.Write(body)
		_ = zw.Close()
	}))
	t.Cleanup(u.Close)
	return u
}

// send posts body to addr+path with header (a value per line: two
// X-User lines are two headers), through a client that neither asks for
// gzip nor decodes it: the answer arrives as Caddy sends it.
func send(t *testing.T, addr, path string, header http.Header) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+path, strings.NewReader(`{"amount":500}`))
	require.NoError(t, err)
	req.Header = header.Clone()
	req.Header.Set("Content-Type", "application/json")
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DisableCompression: true}, Timeout: 30 * time.Second}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, body
}

// TestCaddyNeverSharesAScope: with scope "user:{…X-User}", the findings
// of the third review (#55) against a real Caddy and PostgreSQL. A
// request without the header, with it twice (Caddy joins them as
// "bob,alice"), with a placeholder Caddy does not know, or whose scope
// with its namespace is over 255 bytes is refused 401 problem+json: the
// upstream does not run, no key is stored, and no answer says retrying is
// safe. Two anonymous callers sending the same key and body never get
// each other's answer.
func TestCaddyNeverSharesAScope(t *testing.T) {
	t.Parallel()
	bin := buildCaddy(t)
	up := startCountingUpstream(t)
	dbURL, pool := pgstoretest.URL(t), pgstoretest.Pool(t)
	addrs := freeAddrs(t, 2)
	users, typo := addrs[0], addrs[1]
	site := func(addr, scope string) string {
		return fmt.Sprintf("http://%s {\n\tidempotency {\n\t\tscope %q\n\t\tdatabase_url %q\n\t\tnamespace shop\n\t\tproblem_type_base https://example.com/problems/\n\t}\n\treverse_proxy %s\n}\n",
			addr, scope, dbURL, strings.TrimPrefix(up.URL, "http://"))
	}
	logs := startCaddy(t, bin, "{\n\tadmin off\n\tauto_https off\n}\n"+
		site(users, "user:{http.request.header.X-User}")+site(typo, "user:{http.request.heder.X-User}"), users, typo)
	stored := func(key string) int {
		var n int
		require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM idempotency_keys WHERE idempotency_key = $1`, key).Scan(&n))
		return n
	}

	for _, tc := range []struct {
		name, addr string
		users      []string // the X-User lines; none: no header
		why        string   // in the problem's detail
	}{
		{"no header", users, nil, "{http.request.header.X-User} is empty"},
		{"an empty header", users, []string{""}, "{http.request.header.X-User} is empty"},
		{"two headers", users, []string{"bob", "alice"}, "{http.request.header.X-User} has 2 values"},
		{"an unknown placeholder", typo, []string{"alice"}, "{http.request.heder.X-User} is unknown"},
		{"a 300-byte scope", users, []string{strings.Repeat("a", 295)}, "the scope is 300 bytes; this site takes at most 247"},
		{"over 255 bytes with the namespace", users, []string{strings.Repeat("a", 243)}, "the scope is 248 bytes; this site takes at most 247"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Not parallel: the upstream's count is the test's.
			key, before := rand.Text(), up.runs.Load()
			header := http.Header{idempotency.HeaderKey: {key}, "X-User": tc.users}
			if tc.users == nil {
				header.Del("X-User")
			}
			// Two callers alike (two anonymous ones, say): the second
			// must not get the first's answer.
			for _, caller := range []string{"first", "second"} {
				resp, body := send(t, tc.addr, "/charges", header)
				require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "%s: %s", caller, body)
				require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"), caller)
				require.Empty(t, resp.Header.Get(idempotency.HeaderReplayed), "%s: never a replay", caller)
				require.Contains(t, string(body), "https://example.com/problems/"+idempotency.ProblemOf(idempotency.ErrNoScope).Slug, caller)
				require.Contains(t, string(body), tc.why, caller)
				require.NotContains(t, string(body), "retrying", "%s: no answer says a retry is safe", caller)
			}
			require.Equal(t, before, up.runs.Load(), "the upstream ran nothing")
			require.Zero(t, stored(key), "no key was stored")
		})
	}

	t.Run("one caller, within the limit", func(t *testing.T) {
		for _, user := range []string{"alice", strings.Repeat("a", 242)} {
			key, before := rand.Text(), up.runs.Load()
			header := http.Header{idempotency.HeaderKey: {key}, "X-User": {user}}
			first, body := send(t, users, "/charges", header)
			require.Equal(t, http.StatusCreated, first.StatusCode, string(body))
			again, replayed := send(t, users, "/charges", header)
			require.Equal(t, "true", again.Header.Get(idempotency.HeaderReplayed), string(replayed))
			require.Equal(t, body, replayed)
			require.Equal(t, before+1, up.runs.Load(), "run once")
			require.Equal(t, 1, stored(key))
		}
	})
	require.NotContains(t, logs.String(), "goroutine ", "no stack trace")
}

// TestCaddyStoresAnswersDecoded: the client's Accept-Encoding is not
// forwarded on a covered request, as oncekey proxy does not forward it,
// so an upstream that gzips when asked is stored as the JSON it is: the
// first caller asked for gzip, its retry did not, and both get JSON
// labelled as such. An answer the upstream encodes unasked is stored
// encoded, and replayed with its Content-Encoding.
func TestCaddyStoresAnswersDecoded(t *testing.T) {
	t.Parallel()
	bin := buildCaddy(t)
	up := startCountingUpstream(t)
	addr := freeAddr(t)
	startCaddy(t, bin, fmt.Sprintf("{\n\tadmin off\n\tauto_https off\n}\nhttp://%s {\n\tidempotency {\n\t\tscope {http.request.header.X-Account-Id}\n\t}\n\treverse_proxy %s\n}\n",
		addr, strings.TrimPrefix(up.URL, "http://")), addr)
	scope := "acct-" + rand.Text()

	t.Run("gzip asked for by the first caller", func(t *testing.T) {
		key := rand.Text()
		header := http.Header{idempotency.HeaderKey: {key}, "X-Account-Id": {scope}, "Accept-Encoding": {"gzip"}}
		first, body := send(t, addr, "/charges", header)
		require.Equal(t, http.StatusCreated, first.StatusCode, "%q", body)
		require.Empty(t, first.Header.Get("Content-Encoding"), "decoded before it was stored")
		require.True(t, strings.HasPrefix(string(body), `{"id":`), "JSON: %q", body)
		header.Del("Accept-Encoding")
		again, replayed := send(t, addr, "/charges", header)
		require.Equal(t, http.StatusCreated, again.StatusCode, "%q", replayed)
		require.Equal(t, "true", again.Header.Get(idempotency.HeaderReplayed))
		require.Empty(t, again.Header.Get("Content-Encoding"))
		require.Equal(t, "application/json", again.Header.Get("Content-Type"))
		require.Equal(t, body, replayed, "the replay is the JSON, readable")
	})

	t.Run("deflate sent unasked", func(t *testing.T) {
		key, before := rand.Text(), up.runs.Load()
		header := http.Header{idempotency.HeaderKey: {key}, "X-Account-Id": {scope}}
		first, body := send(t, addr, "/deflate", header)
		require.Equal(t, http.StatusCreated, first.StatusCode, "%q", body)
		require.Equal(t, "deflate", first.Header.Get("Content-Encoding"))
		again, replayed := send(t, addr, "/deflate", header)
		require.Equal(t, "true", again.Header.Get(idempotency.HeaderReplayed))
		require.Equal(t, "deflate", again.Header.Get("Content-Encoding"), "the replay names the encoding of the body it carries")
		require.Equal(t, "application/json", again.Header.Get("Content-Type"))
		require.Equal(t, body, replayed)
		decoded, err := io.ReadAll(flate.NewReader(bytes.NewReader(replayed)))
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(string(decoded), `{"id":`), "%q", decoded)
		require.Equal(t, before+1, up.runs.Load())
	})
}
