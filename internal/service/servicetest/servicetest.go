// Package servicetest is what the black-box tests of several packages share
// when they run the service and talk to it over HTTP: starting it, building
// requests, reading whole replies, waiting for replies sent from goroutines.
// It is imported only by tests, and by tools/dashboard-snapshot, which
// slows the service's writes down as tests inject faults (WrapOrders).
package servicetest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/orders"
	"github.com/oncekey/oncekey/internal/service/store"
)

// Reply is a whole response, read at once so bodies can be compared byte
// for byte and goroutines can hand it back over a channel.
type Reply struct {
	Status int
	Header http.Header
	Body   []byte
}

func (r Reply) String() string { return fmt.Sprintf("%d %s", r.Status, r.Body) }

// NewRequest builds a request with the API key and, when there is a body,
// Content-Type application/json. Header pairs follow: the first pair for a
// name replaces that header, later pairs for the same name add values (to
// send a header twice), and an empty value deletes the header.
func NewRequest(method, url, apiKey string, body io.Reader, header ...string) (*http.Request, error) {
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		return nil, fmt.Errorf("build %s %s: %w", method, url, err)
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(header); i += 2 {
		name, value := http.CanonicalHeaderKey(header[i]), header[i+1]
		if !seen[name] {
			req.Header.Del(name)
			seen[name] = true
		}
		if value != "" {
			req.Header.Add(name, value)
		}
	}
	return req, nil
}

// Exchange sends req with client and reads the whole reply. It returns
// errors instead of failing a test, so goroutines can use it.
func Exchange(client *http.Client, req *http.Request) (Reply, error) {
	resp, err := client.Do(req)
	if err != nil {
		return Reply{}, fmt.Errorf("%s %s: %w", req.Method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return Reply{}, fmt.Errorf("%s %s: read body: %w", req.Method, req.URL.Path, err)
	}
	return Reply{Status: resp.StatusCode, Header: resp.Header, Body: body}, nil
}

// Service is the full service under test, started by Start, with an
// account to act as.
type Service struct {
	URL     string
	Account uuid.UUID
	APIKey  string
}

// Options adjust the service a test starts; zero values are the defaults.
type Options struct {
	// Config is the service's configuration; Start sets its Backend.
	Config httpapi.Config
	// Orders, if set, wraps the order writes of POST /orders (fault
	// injection), through WrapOrders on Config.DeferredKeys or the
	// backend's.
	Orders func(orders.Writer) orders.Writer
	// Wrap, if set, wraps the whole handler (a fault injector in front).
	Wrap func(http.Handler) http.Handler
	// NoAccount leaves out the account, for a store that cannot make one
	// (its accounts unreachable, say).
	NoAccount bool
}

// Start runs the full service (httpapi.New) on backend in an httptest
// server that the test's end closes, and creates an account on it. Every
// test of the service starts it here, so that they all run what serve runs.
func Start(t testing.TB, backend store.Backend, opts Options) Service {
	t.Helper()
	cfg := opts.Config
	cfg.Backend = backend
	if cfg.Logger == nil {
		cfg.Logger = Logger(t)
	}
	if opts.Orders != nil {
		keys := cfg.DeferredKeys
		if keys == nil {
			keys = backend.DeferredKeys()
		}
		cfg.DeferredKeys = WrapOrders(keys, opts.Orders)
	}
	handler, err := httpapi.New(cfg)
	require.NoError(t, err, "build the service")
	if opts.Wrap != nil {
		handler = opts.Wrap(handler)
	}
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	svc := Service{URL: srv.URL}
	if !opts.NoAccount {
		creds, err := auth.CreateAccount(context.Background(), backend, "test-"+t.Name(), "")
		require.NoError(t, err, "create an account")
		svc.Account, svc.APIKey = creds.AccountID, creds.APIKey
	}
	return svc
}

// Logger is a logger whose lines go to t's output, which go test prints
// only when t fails (or with -v): a failing package then shows its failing
// tests' logs, not the request lines of every test beside them. Lines
// logged once t has ended (by a goroutine it left behind) are dropped, as
// the testing package would refuse them.
func Logger(t testing.TB) *slog.Logger {
	w := &testOutput{out: t.Output()}
	t.Cleanup(w.end)
	return slog.New(slog.NewTextHandler(w, nil))
}

// testOutput is a test's output until the test ends, then nothing.
type testOutput struct {
	mu    sync.Mutex
	out   io.Writer
	ended bool
}

func (w *testOutput) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return len(p), nil
	}
	return w.out.Write(p)
}

func (w *testOutput) end() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ended = true
}

// Async sends req with client from a goroutine. A transport error arrives
// as a Reply with Status -1 and the error as its body.
func Async(client *http.Client, req *http.Request) <-chan Reply {
	out := make(chan Reply, 1)
	go func() {
		r, err := Exchange(client, req)
		if err != nil {
			r = Reply{Status: -1, Body: []byte(err.Error())}
		}
		out <- r
	}()
	return out
}

// Receive waits up to timeout for the reply of a request sent with Async
// and fails the test if none comes or the request failed.
func Receive(t testing.TB, c <-chan Reply, what string, timeout time.Duration) Reply {
	t.Helper()
	select {
	case r := <-c:
		require.NotEqual(t, -1, r.Status, "%s: %s", what, r.Body)
		return r
	case <-time.After(timeout):
		t.Fatalf("%s: no response", what)
		return Reply{}
	}
}

// Wait waits for wg, and fails the test with what if that takes longer
// than d: a request stuck in a fault test must fail the test with a
// message, not hang it until the test binary's limit.
func Wait(t testing.TB, wg *sync.WaitGroup, d time.Duration, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s: still running after %s", what, d)
	}
}

// SyncBuffer collects output written from the server's goroutines while
// the test reads it.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

// Reset empties the buffer, for a test that reads what each step wrote.
func (s *SyncBuffer) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf.Reset()
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}
