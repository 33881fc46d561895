package provider_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/provider"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"

	"github.com/oncekey/oncekey/idempotency"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// storeFactories are the Store implementations every conformance and
// concurrency test runs against. The PostgreSQL one shares the test
// binary's database; tests keep apart by using their own keys and
// references (see unique).
var storeFactories = []struct {
	name string
	new  func(t *testing.T) provider.Store
}{
	{"memory", func(t *testing.T) provider.Store { return provider.NewMemoryStore() }},
	{"postgres", func(t *testing.T) provider.Store {
		t.Helper()
		s, err := provider.NewPostgresStore(context.Background(), testdb.Pool(t))
		require.NoError(t, err, "NewPostgresStore")
		return s
	}},
}

// eachStore runs test as a parallel subtest on a new store of each kind.
func eachStore(t *testing.T, test func(t *testing.T, store provider.Store)) {
	t.Helper()
	for _, sf := range storeFactories {
		t.Run(sf.name, func(t *testing.T) {
			t.Parallel()
			test(t, sf.new(t))
		})
	}
}

// testBundle is a server under test behind real HTTP, with a client on it.
type testBundle struct {
	srv    *provider.Server
	store  provider.Store
	url    string
	client *provider.Client
}

// setup starts a server with faults over store (a new MemoryStore if nil).
func setup(t *testing.T, store provider.Store, faults provider.Faults) *testBundle {
	t.Helper()
	if store == nil {
		store = provider.NewMemoryStore()
	}
	srv := provider.NewServer(store, faults, nil)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return &testBundle{srv: srv, store: store, url: hs.URL, client: provider.NewClient(hs.URL, hs.Client())}
}

// unique returns a name no other test uses, so tests sharing a database
// cannot see each other's charges.
func unique(prefix string) string { return prefix + "-" + uuid.NewString() }

// problem is the RFC 9457 body of every error answer.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// answer is a raw HTTP answer, for the tests that check statuses and
// headers the client hides.
type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) charge(t *testing.T) provider.Charge {
	t.Helper()
	var ch provider.Charge
	require.NoError(t, json.Unmarshal(a.body, &ch), "charge body %s", a.body)
	return ch
}

func (a answer) refund(t *testing.T) provider.Refund {
	t.Helper()
	var re provider.Refund
	require.NoError(t, json.Unmarshal(a.body, &re), "refund body %s", a.body)
	return re
}

func (a answer) problem(t *testing.T) problem {
	t.Helper()
	require.Equal(t, "application/problem+json", a.header.Get("Content-Type"), "error body type; body %s", a.body)
	var p problem
	require.NoError(t, json.Unmarshal(a.body, &p), "problem body %s", a.body)
	require.Equal(t, a.status, p.Status, "problem status matches the HTTP status")
	require.NotEmpty(t, p.Title)
	return p
}

// requireInvalid checks the answer to a malformed POST: 400 (413 for a
// body too large) with a problem of wantType that says what is wrong.
func requireInvalid(t *testing.T, a answer, wantType string) problem {
	t.Helper()
	wantStatus := http.StatusBadRequest
	if wantType == idempotency.ProblemOf(idempotency.ErrBodyTooLarge).Slug {
		wantStatus = http.StatusRequestEntityTooLarge
	}
	require.Equal(t, wantStatus, a.status, "body %s", a.body)
	p := a.problem(t)
	require.Equal(t, "https://oncekey.dev/problems/fakeprovider/"+wantType, p.Type, "detail %q", p.Detail)
	require.NotEmpty(t, p.Detail, "a 400 says what is wrong")
	return p
}

// send makes one request; headers are name/value pairs.
func send(t *testing.T, method, url, body string, headers ...string) answer {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err, "%s %s", method, url)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{status: resp.StatusCode, header: resp.Header, body: b}
}

// postCharge sends POST /v1/charges with key (no header when empty).
func postCharge(t *testing.T, baseURL, key, body string) answer {
	t.Helper()
	return postWithKey(t, baseURL+"/v1/charges", key, body)
}

// postRefund sends POST /v1/refunds with key (no header when empty).
func postRefund(t *testing.T, baseURL, key, body string) answer {
	t.Helper()
	return postWithKey(t, baseURL+"/v1/refunds", key, body)
}

func postWithKey(t *testing.T, url, key, body string) answer {
	t.Helper()
	if key == "" {
		return send(t, http.MethodPost, url, body, "Content-Type", "application/json")
	}
	return send(t, http.MethodPost, url, body, "Content-Type", "application/json", "Idempotency-Key", key)
}

// jsonBody encodes a request (a ChargeRequest or a RefundRequest) as the
// client would.
func jsonBody(t *testing.T, req any) string {
	t.Helper()
	b, err := json.Marshal(req)
	require.NoError(t, err)
	return string(b)
}

// together runs n calls of f at once, released together as far as
// goroutines allow, and returns their results in call order: the race the
// concurrency tests need.
func together[T any](n int, f func() T) []T {
	out := make([]T, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			out[i] = f()
		})
	}
	close(start)
	wg.Wait()
	return out
}

// requireOneCreated checks the answers to concurrent POSTs with one key:
// exactly one 201, the rest 200 replays, all of the one object whose id
// id reads.
func requireOneCreated(t *testing.T, answers []answer, id func(answer) string) {
	t.Helper()
	created, replayed, ids := 0, 0, map[string]bool{}
	for _, a := range answers {
		switch a.status {
		case http.StatusCreated:
			created++
		case http.StatusOK:
			require.Equal(t, "true", a.header.Get(provider.ReplayedHeader))
			replayed++
		default:
			require.Failf(t, "unexpected answer", "%d %s", a.status, a.body)
		}
		ids[id(a)] = true
	}
	require.Equal(t, 1, created, "exactly one request stores")
	require.Equal(t, len(answers)-1, replayed, "the rest replay it")
	require.Len(t, ids, 1, "everyone is told the same object")
}

// insertResult is what one concurrent store insert returned.
type insertResult struct {
	id       string
	inserted bool
	err      error
}

// requireOneWinner checks the results of concurrent store inserts under one
// key: no errors, exactly one inserted, every caller answered its record.
func requireOneWinner(t *testing.T, results []insertResult) {
	t.Helper()
	winners, returned := 0, map[string]int{}
	for _, r := range results {
		require.NoError(t, r.err, "concurrent insert under one key: a replay, never an error")
		if r.inserted {
			winners++
		}
		returned[r.id]++
	}
	require.Equal(t, 1, winners, "exactly one insert wins")
	require.Len(t, returned, 1, "every caller is answered the winner's record: %v", returned)
}
