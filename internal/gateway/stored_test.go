package gateway_test

import (
	"crypto/rand"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/gateway"
	"github.com/oncekey/oncekey/internal/gateway/keyscope"
)

// TestRoutesStoreTheirOwnSizeOfResponses: a route's MaxStored is its own,
// on every store. A route with a limit below its answer passes it
// through once and stores none of it (its retry gets 409
// idempotency.ErrNotStored, and the upstream ran once) while a route of the
// gateway's limit stores and replays the same answer; a route may also
// store more than the gateway's limit; and a route that stores no
// response stores neither an answer, nor a stream, nor an empty answer.
func TestRoutesStoreTheirOwnSizeOfResponses(t *testing.T) {
	t.Parallel()
	answer := `{"id":"` + strings.Repeat("x", 100) + `"}` // 109 bytes
	var runs sync.Map                                     // key → *atomic.Int64
	count := func(key string) *atomic.Int64 {
		n, _ := runs.LoadOrStore(key, &atomic.Int64{})
		return n.(*atomic.Int64)
	}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		count(r.Header.Get(idempotency.HeaderKey)).Add(1)
		if strings.HasSuffix(r.URL.Path, "/empty") {
			w.Header().Set("Location", r.URL.Path+"/"+uuid.NewString())
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if strings.HasSuffix(r.URL.Path, "/events") {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			for i := range 3 {
				_, _ = fmt.Fprintf(w, "data: %d\n\n", i)
				http.NewResponseController(w).Flush()
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(answer))
	}))
	t.Cleanup(upstream.Close)
	notStored := idempotency.ProblemOf(idempotency.ErrNotStored).Slug
	tests := []struct {
		name, path string
		// gatewayMax is the gateway's MaxStored (zero: its default).
		gatewayMax int64
		routeMax   int64
		want       string // the first answer's body, passed through whole
		replayed   bool
	}{
		{name: "the gateway's limit: stored and replayed", path: "/transfers", want: answer, replayed: true},
		{name: "a route's limit below the answer: passed through once, not stored", path: "/profiles", routeMax: 16, want: answer},
		{name: "a route's limit above the gateway's: stored and replayed", path: "/exports", gatewayMax: 16, routeMax: 1 << 20, want: answer, replayed: true},
		{name: "a route that stores no response", path: "/patients", routeMax: gateway.StoreNone, want: answer},
		{name: "a route that stores no response: a stream", path: "/patients/events", routeMax: gateway.StoreNone, want: "data: 0\n\ndata: 1\n\ndata: 2\n\n"},
		{name: "a route that stores no response: an empty one", path: "/patients/empty", routeMax: gateway.StoreNone, want: ""},
		{name: "the gateway's limit: a stream stored and replayed", path: "/transfers/events", want: "data: 0\n\ndata: 1\n\ndata: 2\n\n", replayed: true},
	}
	for _, store := range stores {
		t.Run(store.name, func(t *testing.T) {
			t.Parallel()
			open := store.open(t)
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					t.Parallel()
					// Every route on one gateway, beside the route under
					// test: each keeps its own limit.
					rs := []gateway.Route{{Method: "POST", Path: "/others"}, {Method: "POST", Path: tt.path, MaxStored: tt.routeMax}}
					gw := httptest.NewServer(open(gateway.Config{Upstream: mustURL(t, upstream.URL), Routes: rs,
						Scope: keyscope.Header("X-Account-Id"), MaxStored: tt.gatewayMax}))
					t.Cleanup(gw.Close)
					c := client{t, gw.URL, "acct-" + rand.Text()}
					key := uuid.NewString()
					first, body := c.post(tt.path, key, `{}`)
					require.Less(t, first.StatusCode, 300, "%s", body)
					require.Equal(t, tt.want, body, "the first answer passes whole")
					retry, again := c.post(tt.path, key, `{}`)
					if tt.replayed {
						require.Equal(t, first.StatusCode, retry.StatusCode, "%s", again)
						require.Equal(t, "true", retry.Header.Get(idempotency.HeaderReplayed))
						require.Equal(t, tt.want, again, "replayed whole")
					} else {
						require.Equal(t, http.StatusConflict, retry.StatusCode, "%s", again)
						require.Equal(t, notStored, problemType(t, again), "the key says it ran and was not stored")
					}
					require.EqualValues(t, 1, count(key).Load(), "the upstream ran it once")

					// The route beside it takes the gateway's limit.
					key = uuid.NewString()
					c.post("/others", key, `{}`)
					retry, again = c.post("/others", key, `{}`)
					if tt.gatewayMax == 0 {
						require.Equal(t, "true", retry.Header.Get(idempotency.HeaderReplayed), "%d %s", retry.StatusCode, again)
					} else {
						require.Equal(t, notStored, problemType(t, again), "the gateway's limit, not the route's")
					}
					require.EqualValues(t, 1, count(key).Load())
				})
			}
		})
	}
}

