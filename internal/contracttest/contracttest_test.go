package contracttest_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/redisstore"
	"github.com/oncekey/oncekey/internal/auth"
	"github.com/oncekey/oncekey/internal/contracttest"
	"github.com/oncekey/oncekey/internal/httpapi"
	"github.com/oncekey/oncekey/internal/store/memory"
	"github.com/oncekey/oncekey/internal/store/postgres"
	"github.com/oncekey/oncekey/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// serve starts the service on cfg, with wrap around its handler, and
// returns its URL and an API key.
func serve(t *testing.T, cfg httpapi.Config, wrap func(http.Handler) http.Handler) (string, string) {
	t.Helper()
	h, err := httpapi.New(cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(wrap(h))
	t.Cleanup(srv.Close)
	creds, err := auth.CreateAccount(context.Background(), cfg.Backend, "contract", "")
	require.NoError(t, err)
	return srv.URL, creds.APIKey
}

func TestServicePassesTheContract(t *testing.T) {
	t.Parallel()
	for name, open := range map[string]func(t *testing.T) httpapi.Config{
		"memory":   func(*testing.T) httpapi.Config { return httpapi.Config{Backend: memory.New()} },
		"postgres": func(t *testing.T) httpapi.Config { return httpapi.Config{Backend: postgres.New(testdb.Pool(t), nil)} },
		"postgres with the Redis fast path": func(t *testing.T) httpapi.Config {
			pg := postgres.New(testdb.Pool(t), nil)
			rdb, err := redisstore.NewClient("redis://127.0.0.1:6379/0")
			require.NoError(t, err)
			t.Cleanup(func() { rdb.Close() })
			require.NoError(t, rdb.Ping(t.Context()).Err(), "Redis at 127.0.0.1:6379")
			fast := redisstore.New(rdb, redisstore.Config{Prefix: "contracttest:"})
			return httpapi.Config{Backend: pg, Keys: redisstore.Wrap(fast, pg.Keys()), WriteKeys: redisstore.Wrap(fast, pg.WriteKeys())}
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
			url, key := serve(t, httpapi.Config{Backend: memory.New()}, tt.wrap)
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

type dropHeader struct {
	http.ResponseWriter
	name string
}

func (d dropHeader) WriteHeader(status int) {
	d.Header().Del(d.name)
	d.ResponseWriter.WriteHeader(status)
}
