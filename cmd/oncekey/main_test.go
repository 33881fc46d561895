package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// lockedWriter lets the server goroutine and the test share a buffer.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func runCommand(t *testing.T, env map[string]string, args ...string) (string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), args, func(k string) string { return env[k] }, &stdout, &stderr)
	return stdout.String(), err
}

func TestCommandsOnPostgres(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": testdb.URL(t)}

	_, err := runCommand(t, env, "migrate")
	require.NoError(t, err, "migrate")

	out, err := runCommand(t, env, "accounts", "create", "acme")
	require.NoError(t, err, "accounts create")
	var creds struct {
		AccountID string `json:"account_id"`
		APIKey    string `json:"api_key"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &creds), "accounts create prints one JSON line: %q", out)
	require.NotEmpty(t, creds.AccountID)
	require.True(t, strings.HasPrefix(creds.APIKey, "ok_"), "api key %q", creds.APIKey)
	require.Equal(t, 1, strings.Count(out, "\n"), "exactly one line")

	out, err = runCommand(t, env, "purge")
	require.NoError(t, err, "purge")
	require.Contains(t, out, `"deleted":`)

	// serve on PostgreSQL accepts the new key end to end.
	serveEnv := map[string]string{"DATABASE_URL": env["DATABASE_URL"]}
	addr := startServe(t, serveEnv)
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/orders", strings.NewReader(`{"items":[{"sku":"SKU-1","qty":2}],"amount":1200,"currency":"RUB"}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+creds.APIKey)
	req.Header.Set("Idempotency-Key", "cmd-test-1")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)

	ready, err := http.Get("http://" + addr + "/readyz")
	require.NoError(t, err)
	defer ready.Body.Close()
	require.Equal(t, http.StatusOK, ready.StatusCode)
}

func TestCommandErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"no command", nil, nil, "no command"},
		{"unknown command", nil, []string{"frobnicate"}, "unknown command"},
		{"accounts without name", map[string]string{"DATABASE_URL": "postgres://x"}, []string{"accounts", "create"}, "usage"},
		{"migrate without database", nil, []string{"migrate"}, "DATABASE_URL is not set"},
		{"bad ttl", map[string]string{"IDEMPOTENCY_TTL": "two days"}, []string{"serve"}, "IDEMPOTENCY_TTL"},
		{"negative wait", map[string]string{"IDEMPOTENCY_WAIT": "-1s"}, []string{"serve"}, "IDEMPOTENCY_WAIT"},
		{"bad body limit", map[string]string{"ONCEKEY_MAX_BODY_BYTES": "lots"}, []string{"serve"}, "ONCEKEY_MAX_BODY_BYTES"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := runCommand(t, tt.env, tt.args...)
			require.Error(t, err)
			require.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := loadConfig(func(string) string { return "" })
	require.NoError(t, err)
	require.Equal(t, ":8080", cfg.Addr)
	require.Equal(t, "48h0m0s", cfg.TTL.String())
	require.Equal(t, "1s", cfg.Wait.String())
	require.EqualValues(t, 1<<20, cfg.MaxBodyBytes)
}