// TestStoredSizeFromTheDocument: an upstream's x-idempotency sets the
// responses its operation's route stores (max-stored-bytes, or
// store-responses: false for none); an operation that sets neither takes
// the gateway's.
func TestStoredSizeFromTheDocument(t *testing.T) {
	t.Parallel()
	doc, err := openapi3.NewLoader().LoadFromData([]byte(`
openapi: 3.0.3
info: {title: Records, version: "1"}
paths:
  /patients:
    post:
      x-idempotency: {store-responses: false}
      responses: {'201': {description: A patient.}}
  /notes:
    post:
      x-idempotency: {max-stored-bytes: 4096, store-responses: true}
      responses: {'201': {description: A note.}}
  /transfers:
    post:
      parameters: [{name: Idempotency-Key, in: header, schema: {type: string}}]
      responses: {'201': {description: A transfer.}}
`))
	require.NoError(t, err)
	rs, err := gateway.SpecRoutes(doc)
	require.NoError(t, err)
	got := map[string]int64{}
	for _, r := range rs {
		got[r.Path] = r.MaxStored
	}
	require.Equal(t, map[string]int64{"/notes": 4096, "/patients": gateway.StoreNone, "/transfers": 0}, got)
}

// TestRoutesSetStoredSize: a routes file's max_stored_bytes and
// store_responses are the route's; a size that is not positive, a
// store_responses that is not a boolean, and both together are refused,
// with the route or the line named.
func TestRoutesSetStoredSize(t *testing.T) {
	t.Parallel()
	rs, err := gateway.ReadRoutes(strings.NewReader(`routes:
  - {method: POST, path: /profiles, max_stored_bytes: 65536}
  - {method: POST, path: /patients, store_responses: false}
  - {method: POST, path: /notes, store_responses: true, max_stored_bytes: 1024}
  - {method: POST, path: /transfers}
`))
	require.NoError(t, err)
	require.EqualValues(t, 65536, rs[0].MaxStored)
	require.EqualValues(t, gateway.StoreNone, rs[1].MaxStored, "none stored")
	require.EqualValues(t, 1024, rs[2].MaxStored)
	require.Zero(t, rs[3].MaxStored, "the gateway's")

	for bad, says := range map[string]string{
		"max_stored_bytes: 0":                            "route 1: max_stored_bytes 0 is not a positive number of bytes",
		"max_stored_bytes: -1":                           "route 1: max_stored_bytes -1 is not a positive number of bytes",
		"max_stored_bytes: 1MiB":                         "line 2: cannot unmarshal",
		"store_responses: never":                         "line 2: cannot unmarshal",
		"store_responses: false, max_stored_bytes: 1024": "route 1: store_responses: false stores no response, and max_stored_bytes bounds those stored: give one of them",
	} {
		_, err := gateway.ReadRoutes(strings.NewReader("routes:\n  - {method: POST, path: /orders, " + bad + "}\n"))
		require.ErrorContains(t, err, says, bad)
	}
}
