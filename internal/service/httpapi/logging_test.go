package httpapi_test

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/servicetest"
	"github.com/oncekey/oncekey/internal/service/store/memory"
	"github.com/oncekey/oncekey/internal/wire/problem"
)

func TestRequestLogs(t *testing.T) {
	t.Parallel()
	var logs servicetest.SyncBuffer
	b := setup(t, memory.New(), options{cfg: httpapi.Config{Logger: slog.New(slog.NewJSONHandler(&logs, nil))}})
	const secretBody = `{"items":[{"sku":"SECRET-SKU-42","qty":2}],"amount":1200,"currency":"RUB"}`

	require.Equal(t, http.StatusCreated, b.createOrder(t, "log-1", secretBody).StatusCode())
	require.Equal(t, http.StatusCreated, b.createOrder(t, "log-1", secretBody).StatusCode())
	req, err := http.NewRequest(http.MethodPost, b.url+"/orders", strings.NewReader(secretBody))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer ok_wrong_secret_key")
	req.Header.Set("Idempotency-Key", "log-2")
	req.Header.Set("Content-Type", "application/json")
	unknown, err := b.http.Do(req)
	require.NoError(t, err)
	unknown.Body.Close()
	require.Equal(t, http.StatusUnauthorized, unknown.StatusCode)

	var lines []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var entry map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &entry), "every log line is JSON: %s", line)
		if entry["msg"] == "request" {
			lines = append(lines, entry)
		}
	}
	require.Len(t, lines, 3, "one line per request")
	for _, key := range []string{"request_id", "method", "route", "status", "duration_ms"} {
		require.Contains(t, lines[0], key)
	}
	require.Equal(t, "/orders", lines[0]["route"])
	require.Equal(t, "executed", lines[0]["idempotency"])
	require.Equal(t, "replayed", lines[1]["idempotency"])
	require.Equal(t, "rejected", lines[2]["idempotency"])
	require.NotEqual(t, lines[0]["request_id"], lines[1]["request_id"])

	all := logs.String()
	require.NotContains(t, all, b.apiKey, "the API key is never logged")
	require.NotContains(t, all, "ok_wrong_secret_key", "nor a wrong one")
	require.NotContains(t, all, "SECRET-SKU-42", "the body is never logged")
}

// A client's X-Request-Id is logged only when it is short and plain; any
// other gets one of the server's own, so that no caller, authenticated or
// not, can fill the log with its headers.
func TestRequestIDs(t *testing.T) {
	t.Parallel()
	var logs servicetest.SyncBuffer
	b := setup(t, memory.New(), options{cfg: httpapi.Config{Logger: slog.New(slog.NewJSONHandler(&logs, nil))}})
	for _, tc := range []struct {
		name, sent string
		kept       bool
	}{
		{"a proxy's id", "req-42_a.b:c", true},
		{"a long one", strings.Repeat("x", 10<<10), false},
		{"one with spaces and quotes", `a "b" c`, false},
		{"one of 65 characters", strings.Repeat("y", 65), false},
	} {
		logs.Reset()
		req := b.newRequest(t, http.MethodGet, "/orders", nil, "Authorization", "Bearer nope", "X-Request-Id", tc.sent)
		requireProblem(t, b.do(t, req), problem.Unauthorized, tc.name)
		var line struct {
			RequestID string `json:"request_id"`
		}
		require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(logs.String())), &line), "%s: %s", tc.name, logs.String())
		require.NotEmpty(t, line.RequestID, tc.name)
		require.LessOrEqual(t, len(line.RequestID), 64, tc.name)
		require.Equal(t, tc.kept, line.RequestID == tc.sent, "%s: logged %q", tc.name, line.RequestID)
	}
}
