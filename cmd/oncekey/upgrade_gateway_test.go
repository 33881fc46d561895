package main

import (
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// beforeNamespaces is the last commit whose gateway stored its keys under
// the caller's scope alone (before #54).
const beforeNamespaces = "1b8732c"

// buildOldOncekey builds cmd/oncekey as it was at commit rev, from this
// repository's history. A clone without that history skips the test,
// except in CI, where it fails.
func buildOldOncekey(t *testing.T, rev string) string {
	t.Helper()
	if out, err := exec.Command("git", "cat-file", "-e", rev+"^{commit}").CombinedOutput(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("commit %s is not in this clone's history (a shallow clone?): %v\n%s", rev, err, out)
		}
		t.Skipf("commit %s is not in this clone's history: %v", rev, err)
	}
	src := t.TempDir()
	// Without the 53 MB binary that a few commits tracked by mistake.
	archive := exec.Command("sh", "-c", `cd "$(git rev-parse --show-toplevel)" && git archive "$1" | tar -x --exclude=cmd/oncekey/oncekey -C "$2"`, "sh", rev, src)
	out, err := archive.CombinedOutput()
	require.NoError(t, err, "git archive %s:\n%s", rev, out)
	bin := filepath.Join(t.TempDir(), "oncekey-"+rev)
	// -trimpath keeps the source's temporary directory out of the build
	// cache's keys: a later run of the test links the cached packages.
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "./cmd/oncekey")
	build.Dir = src
	out, err = build.CombinedOutput()
	require.NoError(t, err, "build oncekey at %s:\n%s", rev, out)
	return bin
}

// runRecorder is an upstream that takes up to 300ms to answer, and
// answers each run with a body of its own, counting runs per key.
type runRecorder struct {
	mu   sync.Mutex
	runs map[string]int
}

func (u *runRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	if r.Method != http.MethodPost {
		w.WriteHeader(http.StatusOK)
		return
	}
	key := r.Header.Get(idempotency.HeaderKey)
	u.mu.Lock()
	u.runs[key]++
	u.mu.Unlock()
	var delay [1]byte
	_, _ = rand.Read(delay[:])
	pace(time.Duration(delay[0]) * time.Millisecond) // an upstream of uneven speed
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, `{"key":%q,"run":%q}`, key, rand.Text())
}

func (u *runRecorder) ran(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.runs[key]
}

// TestGatewayUpgradeKeepsStoredKeys: a gateway of the commit before
// namespaces serves a storm of keys on PostgreSQL (each key sent by three
// clients at once, the upstream taking up to 300ms), and is stopped
// (SIGTERM) mid-storm, keys done and in flight; the new gateway starts on
// the same database, and every client retries until it has its answer,
// then every key is sent once more. Every retry that spans the upgrade
// replays the key's one answer or waits for it (202): the upstream ran
// each key once, no client got 409 (a mismatch, or an unknown outcome),
// and all of a key's clients got the same body.
func TestGatewayUpgradeKeepsStoredKeys(t *testing.T) {
	t.Parallel()
	old := buildOldOncekey(t, beforeNamespaces)
	up := &runRecorder{runs: map[string]int{}}
	upstream := httptest.NewServer(up)
	t.Cleanup(upstream.Close)
	dbURL, _ := testdb.Empty(t) // the old gateway migrates it to its own version, as it did in production
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	require.NoError(t, os.WriteFile(routes, []byte("routes:\n  - method: POST\n    path: /transfers\n"), 0o600))
	args := []string{"proxy", "--upstream", upstream.URL, "--routes", routes, "--scope-header", "X-Account-Id"}
	env := servePool(map[string]string{"DATABASE_URL": dbURL})

	oldProcess := startBinary(t, old, env, "/health", args...)
	cmd, oldAddr, oldLogs := oldProcess.cmd, oldProcess.addr, oldProcess.logs

	var current atomic.Pointer[string]
	current.Store(&oldAddr)
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}
	send := func(key string) (int, string, string, error) {
		req, err := http.NewRequest(http.MethodPost, "http://"+*current.Load()+"/transfers", strings.NewReader(`{"amount":500,"currency":"EUR"}`))
		if err != nil {
			return 0, "", "", err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Account-Id", "acct-"+key[:2])
		req.Header.Set(idempotency.HeaderKey, key)
		resp, err := client.Do(req)
		if err != nil {
			return 0, "", "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get(idempotency.HeaderReplayed), string(body), err
	}

	const keys, clientsPerKey = 240, 3
	type answer struct {
		key, body string
		err       error
	}
	answers := make(chan answer, keys*clientsPerKey)
	var answered atomic.Int64
	slots := make(chan struct{}, 48)
	deadline := time.Now().Add(2 * time.Minute)
	var wg sync.WaitGroup
	all := make([]string, keys)
	for i := range all {
		all[i] = rand.Text()
		for range clientsPerKey {
			wg.Go(func() {
				slots <- struct{}{}
				defer func() { <-slots }()
				key := all[i]
				for time.Now().Before(deadline) {
					status, _, body, err := send(key)
					switch {
					case err != nil, status == http.StatusAccepted, status == http.StatusServiceUnavailable:
						// The gateway is down for the upgrade, or the key
						// is in flight: retry, as a client does.
						pace(20 * time.Millisecond) // the client's backoff
						continue
					case status != http.StatusCreated:
						answers <- answer{key: key, err: fmt.Errorf("%s got %d %s", key, status, body)}
						return
					}
					answered.Add(1)
					answers <- answer{key: key, body: body}
					return
				}
				answers <- answer{key: key, err: fmt.Errorf("%s: no answer within 2 minutes", key)}
			})
		}
	}

	// Mid-storm: stop the old gateway as an upgrade does, and start the new
	// one on the same database once it is gone.
	require.Eventually(t, func() bool { return answered.Load() >= keys*clientsPerKey/3 }, time.Minute, 5*time.Millisecond)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), "the old gateway stops cleanly:\n%s", oldLogs)
	t.Logf("stopped the old gateway with %d of %d answers given", answered.Load(), keys*clientsPerKey)
	// The old gateway's answers, which its clients read: 202 in flight.
	newProcess := spawn(t, env, "cli", append(args[:len(args):len(args)], "--profile", "oncekey")...)
	newProcess.awaitOK(t, "/health")
	current.Store(&newProcess.addr)
	wg.Wait()
	close(answers)

	bodies := map[string]string{}
	for a := range answers {
		require.NoError(t, a.err, "every retry replays or waits; new gateway's log:\n%s", newProcess.logs)
		if first, ok := bodies[a.key]; ok {
			require.Equal(t, first, a.body, "%s: every client of a key gets its one answer", a.key)
		}
		bodies[a.key] = a.body
	}
	require.Contains(t, newProcess.logs.String(), "keys stored before namespaces remain", "the new gateway found the old one's keys")
	for _, key := range all {
		status, replayed, body, err := send(key)
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, status, "%s after the upgrade: %s", key, body)
		require.Equal(t, "true", replayed, "%s after the upgrade is replayed", key)
		require.Equal(t, bodies[key], body, "%s replays its one answer", key)
		require.Equal(t, 1, up.ran(key), "%s ran once", key)
	}
}
