package contracttest_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/auth"
	"github.com/oncekey/oncekey/internal/contracttest"
	"github.com/oncekey/oncekey/internal/httpapi"
	"github.com/oncekey/oncekey/internal/idempotency"
	"github.com/oncekey/oncekey/internal/orders"
	"github.com/oncekey/oncekey/internal/store/memory"
	"github.com/oncekey/oncekey/internal/store/postgres"
	"github.com/oncekey/oncekey/internal/store/rediscache"
	"github.com/oncekey/oncekey/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

type store interface {
	idempotency.Store
	orders.Repository
	auth.Store
}

// serve starts the service on s, with wrap around its handler, and returns
// its URL and an API key.
func serve(t *testing.T, s store, wrap func(http.Handler) http.Handler) (string, string) {
	t.Helper()
	var keys idempotency.Store = s
	if r, ok := s.(withRedis); ok {
		keys = r.fast
	}
	h, err := httpapi.New(httpapi.Config{Orders: orders.NewService(s), Auth: s, Idempotency: keys})
	require.NoError(t, err)
	srv := httptest.NewServer(wrap(h))
	t.Cleanup(srv.Close)
	creds, err := auth.CreateAccount(context.Background(), s, "contract", "")
	require.NoError(t, err)
	return srv.URL, creds.APIKey
}

func TestServicePassesTheContract(t *testing.T) {
	t.Parallel()
	for name, open := range map[string]func(t *testing.T) store{
		"memory":   func(*testing.T) store { return memory.New() },
		"postgres": func(t *testing.T) store { return postgres.New(testdb.Pool(t)) },
		"postgres with the Redis fast path": func(t *testing.T) store {
			pg := postgres.New(testdb.Pool(t))
			rdb, err := rediscache.NewClient("redis://127.0.0.1:6379/0")
			require.NoError(t, err)
			t.Cleanup(func() { rdb.Close() })
			require.NoError(t, rdb.Ping(t.Context()).Err(), "Redis at 127.0.0.1:6379")
			return withRedis{store: pg, fast: rediscache.New(pg, rdb, rediscache.Config{})}
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			url, key := serve(t, open(t), func(h http.Handler) http.Handler { return h })
			results, err := contracttest.Run(context.Background(), contracttest.Config{BaseURL: url, APIKey: key})
			require.NoError(t, err)
			require.NotEmpty(t, results)
			for _, r := range results {
				require.NoError(t, r.Err, "check %q", r.Name)
			}
		})
	}
}

// TestSuiteCatchesABrokenService proves the suite can fail: a proxy that
// drops the replay header, and one that answers outside the contract.
func TestSuiteCatchesABrokenService(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		wrap   func(http.Handler) http.Handler
		failed string
	}{
		{"replay header dropped", func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				h.ServeHTTP(dropHeader{ResponseWriter: w, name: idempotency.HeaderReplayed}, r)
			})
		}, "first request runs, a retry replays byte for byte"},
		{"undeclared status", func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/healthz" {
					w.WriteHeader(http.StatusTeapot)
					return
				}
				h.ServeHTTP(w, r)
			})
		}, "operations endpoints answer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			url, key := serve(t, memory.New(), tt.wrap)
			results, err := contracttest.Run(context.Background(), contracttest.Config{BaseURL: url, APIKey: key})
			require.NoError(t, err)
			var failed []string
			for _, r := range results {
				if r.Err != nil {
					failed = append(failed, r.Name)
				}
			}
			require.Contains(t, failed, tt.failed)
		})
	}
}

// withRedis is a store whose idempotency keys go through the fast path.
type withRedis struct {
	store
	fast *rediscache.Store
}

type dropHeader struct {
	http.ResponseWriter
	name string
}

func (d dropHeader) WriteHeader(status int) {
	d.Header().Del(d.name)
	d.ResponseWriter.WriteHeader(status)
}
