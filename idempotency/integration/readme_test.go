package integration_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency/pgstore/pgstoretest"
)

// TestLibraryQuickStart follows docs/library.md's "Depend on it" word for
// word, as a new user would: its shell blocks run in a folder outside this
// repository, with HOME a folder of the test's own whose src/oncekey is
// this checkout, and the README's Go program saved as main.go between
// them. The program then runs on a database made for the test (the one
// word changed: the URL in the run line) and on a free port (ADDR), and
// gets the README's curl lines: the first creates a widget, the retry
// replays it, and the table holds one widget.
func TestLibraryQuickStart(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	library := readDoc(t, filepath.Join(root, "docs", "library.md"))
	readme := readDoc(t, filepath.Join(root, "README.md"))

	home := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(home, "src"), 0o755))
	require.NoError(t, os.Symlink(root, filepath.Join(home, "src", "oncekey")))
	work := t.TempDir()
	env := userEnv(t, home)

	sh := func(dir, script string, extra ...string) string {
		t.Helper()
		cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
		cmd.Dir = dir
		cmd.Env = append(env, extra...)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "in %s:\n%s\n%s", dir, script, out)
		return string(out)
	}

	sh(work, shBlock(t, library, "library-test: module"))
	module := filepath.Join(work, "widgets")
	require.DirExists(t, module, "docs/library.md's first block makes the module's folder")
	require.NoError(t, os.WriteFile(filepath.Join(module, "main.go"), []byte(readmeProgram(t, readme)), 0o644))
	sh(module, shBlock(t, library, "library-test: build"))
	sh(module, "go vet ./...") // not in the docs: the program must also pass vet

	run := strings.TrimSpace(shBlock(t, library, "library-test: run"))
	const documentedURL = "postgres://postgres@127.0.0.1:5432/postgres"
	require.Contains(t, run, documentedURL, "the run line names a database URL")
	dbURL, pool := pgstoretest.FreshOn(t, pgstoretest.AdminURL(), false)
	addr := freeLoopback(t)
	server := exec.Command("bash", "-c", strings.Replace(run, documentedURL, dbURL, 1))
	server.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // Ctrl-C reaches the shell and the program
	server.Dir = module
	server.Env = append(env, "ADDR="+addr)
	var log strings.Builder
	server.Stdout, server.Stderr = &log, &log
	require.NoError(t, server.Start())
	exited := make(chan error, 1)
	go func() { exited <- server.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = syscall.Kill(-server.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		if t.Failed() {
			t.Logf("the program's log:\n%s", log.String())
		}
	})
	waitListening(t, addr, exited)

	examples := regexp.MustCompile("(?s)<!-- readme-test: library -->\\s*```sh\\n(.*?)```\\s*```http\\n(.*?)```").FindAllStringSubmatch(readme, -1)
	require.Len(t, examples, 2, "the README shows a request and its retry")
	for i, ex := range examples {
		out := sh(work, strings.ReplaceAll(ex[1], "127.0.0.1:8080", addr))
		got, want := splitHTTP(t, out), splitHTTP(t, ex[2])
		require.Equal(t, want.status, got.status, "curl line %d", i+1)
		for name, value := range want.header {
			require.Equal(t, value, got.header[name], "curl line %d: %s", i+1, name)
		}
		if i == 0 {
			require.Empty(t, got.header["Idempotent-Replayed"], "the first answer is not a replay")
		}
		require.JSONEq(t, want.body, got.body, "curl line %d's body", i+1)
	}
	var widgets int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM widgets").Scan(&widgets))
	require.Equal(t, 1, widgets, "a request and its retry make one widget")

	require.NoError(t, syscall.Kill(-server.Process.Pid, syscall.SIGINT))
	select {
	case err := <-exited:
		stopped = true
		require.NoError(t, err, "the program ends cleanly on Ctrl-C")
	case <-time.After(30 * time.Second):
		t.Fatal("the program did not end within 30s of SIGINT")
	}
}

func readDoc(t *testing.T, path string) string {
	t.Helper()
	text, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(text)
}

// shBlock is the sh block right after the doc's `<!-- marker -->`.
func shBlock(t *testing.T, doc, marker string) string {
	t.Helper()
	_, rest, ok := strings.Cut(doc, "<!-- "+marker+" -->\n```sh\n")
	require.True(t, ok, "the doc has a sh block marked %q", marker)
	block, _, ok := strings.Cut(rest, "```\n")
	require.True(t, ok, "the block marked %q ends", marker)
	return block
}

// readmeProgram is the Go block of the README's start for Go services.
func readmeProgram(t *testing.T, readme string) string {
	t.Helper()
	_, section, ok := strings.Cut(readme, "\n### 1. Put exactly-once into your Go service\n")
	require.True(t, ok, "README.md has the start for Go services")
	section, _, _ = strings.Cut(section, "\n### ")
	_, program, ok := strings.Cut(section, "\n```go\n")
	require.True(t, ok, "the start for Go services shows a Go program")
	program, _, ok = strings.Cut(program, "\n```\n")
	require.True(t, ok, "the Go block ends")
	require.True(t, strings.HasPrefix(program, "package main\n"), "the block is a whole program, imports and all")
	return program + "\n"
}

// userEnv is this process's environment as a new user's shell would have
// it, with HOME at home: the go command's caches stay where they are (so
// nothing is downloaded twice), and no workspace or flags of this
// repository's reach the new module.
func userEnv(t *testing.T, home string) []string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMODCACHE", "GOCACHE", "GOPATH").Output()
	require.NoError(t, err, "go env")
	vals := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.Len(t, vals, 3)
	var env []string
	for _, kv := range os.Environ() {
		switch name, _, _ := strings.Cut(kv, "="); name {
		case "HOME", "GOFLAGS", "GOWORK", "DATABASE_URL", "ADDR":
		default:
			env = append(env, kv)
		}
	}
	return append(env, "HOME="+home, "GOMODCACHE="+vals[0], "GOCACHE="+vals[1], "GOPATH="+vals[2], "GOWORK=off")
}

// freeLoopback is a loopback address with a port free a moment ago.
func freeLoopback(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

// waitListening waits until addr accepts connections, failing at once if
// the program exits first.
func waitListening(t *testing.T, addr string, exited <-chan error) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = conn.Close()
			return
		}
		require.True(t, time.Now().Before(deadline), "the program did not listen on %s within 60s: %v", addr, err)
		select {
		case err := <-exited:
			t.Fatalf("the program exited before it listened: %v", err)
		case <-time.After(50 * time.Millisecond): // pacing: poll until it listens
		}
	}
}

type message struct {
	status string
	header map[string]string
	body   string
}

// splitHTTP splits `curl -si` output, or the README's rendering of it.
func splitHTTP(t *testing.T, s string) message {
	t.Helper()
	s = strings.ReplaceAll(s, "\r\n", "\n")
	head, body, ok := strings.Cut(s, "\n\n")
	require.True(t, ok, "no blank line between head and body in %q", s)
	lines := strings.Split(head, "\n")
	m := message{status: lines[0], header: map[string]string{}, body: strings.TrimSpace(body)}
	for _, line := range lines[1:] {
		name, value, ok := strings.Cut(line, ":")
		require.True(t, ok, "bad header line %q", line)
		m.header[http.CanonicalHeaderKey(name)] = strings.TrimSpace(value)
	}
	var v any
	require.NoError(t, json.Unmarshal([]byte(m.body), &v), "the body is JSON: %q", m.body)
	return m
}
