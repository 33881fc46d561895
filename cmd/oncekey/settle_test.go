package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/servicetest"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// TestProxySettlesAtShutdown: an answer that `oncekey proxy` could not
// settle (PostgreSQL, a server of the test's own, stopped while the
// request was upstream) is tried once more when the proxy shuts down, and,
// the database still down, logged with its scope, method, path and record
// id, never its key.
func TestProxySettlesAtShutdown(t *testing.T) {
	t.Parallel()
	cluster := testdb.NewCluster(t)
	arrived, answer := make(chan struct{}), make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		close(arrived)
		<-answer
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(up.Close)
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	require.NoError(t, os.WriteFile(routes, []byte("routes:\n  - method: POST\n    path: /transfers\n"), 0o600))

	env := map[string]string{"DATABASE_URL": cluster.URL(), "ONCEKEY_ADDR": "127.0.0.1:0", "ONCEKEY_SHUTDOWN_TIMEOUT": "5s"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs servicetest.SyncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"proxy", "--upstream", up.URL, "--routes", routes, "--scope-header", "X-Account-Id"},
			func(k string) string { return env[k] }, strings.NewReader(""), &logs, &logs)
	}()
	addr := listeningAddr(t, &logs)

	scope, key := "acct-"+uuid.NewString(), uuid.NewString()
	status := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/transfers", strings.NewReader(`{}`))
		req.Header.Set("X-Account-Id", scope)
		req.Header.Set(idempotency.HeaderKey, key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			status <- 0
			return
		}
		resp.Body.Close()
		status <- resp.StatusCode
	}()
	<-arrived
	cluster.Stop(t) // the key is held; its settle will fail
	close(answer)
	require.Equal(t, http.StatusCreated, <-status, "the client gets its answer:\n%s", &logs)

	cancel() // SIGTERM
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the proxy did not shut down:\n%s", &logs)
	}
	logged := logs.String()
	require.NotContains(t, logged, key, "the key is never logged")
	var line struct{ Scope, Record, Method, Path string }
	for l := range strings.Lines(logged) {
		if strings.Contains(l, "could not be settled before shutdown") {
			require.NoError(t, json.Unmarshal([]byte(l), &line), l)
		}
	}
	require.NotEmpty(t, line.Record, "the key left is logged at shutdown:\n%s", logged)
	require.True(t, strings.HasSuffix(line.Scope, scope), "the stored scope %q is the caller's %q (in its namespace)", line.Scope, scope)
	// As docs/gateway.md tells an operator to compute it.
	sum := sha256.Sum256([]byte(line.Scope + "\x00" + key))
	require.Equal(t, hex.EncodeToString(sum[:8]), line.Record, "the record id names the key")
	require.Equal(t, "POST /transfers", line.Method+" "+line.Path)
}
