package httpapi_test

import (
	"bufio"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/httpapi"
	"github.com/oncekey/oncekey/internal/problem"
	"github.com/oncekey/oncekey/internal/store/memory"
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
			// No single meaning (beyond what a double holds exactly, nested
			// deeper than canonical JSON goes): malformed, as docs/problems.md
			// says, whatever the schema would have said.
			{"huge number", `{"items":[{"sku":"SKU-1","qty":2}],"amount":1e400,"currency":"RUB"}`, nil, problem.MalformedJSON},
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
	})
}

// TestServerRefusesMalformedRequestsBeforeTheService pins what Go's HTTP
// server answers itself, before any handler runs, so that
// docs/reliability.md promises exactly that: a header value with a control
// character (NUL to US but tab, and DEL) or a request line that is not
// HTTP gets 400 with a text/plain body and a closed connection, not a
// problem document. Nothing reaches the service, so nothing is stored.
func TestServerRefusesMalformedRequestsBeforeTheService(t *testing.T) {
	t.Parallel()
	b := setup(t, memory.New(), options{})
	host := strings.TrimPrefix(b.url, "http://")
	for name, raw := range map[string]string{
		"NUL in the key":   "POST /orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: a\x00b\r\nContent-Length: 0\r\n\r\n",
		"SOH in the key":   "POST /orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: a\x01b\r\nContent-Length: 0\r\n\r\n",
		"DEL in the key":   "POST /orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: a\x7fb\r\nContent-Length: 0\r\n\r\n",
		"garbage request":  "GARBAGE\r\n\r\n",
		"no HTTP version":  "POST /orders\r\nHost: x\r\n\r\n",
		"header sans name": "POST /orders HTTP/1.1\r\nHost: x\r\n: value\r\n\r\n",
	} {
		conn, err := net.Dial("tcp", host)
		require.NoError(t, err, name)
		require.NoError(t, conn.SetDeadline(time.Now().Add(5*time.Second)), name)
		_, err = conn.Write([]byte(raw))
		require.NoError(t, err, name)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err, name)
		body := readAll(t, resp.Body)
		require.NoError(t, conn.Close())
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, name)
		require.Equal(t, "text/plain; charset=utf-8", resp.Header.Get("Content-Type"), name)
		require.True(t, strings.HasPrefix(string(body), "400 Bad Request"), "%s: %q", name, body)
		require.True(t, resp.Close, "%s: the server closes the connection", name)
	}
	// A tab is valid in a header value; the service refuses it in a key.
	requireProblem(t, b.do(t, b.newRequest(t, http.MethodPost, "/orders", strings.NewReader(seedBody), "Idempotency-Key", "a\tb")),
		problem.InvalidIdempotencyKey, "a tab in the key")
}
