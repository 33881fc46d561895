package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCredentialsStayOutOfProcessLists: `oncekey conformance` and
// `contract-test` take their credentials from the environment or a file,
// so that none is an argument: while each runs as a process of its own
// (held in its first request), its command line, which is what ps shows,
// holds no secret; the API is sent each one all the same; and nothing the
// tool prints (progress, report, errors) holds one.
func TestCredentialsStayOutOfProcessLists(t *testing.T) {
	t.Parallel()
	spec := filepath.Join(t.TempDir(), "things.yaml")
	require.NoError(t, os.WriteFile(spec, []byte(thingsSpec), 0o600))
	for _, tc := range []struct {
		name string
		// args and env run the command with the secrets a and b (a
		// second account's); sent are the Authorization values the API
		// must see.
		args func(url, dir, a, b string) []string
		env  func(a, b string) []string
		sent func(a, b string) []string
	}{
		{
			name: "conformance, from the environment",
			args: func(url, _, _, _ string) []string { return []string{"conformance", "--spec", spec, "--url", url} },
			env:  func(a, b string) []string { return []string{"ONCEKEY_AUTH=Bearer " + a, "ONCEKEY_AUTH2=Bearer " + b} },
			sent: func(a, b string) []string { return []string{"Bearer " + a, "Bearer " + b} },
		},
		{
			name: "conformance, from files",
			args: func(url, dir, a, b string) []string {
				return []string{"conformance", "--spec", spec, "--url", url,
					"--auth-file", secretFile(t, dir, "Bearer "+a+"\n"), "--auth2-file", secretFile(t, dir, "Bearer "+b+"\r\n")}
			},
			env:  func(a, _ string) []string { return []string{"ONCEKEY_AUTH=Bearer not-" + a} }, // the file, on the command line, wins
			sent: func(a, b string) []string { return []string{"Bearer " + a, "Bearer " + b} },
		},
		{
			name: "contract-test, from the environment",
			args: func(url, _, _, _ string) []string { return []string{"contract-test", "--url", url} },
			env:  func(a, _ string) []string { return []string{"ONCEKEY_API_KEY=" + a} },
			sent: func(a, _ string) []string { return []string{"Bearer " + a} },
		},
		{
			name: "contract-test, from a file",
			args: func(url, dir, a, _ string) []string {
				return []string{"contract-test", "--url", url, "--api-key-file", secretFile(t, dir, a+"\n")}
			},
			sent: func(a, _ string) []string { return []string{"Bearer " + a} },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a, b := "sk_test_"+rand.Text(), "sk_test_"+rand.Text()
			api := newHeldAPI()
			srv := httptest.NewServer(api)
			t.Cleanup(srv.Close)
			t.Cleanup(api.release)

			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], append([]string{"-test.run=^$", "--"}, tc.args(srv.URL, t.TempDir(), a, b)...)...)
			cmd.Env = append(freshEnvironment(), subprocessEnv+"=cli")
			if tc.env != nil {
				cmd.Env = append(cmd.Env, tc.env(a, b)...)
			}
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			require.NoError(t, cmd.Start())
			done := wait(cmd)

			select {
			case <-api.held:
			case err := <-done:
				t.Fatalf("the command ended (%v) before it sent a request:\n%s", err, out.String())
			}
			// What ps shows: the process's arguments, read while it runs.
			cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", cmd.Process.Pid))
			require.NoError(t, err)
			api.release()
			<-done // the API breaks the protocol: the command fails

			args := strings.ReplaceAll(string(cmdline), "\x00", " ")
			require.Contains(t, args, " --url "+srv.URL, "the command line of the process under test")
			printed := out.String()
			require.Contains(t, printed, " checks failed", "the run went through")
			for _, secret := range []string{a, b} {
				require.NotContains(t, args, secret, "a secret on the command line, which ps shows")
				for line := range strings.Lines(printed) {
					require.NotContains(t, line, secret, "a secret in what the tool printed")
				}
			}
			seen := api.authorizations()
			for _, want := range tc.sent(a, b) {
				require.Contains(t, seen, want, "the API was sent the credential")
			}
			require.NotContains(t, seen, "Bearer not-"+a, "the variable, where a file is given")
		})
	}
}

// secretFile writes content to a file of its own in dir and returns its path.
func secretFile(t *testing.T, dir, content string) string {
	t.Helper()
	f, err := os.CreateTemp(dir, "secret")
	require.NoError(t, err)
	_, err = f.WriteString(content)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	return f.Name()
}

// wait is cmd.Wait in a goroutine of its own.
func wait(cmd *exec.Cmd) <-chan error {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	return done
}

// heldAPI is brokenThings (any path it does not serve is a 404), which
// records the Authorization of every request and holds the first until
// release, so that a test can look at the client while it runs.
type heldAPI struct {
	held     chan struct{}
	releaseC chan struct{}
	first    sync.Once
	stop     sync.Once
	mu       sync.Mutex
	seen     map[string]bool
}

func newHeldAPI() *heldAPI {
	return &heldAPI{held: make(chan struct{}), releaseC: make(chan struct{}), seen: map[string]bool{}}
}

func (h *heldAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	h.seen[r.Header.Get("Authorization")] = true
	h.mu.Unlock()
	h.first.Do(func() {
		close(h.held)
		<-h.releaseC
	})
	brokenThings(w, r)
}

func (h *heldAPI) release() { h.stop.Do(func() { close(h.releaseC) }) }

func (h *heldAPI) authorizations() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for v := range h.seen {
		out = append(out, v)
	}
	return out
}

// TestCredentialFileErrors: a credential's file holds its one line; what
// else it holds, or a credential given twice, is refused before anything
// is sent, and the error names the file, never what it holds.
func TestCredentialFileErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	empty, twoLines := secretFile(t, dir, "\n"), secretFile(t, dir, "Bearer sk_test_one\nBearer sk_test_two\n")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"an empty file", []string{"conformance", "--auth-file", empty}, "--auth-file " + empty + ": the file is empty"},
		{"two lines", []string{"conformance", "--auth2-file", twoLines}, "--auth2-file " + twoLines + ": the file has more than one line"},
		{"no such file", []string{"conformance", "--auth-file", filepath.Join(dir, "missing")}, "--auth-file: open "},
		{"the flag and its file", []string{"conformance", "--auth", "Bearer x", "--auth-file", twoLines}, "--auth and --auth-file can't be used together"},
		{"contract-test, an empty file", []string{"contract-test", "--api-key-file", empty}, "--api-key-file " + empty + ": the file is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := append(tc.args, "--url", "http://127.0.0.1:1")
			if tc.args[0] == "conformance" {
				args = append(args, "--spec", "../../openapi.yaml")
			}
			_, err := runCommand(t, nil, args...)
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), "sk_test_", "what the file holds")
		})
	}
}
