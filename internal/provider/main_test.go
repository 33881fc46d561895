package provider_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/provider"
	"github.com/oncekey/oncekey/internal/testdb"
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

func (a answer) problem(t *testing.T) problem {
	t.Helper()
	require.Equal(t, "application/problem+json", a.header.Get("Content-Type"), "error body type; body %s", a.body)
	var p problem
	require.NoError(t, json.Unmarshal(a.body, &p), "problem body %s", a.body)
	require.Equal(t, a.status, p.Status, "problem status matches the HTTP status")
	require.NotEmpty(t, p.Title)
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
	if key == "" {
		return send(t, http.MethodPost, baseURL+"/v1/charges", body, "Content-Type", "application/json")
	}
	return send(t, http.MethodPost, baseURL+"/v1/charges", body, "Content-Type", "application/json", "Idempotency-Key", key)
}

func chargeBody(t *testing.T, req provider.ChargeRequest) string {
	t.Helper()
	b, err := json.Marshal(req)
	require.NoError(t, err)
	return string(b)
}
