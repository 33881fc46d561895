package httpapi_test

import (
	"bufio"
	"context"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/httpserver"
	"github.com/oncekey/oncekey/internal/service/store/memory"
	"github.com/oncekey/oncekey/internal/wire/problem"
)

// Every kind of malformed body gets a clear 4xx problem, runs nothing and
// consumes no key: the same key with a good body then runs the operation.
// docs/reliability.md points at this table.
func TestHostileBodies(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{cfg: httpapi.Config{MaxBodyBytes: 4096}})
		for _, tc := range []struct {
			name   string
			body   string
			header []string
			kind   problem.Kind
		}{
			{"invalid JSON", `{"items":[`, nil, problem.MalformedJSON},
			{"trailing garbage", seedBody + `x`, nil, problem.MalformedJSON},
			{"wrong type", `{"items":[{"sku":"SKU-1","qty":"two"}],"amount":1200,"currency":"RUB"}`, nil, problem.Validation},
			// A number beyond a double is compared exactly, and then the
			// contract refuses it; nesting deeper than canonical JSON goes
			// has no single meaning: malformed, as docs/problems.md says,
			// whatever the schema would have said.
			{"huge number", `{"items":[{"sku":"SKU-1","qty":2}],"amount":1e400,"currency":"RUB"}`, nil, problem.Validation},
			{"an exponent of 10 digits", `{"items":[{"sku":"SKU-1","qty":2}],"amount":1e1000000000,"currency":"RUB"}`, nil, problem.MalformedJSON},
			{"amount beyond the contract", `{"items":[{"sku":"SKU-1","qty":2}],"amount":9000000000000000,"currency":"RUB"}`, nil, problem.Validation},
			{"deep nesting", `{"items":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`, nil, problem.MalformedJSON},
			{"duplicate JSON keys", `{"items":[{"sku":"SKU-1","qty":2}],"amount":1200,"amount":1,"currency":"RUB"}`, nil, problem.MalformedJSON},
			{"non-UTF-8", "{\"items\":[{\"sku\":\"SKU-\xff\",\"qty\":2}],\"amount\":1200,\"currency\":\"RUB\"}", nil, problem.MalformedJSON},
			{"empty body", ``, nil, problem.Validation},
			{"JSON null", `null`, nil, problem.Validation},
			{"wrong Content-Type", seedBody, []string{"Content-Type", "text/plain"}, problem.UnsupportedMediaType},
			// PostgreSQL stores no NUL in text or jsonb.
			{"NUL in a string", `{"items":[{"sku":"a\u0000b","qty":2}],"amount":1200,"currency":"RUB"}`, nil, problem.Validation},
			{"over the size limit", `{"items":[{"sku":"` + strings.Repeat("S", 8192) + `","qty":2}],"amount":1200,"currency":"RUB"}`, nil, problem.PayloadTooLarge},
		} {
			key := uuid.NewString()
			header := append([]string{"Idempotency-Key", key}, tc.header...)
			requireProblem(t, b.do(t, b.newRequest(t, http.MethodPost, "/orders", strings.NewReader(tc.body), header...)), tc.kind, tc.name)
			requireFresh(t, b.postOrder(t, key, seedBody), tc.name+": then the same key with a good body")
		}
		// A query that does not parse is read differently by different
		// servers and dropped by Go's: it has no one meaning to bind a key to.
		for _, query := range []string{"?to=alice;", "?a=%zz"} {
			key := uuid.NewString()
			requireProblem(t, b.do(t, b.newRequest(t, http.MethodPost, "/orders"+query, strings.NewReader(seedBody), "Idempotency-Key", key)), problem.MalformedQuery, query)
			requireFresh(t, b.postOrder(t, key, seedBody), query+": then the same key without it")
		}
	})
}

