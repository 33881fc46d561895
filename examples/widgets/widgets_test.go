package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency/pgstore"
)

// The tests run the service, as main wires it, against a database of their
// own on the real PostgreSQL server. Each test is its own tenant, so they
// run in parallel on one database and count only their own rows.

// testBundle is one test's view of the service: its tenant and the pool
// to count rows with.
type testBundle struct {
	t      *testing.T
	url    string
	tenant string
	pool   *pgxpool.Pool
}

var (
	serviceOnce sync.Once
	serviceURL  string
	servicePool *pgxpool.Pool
	serviceErr  error
	skipReason  string
	cleanups    []func()
)

func TestMain(m *testing.M) {
	code := m.Run()
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
	os.Exit(code)
}

// setup returns a bundle for a fresh tenant of the one service this test
// binary starts, on its own database, the first time it is asked for.
func setup(t *testing.T) *testBundle {
	t.Helper()
	serviceOnce.Do(startService)
	if skipReason != "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("PostgreSQL is required in CI: %s", skipReason)
		}
		t.Skip(skipReason)
	}
	require.NoError(t, serviceErr)
	return &testBundle{t: t, url: serviceURL, tenant: "tenant-" + rand.Text()[:10], pool: servicePool}
}

// startService creates a database with a random name, migrates it as main
// does and serves the handler with httptest. TestMain drops the database
// (WITH (FORCE): the pool may still hold connections) when all tests end.
func startService() {
	ctx := context.Background()
	adminURL := cmp.Or(os.Getenv("TEST_DATABASE_URL"), os.Getenv("DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/postgres")
	connectCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	admin, err := pgx.Connect(connectCtx, adminURL)
	if err != nil {
		skipReason = "PostgreSQL unreachable at " + adminURL + ": " + err.Error()
		return
	}
	cleanups = append(cleanups, func() { _ = admin.Close(ctx) })
	name := "widgets_test_" + strings.ToLower(rand.Text()[:12])
	if _, serviceErr = admin.Exec(ctx, "CREATE DATABASE "+name); serviceErr != nil {
		return
	}
	cleanups = append(cleanups, func() { _, _ = admin.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)") })

	cfg, err := pgxpool.ParseConfig(adminURL)
	if serviceErr = err; err != nil {
		return
	}
	cfg.ConnConfig.Database = name
	// pgxpool's default grows with the cores; make test keeps within a
	// stated number of PostgreSQL connections on any machine.
	cfg.MaxConns = 6
	if servicePool, serviceErr = pgxpool.NewWithConfig(ctx, cfg); serviceErr != nil {
		return
	}
	cleanups = append(cleanups, servicePool.Close)
	if serviceErr = migrate(ctx, servicePool); serviceErr != nil {
		return
	}
	keys, err := pgstore.New(servicePool, pgstore.Options{})
	if serviceErr = err; err != nil {
		return
	}
	handler, err := newHandler(servicePool, keys)
	if serviceErr = err; err != nil {
		return
	}
	srv := httptest.NewServer(handler)
	cleanups = append(cleanups, srv.Close)
	serviceURL = srv.URL
}

// response is what a test looks at of an answer.
type response struct {
	status int
	header http.Header
	body   []byte
}

// post sends body to path as the bundle's tenant, with key unless it is
// empty.
func (b *testBundle) post(path, key, body string) response {
	b.t.Helper()
	return b.do(http.MethodPost, path, key, body)
}

func (b *testBundle) get(path string) response {
	b.t.Helper()
	return b.do(http.MethodGet, path, "", "")
}

func (b *testBundle) do(method, path, key, body string) response {
	b.t.Helper()
	resp, err := b.send(method, path, key, body)
	require.NoError(b.t, err)
	return resp
}

// send is do for goroutines other than the test's, which must not stop
// the test: they hand back the error for the test to check.
func (b *testBundle) send(method, path, key, body string) (response, error) {
	req, err := http.NewRequest(method, b.url+path, strings.NewReader(body))
	if err != nil {
		return response{}, err
	}
	req.Header.Set("Authorization", "Bearer "+b.tenant)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: data}, err
}

// storm sends n copies of one request at once and returns the answers. A
// 202 means a copy outwaited the first request; it is retried with the
// same key, as a client would (for up to about five seconds).
func (b *testBundle) storm(n int, path, key, body string) []response {
	b.t.Helper()
	answers := make([]response, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			answers[i], errs[i] = b.send(http.MethodPost, path, key, body)
			for try := 0; try < 100 && errs[i] == nil && answers[i].status == http.StatusAccepted; try++ {
				time.Sleep(50 * time.Millisecond) // pacing: the client's backoff before it retries
				answers[i], errs[i] = b.send(http.MethodPost, path, key, body)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(b.t, err)
	}
	return answers
}

// widgets counts the tenant's widget rows: what actually happened,
// whatever the responses said.
func (b *testBundle) widgets() int {
	b.t.Helper()
	var n int
	require.NoError(b.t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM widgets WHERE tenant = $1", b.tenant).Scan(&n))
	return n
}

// create makes a widget and returns its id.
func (b *testBundle) create(key string) string {
	b.t.Helper()
	resp := b.post("/widgets", key, `{"name":"gear","color":"red"}`)
	require.Equal(b.t, http.StatusCreated, resp.status, string(resp.body))
	var w struct{ ID string }
	require.NoError(b.t, json.Unmarshal(resp.body, &w))
	return w.ID
}

func requireProblem(t *testing.T, resp response, status int, slug string) {
	t.Helper()
	require.Equal(t, status, resp.status, string(resp.body))
	require.Equal(t, "application/problem+json", resp.header.Get("Content-Type"))
	var p struct{ Type string }
	require.NoError(t, json.Unmarshal(resp.body, &p))
	require.Equal(t, "https://widgets.example/problems/"+slug, p.Type)
}

func TestCreateReplaysTheFirstResponse(t *testing.T) {
	t.Parallel()
	b := setup(t)

	first := b.post("/widgets", "create-1", `{"name":"gear","color":"red"}`)
	require.Equal(t, http.StatusCreated, first.status, string(first.body))
	require.Empty(t, first.header.Get("Idempotent-Replayed"))
	require.True(t, strings.HasPrefix(first.header.Get("Location"), "/widgets/"))

	// The same meaning in another form (key order, spacing) is the same request.
	replay := b.post("/widgets", "create-1", `{ "color": "red", "name": "gear" }`)
	require.Equal(t, first.status, replay.status)
	require.Equal(t, first.body, replay.body)
	require.Equal(t, first.header.Get("Location"), replay.header.Get("Location"))
	require.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))
	require.Equal(t, 1, b.widgets())

	got := b.get(first.header.Get("Location"))
	require.Equal(t, http.StatusOK, got.status, string(got.body))
	require.JSONEq(t, string(first.body), string(got.body))
}

func TestCreateWithTheKeyOfAnotherRequestIsAConflict(t *testing.T) {
	t.Parallel()
	b := setup(t)

	b.create("reused")
	requireProblem(t, b.post("/widgets", "reused", `{"name":"gear","color":"blue"}`), http.StatusConflict, "idempotency-key-mismatch")
	require.Equal(t, 1, b.widgets())
}

func TestConcurrentDuplicatesCreateOneWidget(t *testing.T) {
	t.Parallel()
	b := setup(t)

	answers := b.storm(50, "/widgets", "storm", `{"name":"gear","color":"red"}`)
	replayed := 0
	for i, resp := range answers {
		require.Equal(t, http.StatusCreated, resp.status, "answer %d: %s", i, resp.body)
		require.Equal(t, answers[0].body, resp.body, "answer %d", i)
		if resp.header.Get("Idempotent-Replayed") == "true" {
			replayed++
		}
	}
	require.Equal(t, 49, replayed, "one request ran, the others replayed it")
	require.Equal(t, 1, b.widgets())
}

func TestRequestsRefusedBeforeRunningConsumeNoKey(t *testing.T) {
	t.Parallel()
	b := setup(t)

	requireProblem(t, b.post("/widgets", "", `{"name":"gear","color":"red"}`), http.StatusBadRequest, "missing-idempotency-key")
	requireProblem(t, b.post("/widgets", "refused", `{"name":"","color":"red"}`), http.StatusBadRequest, "invalid-request")
	requireProblem(t, b.post("/widgets", "refused", `{"name":`), http.StatusBadRequest, "malformed-json")
	require.Equal(t, 0, b.widgets())

	// The key of a refused request is still free for a good one.
	b.create("refused")
	require.Equal(t, 1, b.widgets())

	b.tenant = ""
	requireProblem(t, b.post("/widgets", "anonymous", `{"name":"gear","color":"red"}`), http.StatusUnauthorized, "unauthorized")
}

func TestPaintRunsOnceAndReplays(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.create("make-one")
	path := "/widgets/" + id + "/paint"

	// Ten copies at once: one runs in its transaction, nine replay it.
	answers := b.storm(10, path, "paint-1", `{"color":"teal"}`)
	ran := 0
	for i, resp := range answers {
		require.Equal(t, http.StatusOK, resp.status, "answer %d: %s", i, resp.body)
		require.Equal(t, answers[0].body, resp.body, "answer %d", i)
		if resp.header.Get("Idempotent-Replayed") != "true" {
			ran++
		}
	}
	require.Equal(t, 1, ran)
	var painted struct {
		Color  string
		Paints int
	}
	require.NoError(t, json.Unmarshal(answers[0].body, &painted))
	require.Equal(t, "teal", painted.Color)
	require.Equal(t, 1, painted.Paints, "the answer is what the transaction read back")

	replay := b.post(path, "paint-1", `{"color":"teal"}`)
	require.Equal(t, answers[0].body, replay.body)
	require.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))
	var paints int
	require.NoError(t, b.pool.QueryRow(context.Background(),
		"SELECT paints FROM widgets WHERE tenant = $1 AND id = $2", b.tenant, id).Scan(&paints))
	require.Equal(t, 1, paints)

	requireProblem(t, b.post(path, "paint-1", `{"color":"plum"}`), http.StatusConflict, "idempotency-key-mismatch")
	requireProblem(t, b.post("/widgets/00000000-0000-4000-8000-000000000000/paint", "paint-2", `{"color":"teal"}`),
		http.StatusNotFound, "not-found")
}

func TestTenantsDoNotShareKeysOrWidgets(t *testing.T) {
	t.Parallel()
	a, other := setup(t), setup(t)

	idA := a.create("same-key")
	idOther := other.create("same-key")
	require.NotEqual(t, idA, idOther, "the same key in another tenant is another operation")
	require.Equal(t, 1, a.widgets())
	require.Equal(t, 1, other.widgets())

	requireProblem(t, other.get("/widgets/"+idA), http.StatusNotFound, "not-found")
	requireProblem(t, other.post("/widgets/"+idA+"/paint", "paint", `{"color":"teal"}`), http.StatusNotFound, "not-found")
	require.Equal(t, http.StatusOK, a.get("/widgets/"+idA).status)
}
