package httpapi_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/gen/api"
	"github.com/oncekey/oncekey/internal/problem"
)

// reply is a whole response, read at once so that bodies can be compared
// byte for byte and so that goroutines can hand it back over a channel.
type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) String() string {
	return fmt.Sprintf("%d %s", r.status, r.body)
}

// newRequest builds a request to the bundle's server with its API key and,
// when there is a body, Content-Type application/json. The header pairs are
// added afterwards (Add, so a pair can duplicate a header); a pair with an
// empty value deletes the header instead, e.g. "Authorization", "".
func (b *testBundle) newRequest(t *testing.T, method, path string, body io.Reader, header ...string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, b.server.URL+path, body)
	require.NoError(t, err, "build %s %s", method, path)
	req.Header.Set("Authorization", "Bearer "+b.apiKey)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		if header[i+1] == "" {
			req.Header.Del(header[i])
			continue
		}
		req.Header.Add(header[i], header[i+1])
	}
	return req
}

// exchange sends req through the validating client and reads the whole
// response. It returns errors instead of failing the test, so that
// goroutines can use it.
func (b *testBundle) exchange(req *http.Request) (reply, error) {
	resp, err := b.http.Do(req)
	if err != nil {
		return reply{}, fmt.Errorf("%s %s: %w", req.Method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, fmt.Errorf("%s %s: read body: %w", req.Method, req.URL.Path, err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: body}, nil
}

// do is exchange for the test's own goroutine.
func (b *testBundle) do(t *testing.T, req *http.Request) reply {
	t.Helper()
	r, err := b.exchange(req)
	require.NoError(t, err)
	return r
}

// postOrder sends body to POST /orders under key (no header when key is
// empty) with the bundle's API key.
func (b *testBundle) postOrder(t *testing.T, key, body string, header ...string) reply {
	t.Helper()
	resp := b.post(t, "/orders", key, body, header...)
	return reply{status: resp.StatusCode, header: resp.Header, body: readAll(t, resp.Body)}
}

// get sends GET path with the bundle's API key.
func (b *testBundle) get(t *testing.T, path string) reply {
	t.Helper()
	return b.do(t, b.newRequest(t, http.MethodGet, path, nil))
}

// requireCreated checks that r is a 201 with an order body and returns the order.
func requireCreated(t *testing.T, r reply, what string) api.Order {
	t.Helper()
	require.Equal(t, http.StatusCreated, r.status, "%s: want 201, got %s", what, r)
	var o api.Order
	require.NoError(t, json.Unmarshal(r.body, &o), "%s: decode order %s", what, r.body)
	require.NotEmpty(t, o.Id, "%s: order without id", what)
	return o
}

// requireFresh checks that r is a 201 that ran the operation (not a replay).
func requireFresh(t *testing.T, r reply, what string) api.Order {
	t.Helper()
	o := requireCreated(t, r, what)
	require.Empty(t, r.header.Get("Idempotent-Replayed"), "%s: must run the operation, not replay", what)
	return o
}

// requireReplayOf checks that r replays first: same status, same bytes and
// Idempotent-Replayed: true.
func requireReplayOf(t *testing.T, first, r reply, what string) {
	t.Helper()
	require.Equal(t, first.status, r.status, "%s: status of the replay: %s", what, r)
	require.Equal(t, "true", r.header.Get("Idempotent-Replayed"), "%s: Idempotent-Replayed", what)
	require.Equal(t, string(first.body), string(r.body), "%s: a replay must be byte-identical to the first response", what)
}

// requireProblem checks that r is an RFC 9457 problem of kind and returns it.
func requireProblem(t *testing.T, r reply, kind problem.Kind, what string) problem.Details {
	t.Helper()
	require.Equal(t, kind.Status, r.status, "%s: want %d %s, got %s", what, kind.Status, kind.Slug, r)
	require.Equal(t, problem.ContentType, r.header.Get("Content-Type"), "%s: Content-Type of %s", what, r)
	var d problem.Details
	require.NoError(t, json.Unmarshal(r.body, &d), "%s: decode problem %s", what, r.body)
	require.Equal(t, kind.Type(), d.Type, "%s: problem type of %s", what, r)
	require.Equal(t, kind.Status, d.Status, "%s: status in the problem body", what)
	require.Equal(t, kind.Title, d.Title, "%s: problem title", what)
	return d
}
