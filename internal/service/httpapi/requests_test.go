package httpapi_test

import (
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/gen/api"
	"github.com/oncekey/oncekey/internal/service/servicetest"
	"github.com/oncekey/oncekey/internal/wire/problem"
)

// reply is a whole response (see servicetest.Reply).
type reply = servicetest.Reply

// newRequest builds a request to the bundle's server with its API key (see
// servicetest.NewRequest for the header pairs).
func (b *testBundle) newRequest(t *testing.T, method, path string, body io.Reader, header ...string) *http.Request {
	t.Helper()
	req, err := servicetest.NewRequest(method, b.url+path, b.apiKey, body, header...)
	require.NoError(t, err)
	return req
}

// exchange sends req through the validating client and reads the whole
// reply; it returns errors instead of failing, so goroutines can use it.
func (b *testBundle) exchange(req *http.Request) (reply, error) {
	return servicetest.Exchange(b.http, req)
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
	return reply{Status: resp.StatusCode, Header: resp.Header, Body: readAll(t, resp.Body)}
}

// get sends GET path with the bundle's API key.
func (b *testBundle) get(t *testing.T, path string) reply {
	t.Helper()
	return b.do(t, b.newRequest(t, http.MethodGet, path, nil))
}

// requireCreated checks that r is a 201 with an order body and returns the order.
func requireCreated(t *testing.T, r reply, what string) api.Order {
	t.Helper()
	require.Equal(t, http.StatusCreated, r.Status, "%s: want 201, got %s", what, r)
	var o api.Order
	require.NoError(t, json.Unmarshal(r.Body, &o), "%s: decode order %s", what, r.Body)
	require.NotEmpty(t, o.Id, "%s: order without id", what)
	return o
}

// requireFresh checks that r is a 201 that ran the operation (not a replay).
func requireFresh(t *testing.T, r reply, what string) api.Order {
	t.Helper()
	o := requireCreated(t, r, what)
	require.Empty(t, r.Header.Get("Idempotent-Replayed"), "%s: must run the operation, not replay", what)
	return o
}

// requireReplayOf checks that r replays first: same status, same bytes and
// Idempotent-Replayed: true.
func requireReplayOf(t *testing.T, first, r reply, what string) {
	t.Helper()
	require.Equal(t, first.Status, r.Status, "%s: status of the replay: %s", what, r)
	require.Equal(t, "true", r.Header.Get("Idempotent-Replayed"), "%s: Idempotent-Replayed", what)
	require.Equal(t, string(first.Body), string(r.Body), "%s: a replay must be byte-identical to the first response", what)
}

// requireProblem checks that r is an RFC 9457 problem of kind and returns it.
func requireProblem(t *testing.T, r reply, kind problem.Kind, what string) problem.Details {
	t.Helper()
	require.Equal(t, kind.Status, r.Status, "%s: want %d %s, got %s", what, kind.Status, kind.Slug, r)
	require.Equal(t, problem.ContentType, r.Header.Get("Content-Type"), "%s: Content-Type of %s", what, r)
	var d problem.Details
	require.NoError(t, json.Unmarshal(r.Body, &d), "%s: decode problem %s", what, r.Body)
	require.Equal(t, kind.Type(), d.Type, "%s: problem type of %s", what, r)
	require.Equal(t, kind.Status, d.Status, "%s: status in the problem body", what)
	require.Equal(t, kind.Title, d.Title, "%s: problem title", what)
	return d
}

// stampede sends n requests at once (request(i) builds the i-th) and
// returns their replies in order.
func (b *testBundle) stampede(t *testing.T, n int, request func(i int) *http.Request) []reply {
	t.Helper()
	reqs := make([]*http.Request, n)
	for i := range reqs {
		reqs[i] = request(i)
	}
	replies := make([]reply, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range reqs {
		wg.Go(func() {
			<-start
			replies[i], errs[i] = b.exchange(reqs[i])
		})
	}
	close(start)
	servicetest.Wait(t, &wg, time.Minute, "the stampede")
	for i, err := range errs {
		require.NoError(t, err, "request %d", i)
	}
	return replies
}