// TestServerAnswersBeforeTheService pins every answer that Go's HTTP
// server gives on its own, before the service sees the request, as
// docs/reliability.md lists them: served the way `oncekey serve` serves
// (package httpserver), raw bytes on a connection of their own. None runs
// anything or stores anything; none is a problem document. A status the
// service never sends otherwise (501, 505, 417) comes from here only.
func TestServerAnswersBeforeTheService(t *testing.T) {
	t.Parallel()
	handler, err := httpapi.New(httpapi.Config{Backend: memory.New(), Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- httpserver.Serve(ctx, ln, httpserver.Config{Handler: handler, ShutdownTimeout: time.Second, Logger: slog.New(slog.DiscardHandler)})
	}()
	t.Cleanup(func() { stop(); require.NoError(t, <-served) })

	const post = "POST /orders HTTP/1.1\r\nHost: x\r\n"
	for _, tc := range []struct {
		name, raw string
		status    int
		body      string // the body's start; "" for none
	}{
		{"NUL in a header value", post + "Idempotency-Key: a\x00b\r\nContent-Length: 0\r\n\r\n", http.StatusBadRequest, "400 Bad Request"},
		{"SOH in a header value", post + "Idempotency-Key: a\x01b\r\nContent-Length: 0\r\n\r\n", http.StatusBadRequest, "400 Bad Request"},
		{"DEL in a header value", post + "Idempotency-Key: a\x7fb\r\nContent-Length: 0\r\n\r\n", http.StatusBadRequest, "400 Bad Request"},
		{"a request line that is not HTTP", "GARBAGE\r\n\r\n", http.StatusBadRequest, "400 Bad Request"},
		{"no HTTP version", "POST /orders\r\nHost: x\r\n\r\n", http.StatusBadRequest, "400 Bad Request"},
		{"a header without a name", post + ": value\r\n\r\n", http.StatusBadRequest, "400 Bad Request"},
		{"no Host in HTTP/1.1", "GET /healthz HTTP/1.1\r\n\r\n", http.StatusBadRequest, "400 Bad Request: missing required Host header"},
		{"two different Content-Lengths", post + "Content-Length: 1\r\nContent-Length: 2\r\n\r\n{}", http.StatusBadRequest, "400 Bad Request"},
		{"a target that is no URI", "GET http://[::1 HTTP/1.1\r\nHost: x\r\n\r\n", http.StatusBadRequest, "400 Bad Request"},
		{"Transfer-Encoding other than chunked", post + "Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n", http.StatusNotImplemented, "Unsupported transfer encoding"},
		{"an expectation other than 100-continue", post + "Expect: 200-ok\r\nContent-Length: 2\r\n\r\n{}", http.StatusExpectationFailed, ""},
		{"headers beyond 32 KiB", "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 40<<10) + "\r\n\r\n", http.StatusRequestHeaderFieldsTooLarge, "431 Request Header Fields Too Large"},
		{"HTTP/2.0 in clear text", "GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n", http.StatusHTTPVersionNotSupported, "505 HTTP Version Not Supported"},
		{"OPTIONS *", "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", http.StatusOK, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			conn, err := net.Dial("tcp", ln.Addr().String())
			require.NoError(t, err)
			defer conn.Close()
			require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
			_, _ = conn.Write([]byte(tc.raw)) // a server that answers early may close before it has read all
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			require.NoError(t, err)
			body := readAll(t, resp.Body)
			require.Equal(t, tc.status, resp.StatusCode, "%s", body)
			require.NotEqual(t, problem.ContentType, resp.Header.Get("Content-Type"), "the server's own answer, not the service's")
			if tc.body != "" {
				require.Equal(t, "text/plain; charset=utf-8", resp.Header.Get("Content-Type"))
				require.True(t, strings.HasPrefix(string(body), tc.body), "%q", body)
			}
			if tc.status != http.StatusOK {
				require.True(t, resp.Close, "the server closes the connection")
			}
		})
	}
	// A body whose chunked framing is broken is dropped with the connection
	// (package httpserver reads bodies before the service): no answer.
	broken, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer broken.Close()
	require.NoError(t, broken.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = broken.Write([]byte(post + "Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"))
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(broken), nil)
	require.Error(t, err, "closed without an answer (an EOF, or a reset if bytes were left unread): %v", resp)

	// A method the resource does not have is the service's own 405, and a
	// HEAD is such a method: the API declares no HEAD operation.
	conn, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.Write([]byte("HEAD /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
	require.NoError(t, err)
	resp, err = http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: http.MethodHead})
	require.NoError(t, err)
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	require.Equal(t, problem.ContentType, resp.Header.Get("Content-Type"))
	require.Equal(t, []string{"GET"}, resp.Header.Values("Allow"))
}

// A tab is valid in a header value; the service refuses it in a key.
func TestTabInTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t, memory.New(), options{})
	requireProblem(t, b.do(t, b.newRequest(t, http.MethodPost, "/orders", strings.NewReader(seedBody), "Idempotency-Key", "a\tb")),
		problem.InvalidIdempotencyKey, "a tab in the key")
}
